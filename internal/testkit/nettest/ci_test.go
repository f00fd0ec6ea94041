package nettest

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// recTB records what CannotRun asks of a test.
type recTB struct {
	testing.TB
	fatal, skip string
}

func (r *recTB) Helper()                   {}
func (r *recTB) Fatalf(f string, a ...any) { r.fatal = fmt.Sprintf(f, a...); runtime.Goexit() }
func (r *recTB) Skipf(f string, a ...any)  { r.skip = fmt.Sprintf(f, a...); runtime.Goexit() }

func TestCannotRun(t *testing.T) {
	for _, tt := range []struct {
		name, ci, skip string
		wantSkip       bool
	}{
		{"CI fails", "true", "", false},
		{"CI=1 fails", "1", "", false},
		{"CI fails even when skips are asked", "true", "all", false},
		{"no CI, nothing asked: fails", "", "", false},
		{"no CI, other kind asked: fails", "", "tools", false},
		{"no CI, kind asked: skips", "false", "tools,root", true},
		{"no CI, all asked: skips", "", "all", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("CI", tt.ci)
			t.Setenv("WEFT_TEST_SKIP", tt.skip)
			r := &recTB{TB: t}
			done := make(chan struct{})
			go func() { defer close(done); CannotRun(r, SkipRoot, "needs root") }()
			<-done
			if tt.wantSkip && (r.fatal != "" || !strings.Contains(r.skip, "needs root")) {
				t.Errorf("failed (%q), want a skip", r.fatal)
			}
			if !tt.wantSkip && (r.skip != "" || !strings.Contains(r.fatal, "needs root")) {
				t.Errorf("skipped (%q), want a failure", r.skip)
			}
		})
	}
}
