package tunpath

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"io"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/vtep"
)

// testNode is a host on the underlay with a pod behind a veth.
type testNode struct {
	host   *nettest.Host
	pod    *nettest.NS
	subnet netip.Prefix
	podIP  netip.Addr
	node   *Node // nil for a kernel VXLAN node
}

func (n *testNode) mac() subnet.MAC { return vtep.DeviceMAC(n.host.Addr, 1) }

func newHost(t *testing.T, u *nettest.Underlay, label string, sn netip.Prefix) *testNode {
	t.Helper()
	n := &testNode{host: u.AddHost(t, label, "eth0"), pod: nettest.NewNS(t, label+"-pod"), subnet: sn}
	gw := sn.Addr().Next()
	n.podIP = gw.Next()
	nettest.Veth(t, n.host.NS, "vpod", n.pod, "eth0")
	for _, c := range []struct {
		ns   *nettest.NS
		argv []string
	}{
		{n.host.NS, []string{"ip", "link", "set", "vpod", "mtu", "1450"}},
		{n.pod, []string{"ip", "link", "set", "eth0", "mtu", "1450"}},
		{n.host.NS, []string{"ip", "addr", "add", gw.String() + "/24", "dev", "vpod"}},
		{n.pod, []string{"ip", "addr", "add", n.podIP.String() + "/24", "dev", "eth0"}},
		{n.pod, []string{"ip", "route", "add", "default", "via", gw.String()}},
		{n.host.NS, []string{"sysctl", "-qw", "net.ipv4.ip_forward=1"}},
	} {
		nettest.MustRun(t, c.ns, c.argv...)
	}
	return n
}

// startNode runs a tunpath node on n's host with peers until the test ends.
func startNode(t *testing.T, n *testNode, peers ...*testNode) {
	t.Helper()
	cfg := Config{NetNS: n.host.Path, Local: n.host.Addr, Subnet: n.subnet}
	for _, p := range peers {
		cfg.Peers = append(cfg.Peers, Peer{Subnet: p.subnet, Addr: p.host.Addr, MAC: p.mac()})
	}
	node, err := New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	n.node = node
	ctx, cancel := context.WithCancel(context.Background())
	exited := make(chan error, 1)
	go func() { exited <- node.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-exited; err != nil {
			t.Errorf("node %s: %v", n.host.Name, err)
		}
	})
	select {
	case <-node.Ready():
	case err := <-exited:
		t.Fatalf("node %s stopped: %v", n.host.Name, err)
	case <-time.After(10 * time.Second):
		t.Fatalf("node %s not ready", n.host.Name)
	}
}

// kernelVXLAN makes n a kernel VXLAN node (as Flannel programs it) for peer.
func kernelVXLAN(t *testing.T, n, peer *testNode) {
	t.Helper()
	if err := nettest.KernelVXLAN(n.host.NS, n.host.Addr, n.subnet, 1450, nettest.KernelPeer{Addr: peer.host.Addr, Subnet: peer.subnet}); err != nil {
		t.Fatal(err)
	}
}

func ping(t *testing.T, from, to *testNode) {
	t.Helper()
	if out, err := from.pod.Run("ping", "-c", "3", "-i", "0.2", "-W", "2", to.podIP.String()); err != nil {
		t.Fatalf("ping %s → %s: %v\n%s", from.podIP, to.podIP, err, out)
	}
	// The largest ICMP payload that fits the overlay MTU, not fragmented.
	if out, err := from.pod.Run("ping", "-c", "1", "-W", "2", "-M", "do", "-s", "1422", to.podIP.String()); err != nil {
		t.Fatalf("DF ping of 1422 bytes %s → %s: %v\n%s", from.podIP, to.podIP, err, out)
	}
}

