package hostgw

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/vtep"
)

// hgNode is a host-gw node on an underlay with one pod, <subnet>.2.
type hgNode struct {
	*nettest.Host
	subnet netip.Prefix
	pod    *nettest.NS
	podIP  netip.Addr
	b      *Backend
}

func newHGNode(t *testing.T, u *nettest.Underlay, n int) *hgNode {
	t.Helper()
	nd := &hgNode{Host: u.AddHost(t, fmt.Sprintf("hg%d", n), "eth0"),
		subnet: pfx(fmt.Sprintf("10.244.%d.0/24", n))}
	nd.pod = nettest.NewNS(t, fmt.Sprintf("hgpod%d", n))
	nettest.Veth(t, nd.pod, "eth0", nd.NS, "vpod")
	gw := nd.subnet.Addr().Next()
	nd.podIP = gw.Next()
	nettest.MustRun(t, nd, "ip", "addr", "add", netip.PrefixFrom(gw, 24).String(), "dev", "vpod")
	nettest.MustRun(t, nd.pod, "ip", "addr", "add", netip.PrefixFrom(nd.podIP, 24).String(), "dev", "eth0")
	nettest.MustRun(t, nd.pod, "ip", "route", "add", "default", "via", gw.String())
	nettest.MustRun(t, nd, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	l, err := nd.Handle.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	nd.b, err = New(Config{Handle: nd.Handle, NetNS: nd.Path, UnderlayIndex: l.Attrs().Index,
		Local: nd.Addr, Subnet: nd.subnet, Network: pfx("10.244.0.0/16")},
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	return nd
}

// run starts the backend with peers and waits until it is ready.
func (nd *hgNode) run(t *testing.T, peers ...*hgNode) {
	t.Helper()
	nd.set(peers...)
	nd.start(t)
	select {
	case <-nd.b.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("not ready")
	}
}

// start runs the backend until the test ends.
func (nd *hgNode) start(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- nd.b.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Error(err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Run did not return within 10 s of cancel")
		}
	})
}

func (nd *hgNode) set(peers ...*hgNode) {
	tab := vtep.Table{}
	for _, p := range peers {
		tab[p.subnet] = vtep.Peer{Addr: p.Addr}
	}
	nd.b.Set(tab)
}

// TestPodSourcesFromPeersOnly: on host-gw, a host on the L2 segment that
// holds no lease sends datagrams to a pod with a source in the node's own
// pod subnet and in a subnet no peer holds: both are dropped and counted
// (not_peer_subnet), while a peer's pod reaches the pod. A source in a
// peer's subnet from the wrong host is not caught (see the package
// documentation: nothing cheap ties a subnet to its sender on the wire).
// A peer that joins is reachable from its first packet; once it leaves,
// its pod's datagrams are dropped.
func TestPodSourcesFromPeersOnly(t *testing.T) {
	u := nettest.NewUnderlay(t, pfx("192.168.77.0/24"), 0)
	n1, n2 := newHGNode(t, u, 1), newHGNode(t, u, 2)
	evil := u.AddHost(t, "evil", "eth0")
	n1.run(t, n2)
	n2.run(t, n1)
	sink := nettest.ListenUDP(t, n1.pod, netip.AddrPortFrom(n1.podIP, 9999))
	to := netip.AddrPortFrom(n1.podIP, 9999)
	drops := func() uint64 { return n1.b.Stats().Drops["not_peer_subnet"] }

	nettest.SendUDP(t, n2.pod, n2.podIP, to, []byte("peer"))
	if !sink.WaitFor("peer", 5*time.Second) {
		t.Fatal("a peer's pod did not reach the pod")
	}
	base := drops()
	nettest.MustRun(t, evil, "ip", "route", "add", n1.subnet.String(), "via", n1.Addr.String())
	for _, src := range []string{"10.244.1.77", "10.244.9.5", "10.244.2.77"} {
		nettest.MustRun(t, evil, "ip", "addr", "add", src+"/32", "dev", "eth0")
		nettest.SendUDP(t, evil.NS, ip(src), to, []byte(src), []byte(src), []byte(src))
	}
	nettest.SendUDP(t, n2.pod, n2.podIP, to, []byte("peer-after"))
	if !sink.WaitFor("peer-after", 5*time.Second) || !sink.WaitFor("10.244.2.77", 5*time.Second) {
		t.Fatal("a peer's pod, or a source in a peer's subnet, did not reach the pod")
	}
	for _, src := range []string{"10.244.1.77", "10.244.9.5"} {
		if n := sink.Count(src); n != 0 {
			t.Errorf("%d datagrams from %s reached the pod", n, src)
		}
	}
	waitFor(t, "drops counted", func() string {
		if d := drops() - base; d != 6 {
			return fmt.Sprintf("%d not_peer_subnet drops, want 6", d)
		}
		return ""
	})

	n3 := newHGNode(t, u, 3)
	n3.run(t, n1)
	n1.set(n2, n3)
	route := func(present bool) {
		waitFor(t, "n1's route to n3's subnet", func() string {
			out := nettest.MustRun(t, n1, "ip", "route", "show", n3.subnet.String())
			if strings.Contains(out, "via") != present {
				return fmt.Sprintf("route %q, want present=%v", out, present)
			}
			return ""
		})
	}
	route(true)
	nettest.SendUDP(t, n3.pod, n3.podIP, to, []byte("first"))
	if !sink.WaitFor("first", 5*time.Second) {
		t.Fatal("a joining peer's first datagram did not arrive")
	}
	base = drops()
	n1.set(n2)
	route(false)
	nettest.SendUDP(t, n3.pod, n3.podIP, to, []byte("after-leave"))
	waitFor(t, "the departed peer's datagram counted", func() string {
		if d := drops() - base; d != 1 {
			return fmt.Sprintf("%d drops, want 1", d)
		}
		return ""
	})
	if sink.Count("after-leave") != 0 {
		t.Error("a departed peer's pod reached the pod")
	}
}

// TestFilterFailureKeepsRoutes: while the filter cannot be written (a
// table of its name owned by another program), routes still follow the
// peers and the backend is not ready; once the table is free, the filter
// is programmed on the retry and the backend becomes ready.
func TestFilterFailureKeepsRoutes(t *testing.T) {
	u := nettest.NewUnderlay(t, pfx("192.168.78.0/24"), 0)
	n1, n2, n3 := newHGNode(t, u, 1), newHGNode(t, u, 2), newHGNode(t, u, 3)
	release := nettest.OwnTable(t, n1.NS, "inet", FilterTable)
	n1.set(n2)
	n1.start(t)
	routes := func(want, gone netip.Prefix) func() string {
		return func() string {
			out, _ := n1.Run("ip", "-4", "route", "show", "dev", "eth0")
			if strings.Contains(out, want.String()+" via") && !strings.Contains(out, gone.String()+" via") {
				return ""
			}
			return out
		}
	}
	waitFor(t, "route to the new peer while the filter fails", routes(n2.subnet, n3.subnet))
	n1.set(n3)
	waitFor(t, "routes follow the peers while the filter fails", routes(n3.subnet, n2.subnet))
	select {
	case <-n1.b.Ready():
		t.Fatal("ready while the filter cannot be written")
	default:
	}
	release()
	select {
	case <-n1.b.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("not ready once the filter could be written")
	}
	want := "elements = { " + n3.subnet.Addr().String() + " }"
	if out := nettest.MustRun(t, n1, "nft", "list", "set", "inet", FilterTable, "subnets"); !strings.Contains(out, want) {
		t.Errorf("set subnets, want %q:\n%s", want, out)
	}
}
