package kernel

import (
	"sync"
	"sync/atomic"

	"github.com/weft-net/weft/vtep"
)

// Desired is what every backend keeps of the tables handed to Set: the
// latest one, a signal that wakes its Reconciler, and the Ready channel.
// A backend embeds a *Desired made by NewDesired, which gives it the Set
// and Ready of the Backend interface.
type Desired struct {
	table     atomic.Pointer[vtep.Table]
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
	d.table.Store(&t)
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// Table returns the latest table handed to Set, or nil before the first.
func (d *Desired) Table() *vtep.Table { return d.table.Load() }

// Kick receives a value after each Set (several Sets may give one): the
// Reconciler's Kick.
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
