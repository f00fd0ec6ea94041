package uvxlan

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/vtep"
	"golang.org/x/sys/unix"
)

// testNode is one overlay node of an end-to-end test: a host on the
// underlay with a pod namespace behind a veth, and either this package's
// backend or a hand-made kernel VXLAN device.
type testNode struct {
	host   *nettest.Host
	pod    *nettest.NS
	subnet netip.Prefix
	podIP  netip.Addr
	mac    subnet.MAC
	mtu    int      // overlay MTU: underlay MTU − 50 (IPv4) or − 70 (IPv6)
	b      *Backend // nil for a kernel VXLAN node
	stop   func()   // stops b's Run and waits for it; idempotent
}

func testLogger(t *testing.T) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// addPod wires a pod namespace to the node: pod eth0 <subnet>.2 (or ::2)
// with the overlay MTU and a default route via <subnet>.1 on the node's end
// of the veth. IPv6 addresses skip duplicate address detection.
func addPod(t *testing.T, n *testNode, label string) {
	t.Helper()
	n.pod = nettest.NewNS(t, label+"pod")
	nettest.Veth(t, n.host.NS, "vpod", n.pod, "eth0")
	gw := n.subnet.Addr().Next()
	n.podIP = gw.Next()
	for _, l := range []struct {
		ns   *nettest.NS
		name string
		addr netip.Addr
	}{{n.host.NS, "vpod", gw}, {n.pod, "eth0", n.podIP}} {
		nettest.MustRun(t, l.ns, "ip", "link", "set", l.name, "mtu", fmt.Sprint(n.mtu))
		nettest.MustRun(t, l.ns, "ip", "addr", "add", netip.PrefixFrom(l.addr, n.subnet.Bits()).String(), "dev", l.name, "nodad")
	}
	nettest.MustRun(t, n.pod, "ip", "route", "add", "default", "via", gw.String())
	nettest.MustRun(t, n.host, "sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1")
}

// waitDAD waits until the host's IPv6 underlay address can be bound: the
// address nettest gives it goes through duplicate address detection.
func waitDAD(t *testing.T, h *nettest.Host) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for h.Addr.Is6() && strings.Contains(nettest.MustRun(t, h, "ip", "-6", "addr", "show", "dev", h.Link), "tentative") {
		if time.Now().After(deadline) {
			t.Fatalf("address of %s still tentative", h.Name)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// newUVNode starts a userspace VXLAN node; the backend stops at test end.
func newUVNode(t *testing.T, u *nettest.Underlay, label string, sn netip.Prefix, plain bool, queues ...int) *testNode {
	t.Helper()
	return newUVNodeWith(t, u, label, sn, func(c *Config) {
		c.Plain = plain
		if len(queues) > 0 {
			c.Queues = queues[0]
		}
	})
}

// newUVNodeWith is newUVNode with the backend's Config changed by mod.
func newUVNodeWith(t *testing.T, u *nettest.Underlay, label string, sn netip.Prefix, mod func(*Config)) *testNode {
	t.Helper()
	return newUVNodeRun(t, u, label, sn, mod, testLogger(t).With("node", label), nil)
}

// newUVNodeRun is newUVNodeWith with the backend's logger, and before, if
// set, called with the backend before it runs (to set test seams).
func newUVNodeRun(t *testing.T, u *nettest.Underlay, label string, sn netip.Prefix, mod func(*Config), log *slog.Logger, before func(*Backend)) *testNode {
	t.Helper()
	n := &testNode{host: u.AddHost(t, label, "eth0"), subnet: sn, mtu: vtep.OverlayMTU(u.MTU, u.Prefix.Addr().Is6())}
	n.mac = vtep.DeviceMAC(n.host.Addr, 1)
	addPod(t, n, label)
	waitDAD(t, n.host)
	cfg := Config{
		Handle: n.host.Handle, NetNS: n.host.Path, Local: n.host.Addr, MAC: n.mac,
		MTU: n.mtu, Reconcile: 200 * time.Millisecond,
	}
	mod(&cfg)
	if sn.Addr().Is6() {
		cfg.IPv6Subnet = sn
	} else {
		cfg.Subnet = sn
	}
	b, err := New(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	if before != nil {
		before(b)
	}
	n.b = b
	n.stop = start(t, b, label)
	t.Cleanup(n.stop)
	return n
}

// start runs b until the returned function is called.
func start(t *testing.T, b *Backend, label string) func() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	return sync.OnceFunc(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run %s: %v", label, err)
		}
	})
}

