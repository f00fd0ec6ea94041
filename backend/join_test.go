package backend

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/weft-net/weft/vtep"
)

type part struct {
	tables chan vtep.Table
	ready  chan struct{}
	fail   error
}

func (p *part) Run(ctx context.Context) error {
	if p.fail != nil {
		return p.fail
	}
	<-ctx.Done()
	return nil
}
func (p *part) Set(t vtep.Table)       { p.tables <- t }
func (p *part) Ready() <-chan struct{} { return p.ready }
func (p *part) Stats() Stats           { return Stats{TxFrames: 1, Drops: map[string]uint64{"x": 2}} }

func newPart() *part { return &part{tables: make(chan vtep.Table, 1), ready: make(chan struct{})} }

func TestJoin(t *testing.T) {
	a, b := newPart(), newPart()
	j := Join(a, b)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- j.Run(ctx) }()
	j.Set(vtep.Table{})
	if len(<-a.tables)+len(<-b.tables) != 0 {
		t.Fatal("parts got the wrong table")
	}
	close(a.ready)
	select {
	case <-j.Ready():
		t.Fatal("ready before every part is")
	case <-time.After(50 * time.Millisecond):
	}
	close(b.ready)
	select {
	case <-j.Ready():
	case <-time.After(5 * time.Second):
		t.Fatal("not ready after every part is")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}

	boom := errors.New("boom")
	bad := newPart()
	bad.fail = boom
	if err := Join(newPart(), bad).Run(context.Background()); !errors.Is(err, boom) {
		t.Fatalf("a failing part: Run returned %v", err)
	}
}

func TestJoinedStatsSumsParts(t *testing.T) {
	j := Join(newPart(), newPart(), newPart())
	st := j.Stats()
	if st.TxFrames != 3 || st.RxFrames != 0 || st.Drops["x"] != 6 || len(st.Drops) != 1 || st.Repairs != nil {
		t.Errorf("joined stats = %+v, want tx 3, drops x=6, no repairs", st)
	}
}
