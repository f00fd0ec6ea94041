package kernel

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// Timing of a Reconciler's loop.
const (
	// debounce coalesces a burst of change notifications (some caused by
	// the dataplane's own writes) into one sync.
	debounce = 50 * time.Millisecond
	// retryAfter is the wait before retrying a failed sync or subscription.
	retryAfter = time.Second
	// repairBurst and repairEvery bound the repairs that notifications ask
	// for: repairBurst of them at the debounce, then one every repairEvery
	// until the budget refills. Another program that rewrites what weft
	// programs (a second owner of a route) then costs a full sync every
	// repairEvery, not one per debounce.
	repairBurst = 20
	repairEvery = 2 * time.Second
)

// Drift says which kernel change notifications are drift that calls for a
// full sync. A nil func means that kind of notification never is.
type Drift struct {
	Link  func(netlink.LinkUpdate) bool
	Addr  func(netlink.AddrUpdate) bool
	Neigh func(netlink.NeighUpdate) bool
	Route func(netlink.RouteUpdate) bool
}

// Reconciler is the repair loop every dataplane shares: it syncs when a new
// table arrives (Kick), when the kernel reports a change that Drift calls
// relevant (after a short debounce; when repairs do not hold, at most one
// every 2 s, see repairBurst), and every Resync; a failed sync is
// retried after a second. Sync(full) applies the latest table; with full set
// it must read the kernel and repair whatever drifted. The first sync, at
// once, is full.
type Reconciler struct {
	NetNS  string        // namespace to watch ("" = the current one)
	Log    *slog.Logger  // required
	Resync time.Duration // period of the full sync; required
	Kick   <-chan struct{}
	// Repair, if not nil, asks for a full sync at once (for example from a
	// packet loop that lost its device).
	Repair <-chan struct{}
	Sync   func(full bool) error
	// Drift is called after every sync, so that it describes the state just
	// programmed (the dataplane's own writes then do not look like drift).
	Drift func() Drift
}

// Run runs the loop until ctx is done, and returns after its subscription
// goroutines have exited.
func (r *Reconciler) Run(ctx context.Context) error {
	w, err := subscribe(r.NetNS, r.Log)
	if err != nil {
		return err
	}
	defer func() { w.close() }()
	tm := newTimers(r.Resync)
	defer tm.stop()
	d := r.Drift()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-r.Kick:
			tm.arm(0)
		case <-r.Repair:
			tm.full = true
			tm.arm(0)
		case <-tm.resync.C:
			tm.full = true
			tm.arm(0)
		case <-tm.soon.C:
			tm.pending = false
			full := tm.full
			tm.full = false
			if err := r.Sync(full); err != nil {
				r.Log.Warn("sync failed; retrying", "err", err)
				tm.full = true
				tm.backOff(retryAfter)
			} else {
				tm.notBefore = time.Time{}
			}
			tm.synced()
			d = r.Drift()
		case u, ok := <-w.links:
			w = r.notified(w, tm, ok, ok && d.Link != nil && d.Link(u))
		case u, ok := <-w.addrs:
			w = r.notified(w, tm, ok, ok && d.Addr != nil && d.Addr(u))
		case u, ok := <-w.neighs:
			w = r.notified(w, tm, ok, ok && d.Neigh != nil && d.Neigh(u))
		case u, ok := <-w.routes:
			w = r.notified(w, tm, ok, ok && d.Route != nil && d.Route(u))
		case <-tm.resub.C:
			nw, err := subscribe(r.NetNS, r.Log)
			if err != nil {
				r.Log.Warn("resubscribe failed; retrying", "err", err)
				tm.resub.Reset(retryAfter)
				continue
			}
			w = nw
			tm.full = true
			tm.arm(0) // notifications were missed meanwhile
		}
	}
}

