package kernel

import (
	"sync"

	"github.com/weft-net/weft/vtep"
)

// Desired is what every backend keeps of the tables handed to Set: the
// latest one, a signal that wakes its Reconciler, and the Ready channel.
// A backend embeds a *Desired made by NewDesired, which gives it the Set
// and Ready of the Backend interface.
//
// A backend that keeps a table of its own may also take changes row by row
// (Queue, read with Take), so that a change among thousands of peers costs
// neither a copy of the table nor a comparison of two; such a backend
// reads the table only with Take (Table does not see queued rows).
type Desired struct {
	mu    sync.Mutex
	table *vtep.Table
	// fresh says that table was set since the last Take; queued holds the
	// rows queued after it.
	fresh     bool
	queued    []vtep.Update
	kick      chan struct{}
	ready     chan struct{}
	readyOnce sync.Once
}

// NewDesired returns an empty Desired: no table yet, not ready.
func NewDesired() *Desired {
	return &Desired{kick: make(chan struct{}, 1), ready: make(chan struct{})}
}

// Set stores t as the latest table (nil stands for an empty one) and wakes
// the reconciler. It never blocks; t must not be modified afterwards.
func (d *Desired) Set(t vtep.Table) {
	if t == nil {
		t = vtep.Table{}
	}
	d.mu.Lock()
	d.table, d.fresh, d.queued = &t, true, nil
	d.mu.Unlock()
	d.wake()
}

// Queue adds changes to rows of the latest table, after those queued
// before, and wakes the reconciler. It never blocks; ups is not kept.
func (d *Desired) Queue(ups []vtep.Update) {
	d.mu.Lock()
	d.queued = append(d.queued, ups...)
	d.mu.Unlock()
	d.wake()
}

func (d *Desired) wake() {
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// Take returns what was handed over since the last Take: the table set
// (nil if none was), then the rows queued after it, to apply in order.
func (d *Desired) Take() (set *vtep.Table, ups []vtep.Update) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fresh {
		set = d.table
	}
	ups = d.queued
	d.fresh, d.queued = false, nil
	return set, ups
}

// Table returns the latest table handed to Set, or nil before the first.
func (d *Desired) Table() *vtep.Table {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.table
}

// Kick receives a value after each Set or Queue (several may give one):
// the Reconciler's Kick.
func (d *Desired) Kick() <-chan struct{} { return d.kick }

// Ready is closed by the first MarkReady.
func (d *Desired) Ready() <-chan struct{} { return d.ready }

// MarkReady closes Ready, and reports whether this call did (so the backend
// logs it once).
func (d *Desired) MarkReady() bool {
	first := false
	d.readyOnce.Do(func() {
		first = true
		close(d.ready)
	})
	return first
}
