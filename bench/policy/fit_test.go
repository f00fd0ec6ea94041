package policy

import (
	"math"
	"testing"
	"time"
)

// TestPositionFit checks the least-squares fit on points on a known line
// (p50 = 0.2 ms + 0.5 µs per rule before the allowing one) and that too
// few rounds give none.
func TestPositionFit(t *testing.T) {
	var rounds []round
	for _, place := range []int{1, 101, 501, 1001} {
		var r round
		r.pos[many] = place
		r.connect[many].times = []time.Duration{200*time.Microsecond + time.Duration(place-1)*500*time.Nanosecond}
		rounds = append(rounds, r)
	}
	slope, icept, corr, ok := positionFit(rounds)
	if !ok || math.Abs(slope-0.0005) > 1e-9 || math.Abs(icept-0.2) > 1e-9 || math.Abs(corr-1) > 1e-9 {
		t.Errorf("fit: slope %g ms/rule, intercept %g ms, r %g, ok %v; want 0.0005, 0.2, 1, true", slope, icept, corr, ok)
	}
	if _, _, _, ok := positionFit(rounds[:2]); ok {
		t.Error("a fit from two rounds")
	}
}
