package nettest

import (
	"fmt"
	"runtime"
	"testing"
)

// recTB records what SkipUnlessCI asks of a test.
type recTB struct {
	testing.TB
	fatal, skip string
}

func (r *recTB) Helper()                   {}
func (r *recTB) Fatalf(f string, a ...any) { r.fatal = fmt.Sprintf(f, a...); runtime.Goexit() }
func (r *recTB) Skip(a ...any)             { r.skip = fmt.Sprint(a...); runtime.Goexit() }

func TestSkipUnlessCI(t *testing.T) {
	for _, tt := range []struct {
		ci        string
		wantFatal bool
	}{{"true", true}, {"1", true}, {"", false}, {"false", false}} {
		t.Run("CI="+tt.ci, func(t *testing.T) {
			t.Setenv("CI", tt.ci)
			r := &recTB{TB: t}
			done := make(chan struct{})
			go func() { defer close(done); SkipUnlessCI(r, "needs root") }()
			<-done
			if tt.wantFatal && (r.fatal == "" || r.skip != "") {
				t.Errorf("CI=%q: skipped (%q), want a failure", tt.ci, r.skip)
			}
			if !tt.wantFatal && (r.skip != "needs root" || r.fatal != "") {
				t.Errorf("CI=%q: failed (%q), want a skip", tt.ci, r.fatal)
			}
		})
	}
}