// notified handles one notification: a relevant one schedules a full sync
// soon; a closed channel means the subscription ended, so it is replaced.
func (r *Reconciler) notified(w *watch, tm *timers, open, relevant bool) *watch {
	switch {
	case !open:
		r.Log.Warn("netlink subscription ended; resubscribing")
		w.close()
		tm.resub.Reset(retryAfter)
		// An empty watch: its nil channels never fire in a select, and
		// close skips them.
		return &watch{done: make(chan struct{})}
	case relevant:
		if wait, slowed := tm.repair(time.Now()); slowed {
			r.Log.Warn("the kernel keeps drifting from what weft programmed right after each repair "+
				"(another program rewriting the same routes, neighbours or devices?); repairs slowed", "wait", wait)
		}
	}
	return w
}

// timers drive the loop: soon fires the next sync (one at a time, at the
// soonest time asked for), resync the periodic one, resub a new
// subscription after a lost one. full asks the next sync to read the
// kernel and repair everything.
type timers struct {
	soon, resub *time.Timer
	resync      *time.Ticker
	pending     bool
	due         time.Time // when soon fires, while pending
	notBefore   time.Time // no sync before this, after a failed one
	full        bool
	// The repair budget: tokens repairs at the debounce are left (refilled
	// one per repairEvery since refilled), repairing says a repair is
	// already scheduled, slowed that the budget ran out and was reported.
	tokens            float64
	refilled          time.Time
	repairing, slowed bool
}

func newTimers(resync time.Duration) *timers {
	tm := &timers{
		soon:     time.NewTimer(0), // the first sync, at once
		resub:    time.NewTimer(time.Hour),
		resync:   time.NewTicker(resync),
		pending:  true,
		due:      time.Now(),
		full:     true,
		tokens:   repairBurst,
		refilled: time.Now(),
	}
	tm.resub.Stop()
	return tm
}

// arm schedules a sync in d, unless one is already scheduled as soon or
// sooner, and never before the back-off after a failed sync ends. A sync
// asked for now (a new table) does not wait for one that a notification
// put off by the debounce (at start-up the new device's own notifications
// arm one).
func (tm *timers) arm(d time.Duration) { tm.armAt(time.Now(), d) }

// armAt is arm at the time now.
func (tm *timers) armAt(now time.Time, d time.Duration) {
	due := now.Add(d)
	if due.Before(tm.notBefore) {
		due = tm.notBefore
	}
	if tm.pending && !due.Before(tm.due) {
		return
	}
	tm.pending, tm.due = true, due
	tm.soon.Reset(due.Sub(now))
}

// backOff schedules the retry of a failed sync in d; until then no new
// table or notification brings a sync forward.
func (tm *timers) backOff(d time.Duration) {
	tm.notBefore = time.Now().Add(d)
	tm.arm(d)
}

// repair schedules a full sync for drift reported at now: at the debounce
// while the repair budget lasts, else once the budget has refilled one
// repair, at most repairEvery away. Drift reported while a repair is
// already scheduled is part of it and changes nothing. It returns the wait
// and whether the budget has just run out.
func (tm *timers) repair(now time.Time) (wait time.Duration, slowed bool) {
	tm.full = true
	tm.tokens = min(repairBurst, tm.tokens+float64(now.Sub(tm.refilled))/float64(repairEvery))
	tm.refilled = now
	if tm.tokens >= repairBurst {
		tm.slowed = false
	}
	if tm.repairing {
		return 0, false
	}
	tm.repairing = true
	tm.tokens = max(tm.tokens-1, -1) // a debt of one repair at most: the wait stays under repairEvery
	wait = debounce
	if tm.tokens < 0 {
		wait = max(debounce, time.Duration(-tm.tokens*float64(repairEvery)))
		slowed, tm.slowed = !tm.slowed, true
	}
	tm.armAt(now, wait)
	return wait, slowed
}

// synced records the end of a sync.
func (tm *timers) synced() { tm.repairing = false }

func (tm *timers) stop() {
	tm.soon.Stop()
	tm.resub.Stop()
	tm.resync.Stop()
}

