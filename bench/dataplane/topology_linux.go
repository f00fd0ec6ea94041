package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"time"

	"github.com/weft-net/weft/backend"
	"github.com/weft-net/weft/backend/uvxlan"
	"github.com/weft-net/weft/backend/vxlan"
	"github.com/weft-net/weft/internal/namespace"
	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/vtep"
)

// node is one side of the benchmark: a host namespace on the underlay veth
// and, for the overlay modes, a pod namespace behind a veth.
type node struct {
	host   *nettest.NS
	pod    *nettest.NS // nil in underlay mode
	addr   netip.Addr  // underlay address
	subnet netip.Prefix
	podIP  netip.Addr
}

// target is the address iperf3 and ping aim at, and the namespaces to run in.
func (n *node) target() netip.Addr {
	if n.pod == nil {
		return n.addr
	}
	return n.podIP
}

func (n *node) runNS() *nettest.NS {
	if n.pod == nil {
		return n.host
	}
	return n.pod
}

// topology is two nodes on a veth "wire", plus everything to tear down.
type topology struct {
	a, b    *node
	nss     []*nettest.NS
	stop    []func()
	backend []*uvxlan.Backend
	procs   []*nodeProc // uvxlan-proc: the node processes
}

// dataplaneCPU is the CPU time the uvxlan dataplanes have used so far:
// this process's, or that of the node processes (-1 when one cannot be
// read).
func (t *topology) dataplaneCPU() time.Duration {
	if len(t.procs) == 0 {
		return procCPU()
	}
	var d time.Duration
	for _, p := range t.procs {
		c, err := p.cpu()
		if err != nil {
			fmt.Fprintln(os.Stderr, "node process cpu:", err)
			return -1
		}
		d += c
	}
	return d
}

// drops sums the drop counters of the uvxlan dataplanes, and the frames
// they and their fast paths sent and received; node processes report
// theirs when they stop, so drops stops them.
func (t *topology) drops() (m map[string]uint64, f fastShare) {
	m = map[string]uint64{}
	for _, b := range t.backend {
		for k, v := range b.Stats().Drops {
			m[k] += v
		}
	}
	for _, p := range t.procs {
		if err := p.stop(); err != nil {
			fmt.Fprintln(os.Stderr, "node process:", err)
		}
		for k, v := range p.stats.Drops {
			m[k] += v
		}
		f.tx += p.stats.TxFrames
		f.rx += p.stats.RxFrames
		f.fastTx += p.stats.Events[uvxlan.EventFastTxFrames]
		f.fastRx += p.stats.Events[uvxlan.EventFastRxFrames]
	}
	return m, f
}

// fastShare counts frames sent and received, and how many of them the
// fast path carried.
type fastShare struct{ tx, rx, fastTx, fastRx uint64 }

const overlayMTU = 1450

func (t *topology) close() {
	for i := len(t.stop) - 1; i >= 0; i-- {
		t.stop[i]()
	}
	for _, n := range t.nss {
		n.Delete()
	}
}

func (t *topology) newNS(label string) (*nettest.NS, error) {
	n, err := namespace.Create(label)
	if err != nil {
		return nil, err
	}
	t.nss = append(t.nss, n)
	return n, nil
}

// build creates the two hosts and, unless mode is "underlay", their pods and
// the overlay of the given kind.
func build(ctx context.Context, mode string, queues int, log *slog.Logger) (t *topology, err error) {
	t = &topology{}
	defer func() {
		if err != nil {
			t.close()
		}
	}()
	t.a = &node{addr: netip.MustParseAddr("192.168.77.1"), subnet: netip.MustParsePrefix("10.244.1.0/24")}
	t.b = &node{addr: netip.MustParseAddr("192.168.77.2"), subnet: netip.MustParsePrefix("10.244.2.0/24")}
	for _, n := range []*node{t.a, t.b} {
		if n.host, err = t.newNS("bench-host"); err != nil {
			return t, err
		}
	}
	if err := namespace.VethPair(t.a.host, "eth0", t.b.host, "eth0"); err != nil {
		return t, err
	}
	for _, n := range []*node{t.a, t.b} {
		if err := namespace.AddAddr(n.host, "eth0", netip.PrefixFrom(n.addr, 24)); err != nil {
			return t, err
		}
	}
	if mode == "underlay" {
		return t, nil
	}
	for _, n := range []*node{t.a, t.b} {
		if err := t.addPod(n); err != nil {
			return t, err
		}
	}
	switch mode {
	case "kernel":
		err = t.kernelVXLAN()
	case "weft-vxlan", "weft-vxlan-open":
		err = t.weftVXLAN(ctx, mode == "weft-vxlan-open", log)
	case "uvxlan", "uvxlan-plain":
		err = t.userVXLAN(ctx, mode == "uvxlan-plain", queues, log)
	case "uvxlan-proc", "uvxlan-fast":
		err = t.processVXLAN(queues, mode == "uvxlan-fast")
	case "kernel-to-fast", "kernel-to-proc", "fast-to-kernel", "proc-to-kernel":
		err = t.mixedVXLAN(mode, queues)
	default:
		err = fmt.Errorf("unknown mode %q", mode)
	}
	return t, err
}

