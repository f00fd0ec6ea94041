package connectivity

import (
	"strings"
	"testing"
	"time"
)

// TestMatrixMTU: full-size DF probes lost without a word are an MTU black
// hole; refused with "fragmentation needed" they are a smaller path MTU
// that the path reported (path MTU discovery works). Both survive the JSON
// a run publishes to the other nodes.
func TestMatrixMTU(t *testing.T) {
	small := Stats{Sent: 2, Received: 2, Min: time.Millisecond, Avg: time.Millisecond, Max: time.Millisecond}
	for _, tt := range []struct {
		name      string
		df        Stats
		blackHole bool
		reported  bool
		mtu       int
		want      string // in the rendered matrix
		not       string // not in it
	}{
		{"lost", Stats{Sent: 2, Err: ErrNoReply}, true, false, 0,
			"✗ a → b: MTU black hole: small packets cross, 1450-byte packets with DF set do not (no reply)", "reported by the path"},
		{"refused by a hop", Stats{Sent: 2, Err: &FragNeededError{MTU: 1400}}, false, true, 1400,
			"✗ a → b: path MTU smaller than the overlay's, reported by the path: small packets cross, 1450-byte packets with DF set are refused (fragmentation needed (DF set): path MTU 1400); lower Backend.MTU", "black hole"},
		{"refused by the source", Stats{Sent: 2, Err: &FragNeededError{}}, false, true, 0,
			"path MTU smaller than the overlay's, reported by the path", "black hole"},
		{"crossed", Stats{Sent: 2, Received: 2}, false, false, 0, "1/1 pairs ok", "✗"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := Pair{From: "a", To: "b", Ping: small, DF: tt.df, DFSize: 1450}
			for _, p := range []Pair{p, FromJSON(ToJSON([]Pair{p}))[0]} {
				mtu, reported := p.PathMTUReported()
				if p.BlackHole() != tt.blackHole || reported != tt.reported || mtu != tt.mtu {
					t.Errorf("BlackHole %v, PathMTUReported %d %v; want %v, %d %v (%+v)", p.BlackHole(), mtu, reported, tt.blackHole, tt.mtu, tt.reported, p)
				}
				var out strings.Builder
				if err := (&Matrix{Title: "t", Pairs: []Pair{p}}).Render(&out); err != nil {
					t.Fatal(err)
				}
				if !strings.Contains(out.String(), tt.want) || strings.Contains(out.String(), tt.not) {
					t.Errorf("want %q and not %q in:\n%s", tt.want, tt.not, out.String())
				}
			}
		})
	}
}
