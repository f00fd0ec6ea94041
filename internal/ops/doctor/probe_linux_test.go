package doctor

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/ops/connectivity"
	"github.com/weft-net/weft/subnet"
)

// TestReportDF: a full-size DF probe to a peer lost without a word is an
// MTU black hole; refused with "fragmentation needed" it is a smaller path
// MTU that the path reported.
func TestReportDF(t *testing.T) {
	peer := subnet.Lease{Subnet: netip.MustParsePrefix("10.244.3.0/24"), Attrs: subnet.LeaseAttrs{PublicIP: netip.MustParseAddr("192.168.77.3")}}
	small := connectivity.Stats{Sent: 3, Received: 3, Min: time.Millisecond, Avg: time.Millisecond, Max: time.Millisecond}
	for _, tt := range []struct {
		name      string
		df        connectivity.Stats
		want, not string
	}{
		{"lost", connectivity.Stats{Sent: 2, Err: connectivity.ErrNoReply}, "MTU black hole: small probes to 10.244.3.0 come back", "reported by the path"},
		{"refused", connectivity.Stats{Sent: 2, Err: &connectivity.FragNeededError{MTU: 1400}},
			"path MTU smaller than the overlay's, reported by the path: small probes to 10.244.3.0 come back (rtt min/avg/max 1.000ms/1.000ms/1.000ms) but a 1450-byte probe with DF set is refused (fragmentation needed (DF set): path MTU 1400)",
			"black hole"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := &state{r: &Report{}}
			s.report(probeResult{peer: peer, small: small, df: tt.df, dfSize: 1450})
			c := s.r.Checks
			if len(c) != 1 || c[0].Name != "probe/192.168.77.3" || c[0].Status != Fail || c[0].Fix == "" ||
				!strings.Contains(c[0].Evidence, tt.want) || strings.Contains(c[0].Evidence, tt.not) {
				t.Fatalf("got %+v, want fail with %q", c, tt.want)
			}
		})
	}
}
