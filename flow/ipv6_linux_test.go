package flow_test

import (
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/weft-net/weft/flow"
	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/policy"
)

// TestIPv6DropLogged: an IPv6 plan (chains and sets named v6-…) logs its
// drops too. The source pod is isolated for egress by x/out with nothing
// allowed, so its TCP connection is dropped and the drop must name x/out
// and the egress direction, with both IPv6 addresses and the port.
func TestIPv6DropLogged(t *testing.T) {
	node, p1, _ := nettest.RoutedPods(t, "v6", [2]netip.Prefix{netip.MustParsePrefix("fd08:1::/64"), netip.MustParsePrefix("fd08:2::/64")})
	src, dst := netip.MustParseAddr("fd08:1::2"), netip.MustParseAddr("fd08:2::2")
	if err := policy.Program(node.Path, policy.Plan{V6: true, EgressIsolated: []netip.Addr{src},
		EgressBy: []policy.Isolation{{Policies: []string{"x/out"}, Addrs: []netip.Addr{src}}}, LogGroup: 12}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []flow.Flow
	readNFLog(t, node, 12, func(f flow.Flow) { mu.Lock(); got = append(got, f); mu.Unlock() })
	deadline := time.Now().Add(15 * time.Second)
	for {
		p1.Do(func() error {
			if c, err := net.DialTimeout("tcp", "[fd08:2::2]:443", 500*time.Millisecond); err == nil {
				c.Close()
				t.Error("the pod isolated for egress connected")
			}
			return nil
		})
		mu.Lock()
		n := len(got)
		mu.Unlock()
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no drop logged")
		}
	}
	mu.Lock()
	defer mu.Unlock()
	f := got[0]
	if f.Src != src || f.Dst != dst || f.DstPort != 443 || f.Proto != "tcp" || f.Direction != flow.DirEgress || !slices.Equal(f.Policies, []string{"x/out"}) {
		t.Errorf("drop %+v", f)
	}
}
