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

// TestRepairBudget: drift that comes back right after each repair (another
// program fighting weft over a route) is repaired at the debounce
// repairBurst times, then about once per repairEvery, and the slowdown is
// reported once; more notifications before a repair do not bring it
// forward; syncs that come between (new tables, retries) never make a
// repair wait longer than repairEvery; a quiet spell refills the budget.
func TestRepairBudget(t *testing.T) {
	tm := newTimers(time.Hour)
	defer tm.stop()
	tm.pending = false // the first sync has run
	now := time.Now()
	tm.refilled = now
	slowedAt := -1
	for i := range repairBurst + 5 {
		w, slowed := tm.repair(now)
		for k := 1; k <= 3; k++ { // the rest of the burst, or more of the fight
			if w2, s2 := tm.repair(now.Add(time.Duration(k) * time.Millisecond)); s2 || w2 != 0 {
				t.Errorf("round %d: notification %d before the repair: wait %v, slowed %v", i, k, w2, s2)
			}
		}
		if due := tm.due.Sub(now); due != w {
			t.Errorf("round %d: the repair is due in %v, want %v", i, due, w)
		}
		if slowed {
			if slowedAt >= 0 {
				t.Errorf("slowed reported again in round %d", i)
			}
			slowedAt = i
		}
		switch {
		case i < repairBurst && w != debounce:
			t.Errorf("round %d within the budget waits %v, want %v", i, w, debounce)
		case i >= repairBurst+1 && (w < repairEvery*9/10 || w > repairEvery):
			t.Errorf("round %d past the budget waits %v, want about %v", i, w, repairEvery)
		}
		now = now.Add(w)
		tm.pending = false
		tm.synced()
		now = now.Add(10 * time.Millisecond) // the other program rewrites it at once
	}
	if slowedAt != repairBurst {
		t.Errorf("slowed reported in round %d, want %d", slowedAt, repairBurst)
	}
	// Syncs between repairs (a new table every 100 ms) do not run up a debt.
	for range 200 {
		tm.repair(now)
		tm.pending = false
		tm.synced()
		now = now.Add(100 * time.Millisecond)
	}
	if w, _ := tm.repair(now); w > repairEvery {
		t.Errorf("after 200 repairs between other syncs the next waits %v, more than %v", w, repairEvery)
	}
	tm.pending = false
	tm.synced()
	if w, _ := tm.repair(now.Add(repairBurst * repairEvery)); w != debounce {
		t.Errorf("drift after a quiet spell waits %v, want %v", w, debounce)
	}
}
