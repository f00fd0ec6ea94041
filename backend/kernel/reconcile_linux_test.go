package kernel

import (
	"log/slog"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/testkit/nettest"
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

// TestArmSooner: a sync asked for now fires at once even when one is
// already scheduled later (a notification's debounce), and a later request
// never puts off one scheduled sooner.
func TestArmSooner(t *testing.T) {
	tm := newTimers(time.Hour)
	defer tm.stop()
	fired := func(within time.Duration) bool {
		select {
		case <-tm.soon.C:
			tm.pending = false
			return true
		case <-time.After(within):
			return false
		}
	}
	if !fired(5 * time.Second) {
		t.Fatal("the first sync did not fire")
	}
	tm.arm(time.Hour) // as a notification's debounce would, only longer
	tm.arm(0)         // a new table
	if !fired(5 * time.Second) {
		t.Fatal("a sync asked for now waited for the one scheduled in an hour")
	}
	tm.arm(0)
	tm.arm(time.Hour)
	if !fired(5 * time.Second) {
		t.Fatal("a later request put off a sync scheduled now")
	}
	tm.arm(time.Hour)
	if fired(100 * time.Millisecond) {
		t.Fatal("a sync scheduled in an hour fired at once")
	}
}

// TestBackOffHolds: after a failed sync, neither a new table nor a
// notification brings the retry forward; the retry then fires, and once a
// sync succeeds requests are served at once again.
func TestBackOffHolds(t *testing.T) {
	tm := newTimers(time.Hour)
	defer tm.stop()
	<-tm.soon.C // the first sync
	tm.pending = false
	tm.backOff(300 * time.Millisecond) // it failed
	start := time.Now()
	tm.arm(0)        // a new table
	tm.arm(debounce) // a notification
	select {
	case <-tm.soon.C:
		tm.pending = false
		if waited := time.Since(start); waited < 250*time.Millisecond {
			t.Fatalf("the retry came after %s, before the back-off of 300 ms", waited)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the retry never came")
	}
	tm.notBefore = time.Time{} // as Run does when a sync succeeds
	start = time.Now()
	tm.arm(0)
	select {
	case <-tm.soon.C:
		if waited := time.Since(start); waited > time.Second {
			t.Fatalf("a sync asked for now after a success waited %s", waited)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a sync asked for now after a success never came")
	}
}
