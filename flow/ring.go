package flow

import (
	"context"
	"sync"
	"time"
)

// Ring keeps the latest flows in a fixed number of slots (packed: see
// slot). Add takes at
// most Rate flows a second on average (bursts of Burst); the rest are
// counted in Suppressed and dropped, so that memory is bounded by the
// slots and the work of a flood by the rate. Its methods are safe for
// concurrent use.
type Ring struct {
	mu         sync.Mutex
	slots      []slot
	protos     *protocols
	next       uint64 // sequence number of the next flow; flow s is in slots[s%len]
	rate       float64
	burst      float64
	tokens     float64
	last       time.Time
	suppressed uint64
	added      chan struct{} // closed and replaced at each Add
	now        func() time.Time
}

// NewRing returns a ring of size slots taking rate flows a second, with
// bursts of burst.
func NewRing(size int, rate float64, burst int) *Ring {
	return &Ring{slots: make([]slot, size), protos: newProtocols(), next: 1, rate: rate, burst: float64(burst), tokens: float64(burst),
		added: make(chan struct{}), now: time.Now}
}

// Add stores f with the next sequence number, unless the rate is spent;
// it says whether f was kept.
func (r *Ring) Add(f Flow) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	if !r.last.IsZero() {
		r.tokens = min(r.burst, r.tokens+now.Sub(r.last).Seconds()*r.rate)
	}
	r.last = now
	if r.tokens < 1 {
		r.suppressed++
		return false
	}
	r.tokens--
	f.Seq = r.next
	r.slots[r.next%uint64(len(r.slots))] = pack(f, r.protos)
	r.next++
	close(r.added)
	r.added = make(chan struct{})
	return true
}

// Since returns the last limit flows (0: all held) after sequence number
// seq that match, oldest first, and the sequence number to ask from next.
func (r *Ring) Since(seq uint64, match func(Flow) bool, limit int) ([]Flow, uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	first := uint64(1)
	if n := uint64(len(r.slots)); r.next > n {
		first = r.next - n
	}
	first = max(first, seq+1)
	var out []Flow
	for s := first; s < r.next; s++ {
		f := r.slots[s%uint64(len(r.slots))].unpack(r.protos)
		if match == nil || match(f) {
			out = append(out, f)
		}
	}
	if limit > 0 && len(out) > limit {
		out = out[len(out)-limit:]
	}
	return out, r.next - 1
}

// Wait returns when a flow after seq is added, or ctx is done.
func (r *Ring) Wait(ctx context.Context, seq uint64) {
	r.mu.Lock()
	if r.next-1 > seq {
		r.mu.Unlock()
		return
	}
	ch := r.added
	r.mu.Unlock()
	select {
	case <-ch:
	case <-ctx.Done():
	}
}

// Stats are the ring's bounds and how many flows it turned away.
type Stats struct {
	Slots      int     `json:"slots"`
	Rate       float64 `json:"rate"`
	Burst      int     `json:"burst"`
	Last       uint64  `json:"last"`
	Suppressed uint64  `json:"suppressed"`
}

// Stats reports the ring's bounds and counts.
func (r *Ring) Stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return Stats{Slots: len(r.slots), Rate: r.rate, Burst: int(r.burst), Last: r.next - 1, Suppressed: r.suppressed}
}