// transfer sends size random bytes over TCP from one pod to the other and
// checks that they arrive whole.
func transfer(t *testing.T, from, to *testNode, size int) {
	t.Helper()
	ln, err := to.pod.Listen("tcp", netip.AddrPortFrom(to.podIP, 5201).String())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan [32]byte, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- [32]byte{}
			return
		}
		defer c.Close()
		h := sha256.New()
		io.Copy(h, c)
		got <- [32]byte(h.Sum(nil))
	}()
	data := make([]byte, size)
	rand.Read(data)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := from.pod.DialContext(ctx, "tcp", netip.AddrPortFrom(to.podIP, 5201).String())
	if err != nil {
		t.Fatalf("dial %s: %v", to.podIP, err)
	}
	c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.Copy(c, bytes.NewReader(data)); err != nil {
		c.Close()
		t.Fatalf("send %d bytes to %s: %v", size, to.podIP, err)
	}
	c.Close()
	select {
	case sum := <-got:
		if sum != sha256.Sum256(data) {
			t.Fatalf("%d bytes %s → %s: the receiver's data differ", size, from.podIP, to.podIP)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("%d bytes %s → %s: not received within 30 s", size, from.podIP, to.podIP)
	}
}

func TestTwoNodes(t *testing.T) {
	u := nettest.NewUnderlay(t, netip.MustParsePrefix("192.168.77.0/24"), 1500)
	a := newHost(t, u, "tpa", netip.MustParsePrefix("10.244.1.0/24"))
	b := newHost(t, u, "tpb", netip.MustParsePrefix("10.244.2.0/24"))
	startNode(t, a, b)
	startNode(t, b, a)
	ping(t, a, b)
	ping(t, b, a)
	transfer(t, a, b, 32<<20)
	transfer(t, b, a, 32<<20)
	for _, n := range []*testNode{a, b} {
		s := n.node.Stats()
		if s.TxFrames == 0 || s.RxFrames == 0 {
			t.Errorf("%s: %d frames sent, %d received", n.host.Name, s.TxFrames, s.RxFrames)
		}
		if len(s.Drops) > 0 {
			t.Errorf("%s dropped: %v", n.host.Name, s.Drops)
		}
	}
}

// TestKernelPeer: a node talks to a kernel VXLAN node, whose TCP segments
// come with partial checksums. TCP goes from the node to the kernel's
// only: the kernel's TCP super-packets arrive unsegmented (see the package
// doc).
func TestKernelPeer(t *testing.T) {
	u := nettest.NewUnderlay(t, netip.MustParsePrefix("192.168.77.0/24"), 1500)
	a := newHost(t, u, "tpa", netip.MustParsePrefix("10.244.1.0/24"))
	k := newHost(t, u, "tpk", netip.MustParsePrefix("10.244.2.0/24"))
	startNode(t, a, k)
	kernelVXLAN(t, k, a)
	ping(t, a, k)
	ping(t, k, a)
	transfer(t, a, k, 8<<20)
	s := a.node.Stats()
	if len(s.Drops) > 0 {
		t.Errorf("dropped: %v", s.Drops)
	}
	if s.Events[EventPartialChecksum] == 0 {
		t.Errorf("no partial checksum completed: %v", s.Events)
	}
}

// TestForeignSource: a pod on the peer that sends from an address outside
// its node's subnet is refused.
func TestForeignSource(t *testing.T) {
	u := nettest.NewUnderlay(t, netip.MustParsePrefix("192.168.77.0/24"), 1500)
	a := newHost(t, u, "tpa", netip.MustParsePrefix("10.244.1.0/24"))
	b := newHost(t, u, "tpb", netip.MustParsePrefix("10.244.2.0/24"))
	startNode(t, a, b)
	startNode(t, b, a)
	nettest.MustRun(t, b.pod, "ip", "addr", "add", "10.99.0.1/32", "dev", "eth0")
	if out, err := b.pod.Run("ping", "-c", "2", "-i", "0.2", "-W", "1", "-I", "10.99.0.1", a.podIP.String()); err == nil {
		t.Fatalf("a ping from a foreign source crossed:\n%s", out)
	}
	if got := a.node.Stats().Drops[DropForeignSource]; got == 0 {
		t.Errorf("no %s drop counted: %v", DropForeignSource, a.node.Stats().Drops)
	}
}
