package connectivity

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/namespace"
	"github.com/weft-net/weft/internal/testkit/nettest"
)

// TestProbes pings and makes TCP exchanges between two test namespaces on
// a veth pair whose MTU is 1400, with DF probes on both sides of it.
func TestProbes(t *testing.T) {
	a, b := nettest.NewNS(t, "cona"), nettest.NewNS(t, "conb")
	if err := namespace.VethPair(a, "eth0", b, "eth0"); err != nil {
		t.Fatal(err)
	}
	aIP, bIP := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	for _, x := range []struct {
		ns *nettest.NS
		ip netip.Addr
	}{{a, aIP}, {b, bIP}} {
		if err := namespace.AddAddr(x.ns, "eth0", netip.PrefixFrom(x.ip, 24)); err != nil {
			t.Fatal(err)
		}
		if out, err := x.ns.Run("ip", "link", "set", "eth0", "mtu", "1400"); err != nil {
			t.Fatal(err, out)
		}
	}
	srv, err := ListenTCP(b.Do, netip.AddrPortFrom(bIP, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	pg, err := NewPinger(a.Do)
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()
	if st := pg.PingN(bIP, 3, 84, false, 2*time.Second); st.Received != 3 || st.Loss() != 0 || st.Min <= 0 || st.Max < st.Avg {
		t.Fatalf("ping: %+v", st)
	}
	if _, err := pg.Ping(bIP, 1400, true, 2*time.Second); err != nil {
		t.Fatalf("DF ping at the MTU: %v", err)
	}
	var fn *FragNeededError
	if _, err := pg.Ping(bIP, 1401, true, 2*time.Second); !errors.As(err, &fn) {
		t.Fatalf("DF ping above the MTU: %v, want fragmentation needed", err)
	}
	if _, err := pg.Ping(netip.MustParseAddr("192.0.2.3"), 84, false, 300*time.Millisecond); !errors.Is(err, ErrNoReply) {
		t.Fatalf("ping to nobody: %v", err)
	}
	if d, err := TCPExchange(context.Background(), a.Do, srv.Addr(), 2*time.Second); err != nil || d <= 0 {
		t.Fatalf("tcp: %v %v", d, err)
	}
	if _, err := TCPExchange(context.Background(), a.Do, netip.AddrPortFrom(bIP, 1), 2*time.Second); err == nil {
		t.Fatal("tcp to a closed port succeeded")
	}
	eps := []Endpoint{{Name: "a", Addr: aIP, Do: a.Do}, {Name: "b", Addr: bIP, TCPPort: srv.Addr().Port(), Do: b.Do}}
	m := Measure(context.Background(), "t", eps, Options{Count: 2, Timeout: time.Second})
	var out strings.Builder
	m.Render(&out)
	// a has no TCP server: b → a fails its exchange, a → b passes.
	if m.Failures() != 1 || !strings.Contains(out.String(), "1/2 pairs ok") || !strings.Contains(out.String(), "✗ b") ||
		!strings.Contains(out.String(), "ok 1400") {
		t.Fatalf("matrix:\n%s", out.String())
	}

	// An MTU black hole: b drops packets longer than 1000 bytes without a
	// word. Small probes pass, the DF ones of the link's MTU do not, and the
	// matrix names it.
	if out, err := b.Run("nft", "add table inet wefttest; add chain inet wefttest in { type filter hook input priority 0; }; add rule inet wefttest in ip length > 1000 drop"); err != nil {
		t.Fatal(err, out)
	}
	m = Measure(context.Background(), "t", eps, Options{Count: 2, Timeout: 300 * time.Millisecond})
	out.Reset()
	m.Render(&out)
	if p := m.Pairs[0]; p.OK() || !p.BlackHole() || p.Ping.Received != 2 || p.DFSize != 1400 ||
		!strings.Contains(out.String(), "✗ a → b: MTU black hole: small packets cross, 1400-byte packets with DF set do not") {
		t.Fatalf("black hole not named: %+v\n%s", p, out.String())
	}
	if back := FromJSON(ToJSON(m.Pairs)); !back[0].BlackHole() || back[0].DFSize != 1400 || back[0].OK() {
		t.Fatalf("through JSON: %+v", back[0])
	}
	t.Logf("black hole:\n%s", out.String())
}
