package backend

import (
	"log/slog"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/nettest"
)

// TestLostSubscription: when a subscription ends on its own, the watch is
// closed, an empty one takes its place (and closes without blocking), and a
// resubscription is scheduled.
func TestLostSubscription(t *testing.T) {
	n := nettest.NewNS(t, "sub")
	r := &Reconciler{Log: slog.New(slog.DiscardHandler)}
	w, err := subscribe(n.Path, r.Log)
	if err != nil {
		t.Fatal(err)
	}
	tm := newTimers(time.Hour)
	defer tm.stop()
	done := make(chan struct{})
	go func() {
		empty := r.notified(w, tm, false, false)
		empty.close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("closing a lost watch blocked")
	}
	select {
	case <-tm.resub.C:
	case <-time.After(5 * time.Second):
		t.Fatal("no resubscription scheduled")
	}
}
