package faults

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/test/e2e"
)

// pingResult is what a background ping measured.
type pingResult struct {
	Lost, Sent int
	Took       time.Duration
}

// String is the report figure: lost of sent, and how often ping really
// sent (asked every 10 ms, ping sends about every 17 ms on these machines,
// and slower under load).
func (p pingResult) String() string {
	every := time.Duration(0)
	if p.Sent > 0 {
		every = p.Took / time.Duration(p.Sent)
	}
	return fmt.Sprintf("%d (of %d, one every %.0f ms)", p.Lost, p.Sent, float64(every)/float64(time.Millisecond))
}

// startPingLoss runs pingLoss in the background; the returned function
// waits for it and returns its result.
func startPingLoss(ns *nettest.NS, dst netip.Addr, window time.Duration) func() (pingResult, error) {
	type result struct {
		p   pingResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		p, err := pingLoss(ns, dst, window)
		done <- result{p, err}
	}()
	return func() (pingResult, error) {
		r := <-done
		return r.p, r.err
	}
}

// pingLoss pings dst every 10 ms (as asked of ping) for window and returns
// the replies lost of those sent. It pings in runs of at most 3000: on a
// loaded machine ping sends more slowly than asked (a run of 9000 outlived
// nettest's two-minute command limit and was killed), and each run must
// finish well within that limit.
func pingLoss(ns *nettest.NS, dst netip.Addr, window time.Duration) (pingResult, error) {
	var p pingResult
	start := time.Now()
	for left := window; left > 0; left = window - time.Since(start) {
		n := max(1, min(3000, int(left/(10*time.Millisecond))))
		l, _, err := e2e.PingLoss(ns, dst, 10*time.Millisecond, n)
		if err != nil {
			return p, err
		}
		p.Lost, p.Sent = p.Lost+l, p.Sent+n
	}
	p.Took = time.Since(start)
	return p, nil
}