// watch holds the link, address, neighbour and route change subscriptions
// of one namespace. Its channels close when the subscription fails or is
// closed.
type watch struct {
	links  chan netlink.LinkUpdate
	addrs  chan netlink.AddrUpdate
	neighs chan netlink.NeighUpdate
	routes chan netlink.RouteUpdate
	done   chan struct{}
}

// notifyBuffer is the receive buffer of the neighbour and route
// subscriptions: programming thousands of peers at once makes a burst of
// notifications that overflows the default buffer (ENOBUFS), which forces a
// resubscription and a full resync.
const notifyBuffer = 8 << 20

// notifyQueue is the channel buffer of the neighbour and route
// subscriptions. A burst waits in the socket's receive buffer
// (notifyBuffer), not here: a channel's buffer is allocated up front and
// stays resident (a RouteUpdate is 384 bytes, so 4,096 of them held 1.5 MB
// for the daemon's whole life).
const notifyQueue = 256

// subscribe opens the four subscriptions in the namespace at path (""
// means the current one).
func subscribe(path string, log *slog.Logger) (*watch, error) {
	w := &watch{
		links:  make(chan netlink.LinkUpdate, 64),
		addrs:  make(chan netlink.AddrUpdate, 64),
		neighs: make(chan netlink.NeighUpdate, notifyQueue),
		routes: make(chan netlink.RouteUpdate, notifyQueue),
		done:   make(chan struct{}),
	}
	var nsh *netns.NsHandle
	if path != "" {
		h, err := netns.GetFromPath(path)
		if err != nil {
			return nil, fmt.Errorf("open namespace %s: %w", path, err)
		}
		defer h.Close()
		nsh = &h
	}
	cberr := func(err error) {
		select {
		case <-w.done: // the socket was closed on purpose
		default:
			log.Warn("netlink subscription error", "err", err)
		}
	}
	// netlink closes a subscription's channel when it ends; a failed
	// subscribe leaves it open, so the channels not yet handed over are
	// closed here to keep close() simple.
	fail := func(what string, err error, open ...func()) (*watch, error) {
		for _, c := range open {
			c()
		}
		w.close()
		return nil, fmt.Errorf("subscribe to %s: %w", what, err)
	}
	closeLinks, closeAddrs := func() { close(w.links) }, func() { close(w.addrs) }
	closeNeighs, closeRoutes := func() { close(w.neighs) }, func() { close(w.routes) }
	if err := netlink.LinkSubscribeWithOptions(w.links, w.done, netlink.LinkSubscribeOptions{
		Namespace: nsh, ErrorCallback: cberr}); err != nil {
		return fail("links", err, closeLinks, closeAddrs, closeNeighs, closeRoutes)
	}
	if err := netlink.AddrSubscribeWithOptions(w.addrs, w.done, netlink.AddrSubscribeOptions{
		Namespace: nsh, ErrorCallback: cberr}); err != nil {
		return fail("addresses", err, closeAddrs, closeNeighs, closeRoutes)
	}
	if err := netlink.NeighSubscribeWithOptions(w.neighs, w.done, netlink.NeighSubscribeOptions{
		Namespace: nsh, ErrorCallback: cberr, ReceiveBufferSize: notifyBuffer, ReceiveBufferForceSize: true}); err != nil {
		return fail("neighbours", err, closeNeighs, closeRoutes)
	}
	if err := netlink.RouteSubscribeWithOptions(w.routes, w.done, netlink.RouteSubscribeOptions{
		Namespace: nsh, ErrorCallback: cberr, ReceiveBufferSize: notifyBuffer, ReceiveBufferForceSize: true}); err != nil {
		return fail("routes", err, closeRoutes)
	}
	return w, nil
}

// close ends the subscriptions and returns once their goroutines have
// delivered their last update. A nil channel (an empty watch) is skipped.
func (w *watch) close() {
	select {
	case <-w.done:
	default:
		close(w.done)
	}
	drain(w.links)
	drain(w.addrs)
	drain(w.neighs)
	drain(w.routes)
}

func drain[T any](c chan T) {
	if c != nil {
		for range c {
		}
	}
}