// addPod puts a pod behind the host as weft's CNI plugin wires one: pod
// eth0 <subnet>.2/24, MTU 1450, its host end on the bridge cni0, which holds
// the gateway <subnet>.1; forwarding on in the host. The bridge matters: a
// frame the overlay hands on still marked as tunnelled is cut into
// segments there (see README.md).
func (t *topology) addPod(n *node) (err error) {
	if n.pod, err = t.newNS("bench-pod"); err != nil {
		return err
	}
	if err := namespace.VethPair(n.host, "vpod", n.pod, "eth0"); err != nil {
		return err
	}
	gw := n.subnet.Addr().Next()
	n.podIP = gw.Next()
	for _, c := range [][]string{
		{"host", "ip", "link", "add", "cni0", "mtu", fmt.Sprint(overlayMTU), "type", "bridge"},
		{"host", "ip", "link", "set", "cni0", "up"},
		{"host", "ip", "link", "set", "vpod", "mtu", fmt.Sprint(overlayMTU), "master", "cni0"},
		{"pod", "ip", "link", "set", "eth0", "mtu", fmt.Sprint(overlayMTU)},
		{"host", "ip", "addr", "add", gw.String() + "/24", "dev", "cni0"},
		{"pod", "ip", "addr", "add", n.podIP.String() + "/24", "dev", "eth0"},
		{"pod", "ip", "route", "add", "default", "via", gw.String()},
		{"host", "sysctl", "-qw", "net.ipv4.ip_forward=1"},
	} {
		ns := n.host
		if c[0] == "pod" {
			ns = n.pod
		}
		if _, err := ns.Run(c[1:]...); err != nil {
			return err
		}
	}
	return nil
}

// kernelVXLAN builds Flannel's kernel VXLAN setup by hand on both hosts.
func (t *topology) kernelVXLAN() error {
	for _, p := range [][2]*node{{t.a, t.b}, {t.b, t.a}} {
		if err := kernelNode(p[0], p[1]); err != nil {
			return err
		}
	}
	return nil
}

// kernelNode builds Flannel's kernel VXLAN setup on n's host, with peer as
// its one peer.
func kernelNode(n, peer *node) error {
	return nettest.KernelVXLAN(n.host, n.addr, n.subnet, overlayMTU, nettest.KernelPeer{Addr: peer.addr, Subnet: peer.subnet})
}

// weftVXLAN runs weft's kernel VXLAN backend (backend/vxlan) in this
// process on both hosts: the same kernel data path as "kernel", programmed
// by weft, with its port filter unless open.
func (t *topology) weftVXLAN(ctx context.Context, open bool, log *slog.Logger) error {
	for _, p := range [][2]*node{{t.a, t.b}, {t.b, t.a}} {
		n, peer := p[0], p[1]
		l, err := n.host.Handle.LinkByName("eth0")
		if err != nil {
			return err
		}
		b, err := vxlan.New(vxlan.Config{Handle: n.host.Handle, NetNS: n.host.Path, UnderlayIndex: l.Attrs().Index,
			Local: n.addr, Subnet: n.subnet, MTU: overlayMTU,
			Network: netip.MustParsePrefix("10.244.0.0/16"), NoPeerFilter: open}, log)
		if err != nil {
			return err
		}
		if err := t.start(ctx, b, vtep.Table{peer.subnet: {MAC: vtep.DeviceMAC(peer.addr, 1), Addr: peer.addr}}); err != nil {
			return err
		}
	}
	return nil
}

// start runs a backend until the topology closes and waits until it has
// programmed table.
func (t *topology) start(ctx context.Context, b backend.Backend, table vtep.Table) error {
	ctx, cancel := context.WithCancel(ctx)
	exited := make(chan struct{})
	var runErr error
	go func() { runErr = b.Run(ctx); close(exited) }()
	t.stop = append(t.stop, func() { cancel(); <-exited })
	b.Set(table)
	select {
	case <-b.Ready():
		return nil
	case <-exited:
		return errors.Join(errors.New("backend stopped"), runErr)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// userVXLAN runs weft's userspace backend in this process on both hosts.
func (t *topology) userVXLAN(ctx context.Context, plain bool, queues int, log *slog.Logger) error {
	for _, p := range [][2]*node{{t.a, t.b}, {t.b, t.a}} {
		n, peer := p[0], p[1]
		b, err := uvxlan.New(uvxlan.Config{
			Handle: n.host.Handle, NetNS: n.host.Path, Local: n.addr, MAC: vtep.DeviceMAC(n.addr, 1),
			MTU: overlayMTU, Subnet: n.subnet, Plain: plain, Queues: queues,
		}, log)
		if err != nil {
			return err
		}
		t.backend = append(t.backend, b)
		if err := t.start(ctx, b, vtep.Table{peer.subnet: {MAC: vtep.DeviceMAC(peer.addr, 1), Addr: peer.addr}}); err != nil {
			return err
		}
	}
	return nil
}