// newKernelNode builds a node with a hand-made kernel VXLAN device, the way
// Flannel's vxlan backend sets it up. Its underlay veth keeps the default
// offloads, so the kernel leaves inner TCP/UDP checksums partial, as on any
// virtual link that carries checksum offload through: the userspace peer
// must take them (see the package documentation).
func newKernelNode(t *testing.T, u *nettest.Underlay, label string, sn netip.Prefix) *testNode {
	t.Helper()
	n := &testNode{host: u.AddHost(t, label, "eth0"), subnet: sn, mtu: vtep.OverlayMTU(u.MTU, u.Prefix.Addr().Is6())}
	n.mac = vtep.DeviceMAC(n.host.Addr, 1)
	addPod(t, n, label)
	h := n.host
	nettest.MustRun(t, h, "ip", "link", "add", "vx0", "address", n.mac.String(), "mtu", fmt.Sprint(n.mtu), "type", "vxlan",
		"id", "1", "dstport", "8472", "local", h.Addr.String(), "dev", "eth0", "nolearning")
	nettest.MustRun(t, h, "ip", "addr", "add", subnetAddr(sn).String()+"/32", "dev", "vx0")
	nettest.MustRun(t, h, "ip", "link", "set", "vx0", "up")
	return n
}

// connect gives every node the table of all the others.
func connect(t *testing.T, nodes ...*testNode) {
	t.Helper()
	for _, n := range nodes {
		tab := vtep.Table{}
		for _, p := range nodes {
			if p != n {
				tab[p.subnet] = vtep.Peer{MAC: p.mac, Addr: p.host.Addr}
			}
		}
		if n.b != nil {
			n.b.Set(tab)
			select {
			case <-n.b.Ready():
			case <-time.After(10 * time.Second):
				t.Fatalf("backend of %s not ready", n.host.Name)
			}
			continue
		}
		for s, v := range tab {
			gw := subnetAddr(s).String()
			nettest.MustRun(t, n.host, "ip", "neigh", "replace", gw, "lladdr", v.MAC.String(), "dev", "vx0", "nud", "permanent")
			addFDB(t, n, v)
			nettest.MustRun(t, n.host, "ip", "route", "replace", s.String(), "via", gw, "dev", "vx0", "onlink")
		}
	}
}

// addFDB adds "<mac> dst <addr> self permanent" on vx0 (with netlink: the
// `bridge` on PATH may be the CNI plugin of that name).
func addFDB(t *testing.T, n *testNode, v vtep.Peer) {
	t.Helper()
	l, err := n.host.Handle.LinkByName("vx0")
	if err != nil {
		t.Fatal(err)
	}
	err = n.host.Handle.NeighSet(&netlink.Neigh{
		LinkIndex: l.Attrs().Index, Family: unix.AF_BRIDGE, State: netlink.NUD_PERMANENT,
		Flags: netlink.NTF_SELF, IP: v.Addr.AsSlice(), HardwareAddr: v.MAC.HardwareAddr(),
	})
	if err != nil {
		t.Fatalf("add fdb %s: %v", v.MAC, err)
	}
}

// ping pings dst from the pod of n and reports whether all replies came.
func ping(n *testNode, dst netip.Addr, args ...string) (string, error) {
	argv := append([]string{"ping", "-c", "3", "-i", "0.2", "-W", "2"}, args...)
	return n.pod.Run(append(argv, dst.String())...)
}

// transfer sends size pseudo-random bytes over TCP from the pod of a to the
// pod of b and checks that the SHA-256 of what arrived matches.
func transfer(t *testing.T, a, b *testNode, size int64) {
	t.Helper()
	if err := transferErr(a, b, size); err != nil {
		t.Fatal(err)
	}
}

// transferErr is transfer for use outside the test goroutine.
func transferErr(a, b *testNode, size int64) error {
	if raceEnabled {
		size /= 4
	}
	var ln net.Listener
	if err := b.pod.Do(func() (err error) {
		ln, err = net.Listen("tcp", net.JoinHostPort(b.podIP.String(), "0"))
		return err
	}); err != nil {
		return err
	}
	defer ln.Close()
	type result struct {
		sum [32]byte
		n   int64
		err error
	}
	got := make(chan result, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- result{err: err}
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(60 * time.Second))
		h := sha256.New()
		n, err := io.Copy(h, c)
		var r result
		copy(r.sum[:], h.Sum(nil))
		r.n, r.err = n, err
		got <- r
	}()
	var c net.Conn
	if err := a.pod.Do(func() (err error) {
		c, err = net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
		return err
	}); err != nil {
		return err
	}
	c.SetDeadline(time.Now().Add(60 * time.Second))
	h := sha256.New()
	src := io.TeeReader(io.LimitReader(rand.NewChaCha8([32]byte{1, 2, 3}), size), h)
	if _, err := io.Copy(c, src); err != nil {
		c.Close()
		return fmt.Errorf("send: %w", err)
	}
	c.Close()
	r := <-got
	if r.err != nil && !errors.Is(r.err, io.EOF) {
		return fmt.Errorf("receive: %w", r.err)
	}
	if r.n != size || r.sum != [32]byte(h.Sum(nil)) {
		return fmt.Errorf("received %d bytes with sha256 %x, sent %d with %x", r.n, r.sum, size, h.Sum(nil))
	}
	return nil
}
