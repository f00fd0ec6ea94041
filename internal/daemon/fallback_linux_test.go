package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/weft-net/weft/backend/uvxlan"
	"github.com/weft-net/weft/backend/vxlan"
	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/subnet/etcd"
	"github.com/weft-net/weft/vtep"
)

// noteRegistry records the note the daemon gives with the network
// available condition (what the Kubernetes registry adds to its message).
type noteRegistry struct {
	*etcd.Registry
	notes chan string
}

func (r noteRegistry) SetNetworkAvailable(_ context.Context, note string) error {
	r.notes <- note
	return nil
}

// fallbackNode is a host on the underlay running an in-process daemon on
// the real dataplane factory, bound to the host's namespace, with a pod
// namespace behind a veth.
type fallbackNode struct {
	host  *nettest.Host
	d     *Daemon
	dp    chan Dataplane
	notes chan string
	ul    underlayInfo
	podNS *nettest.NS
	pod   netip.Addr
	reg   *prometheus.Registry
}

func startFallbackNode(t *testing.T, u *nettest.Underlay, label string, reg *etcd.Registry, addLink func(netlink.Link) error) *fallbackNode {
	t.Helper()
	h := u.AddHost(t, label, "eth0")
	nettest.MustRun(t, h.NS, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	l, err := h.Handle.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	ul := underlayInfo{index: l.Attrs().Index, name: "eth0", mtu: l.Attrs().MTU, ipv4: h.Addr}
	n := &fallbackNode{host: h, ul: ul, dp: make(chan Dataplane, 1), notes: make(chan string, 4), reg: prometheus.NewRegistry()}
	log := slog.New(slog.DiscardHandler)
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil)).With("node", label)
	}
	at := site{netns: h.Path, addLink: addLink}
	n.d, err = New(Config{
		Registry:   noteRegistry{reg, n.notes},
		Metrics:    NewMetrics(n.reg),
		Node:       Node{PublicIP: h.Addr, UnderlayMTU: ul.mtu},
		SubnetFile: filepath.Join(t.TempDir(), "subnet.env"),
		Factories: Factories{Dataplane: func(typ string, cfg *subnet.Config, lease subnet.Lease, mtu int) (Dataplane, error) {
			dp, err := buildOrFallBack(h.Handle, typ, false, cfg, lease, mtu, ul, nil, at, log)
			if err == nil {
				n.dp <- dp
			}
			return dp, err
		}},
	}, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("%s: daemon: %v", label, err)
		}
	})
	return n
}

// addPod wires a pod namespace to n once it has a lease: <subnet>.2 behind
// a veth whose node end holds <subnet>.1, with a default route through it.
func (n *fallbackNode) addPod(t *testing.T, label string, mtu int) {
	t.Helper()
	sn := n.d.Lease().Subnet
	pod := nettest.NewNS(t, label)
	nettest.Veth(t, n.host.NS, "vpod", pod, "eth0")
	gw := sn.Addr().Next()
	n.pod = gw.Next()
	nettest.MustRun(t, n.host.NS, "ip", "addr", "add", netip.PrefixFrom(gw, sn.Bits()).String(), "dev", "vpod")
	nettest.MustRun(t, n.host.NS, "ip", "link", "set", "vpod", "up")
	nettest.MustRun(t, pod, "ip", "addr", "add", netip.PrefixFrom(n.pod, sn.Bits()).String(), "dev", "eth0")
	nettest.MustRun(t, pod, "ip", "link", "set", "eth0", "mtu", fmt.Sprint(mtu), "up")
	nettest.MustRun(t, pod, "ip", "route", "add", "default", "via", gw.String())
	n.podNS = pod
}

// TestVXLANFallsBackToUVXLAN: a node whose network config asks for vxlan,
// on a kernel that refuses VXLAN devices as one without the driver does
// (through vxlan.Config.AddLink), runs uvxlan with the fast path instead
// (without it when the config says "FastPath": false),
// leases in Flannel's format exactly as a vxlan node, carries pod traffic
// both ways with a kernel-VXLAN node, and says why (metrics, the node
// condition's note). With --backend vxlan it fails with the fix.
func TestVXLANFallsBackToUVXLAN(t *testing.T) {
	client := startEtcd(t)
	ctx := t.Context()
	if _, err := client.Put(ctx, etcd.DefaultPrefix+"/config", `{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}`); err != nil {
		t.Fatal(err)
	}
	u := nettest.NewUnderlay(t, netip.MustParsePrefix("192.168.77.0/24"), 0)
	newReg := func() *etcd.Registry {
		return etcd.New(client, etcd.Options{TTL: time.Minute}, slog.New(slog.DiscardHandler))
	}
	noDriver := func(netlink.Link) error { return unix.EOPNOTSUPP }
	a := startFallbackNode(t, u, "fba", newReg(), noDriver)
	b := startFallbackNode(t, u, "fbb", newReg(), nil)
	// A kernel VXLAN sender on a veth leaves inner checksums for an offload
	// that never runs (docs: uvxlan-notes); a real NIC finishes them.
	nettest.MustRun(t, b.host.NS, "ethtool", "-K", "eth0", "tx", "off")

	dpA, dpB := recv(t, a.dp, "node a's dataplane"), recv(t, b.dp, "node b's dataplane")
	if dpA.Fallback == nil || dpA.Fallback.Type != subnet.BackendTypeUVXLAN || !strings.Contains(dpA.Fallback.Reason, "no VXLAN driver") {
		t.Fatalf("node a's dataplane: fallback %+v, want uvxlan because the kernel has no VXLAN driver", dpA.Fallback)
	}
	if _, ok := dpA.Backend.(*uvxlan.Backend); !ok {
		t.Fatalf("node a runs %T, want uvxlan", dpA.Backend)
	}
	if _, ok := dpB.Backend.(*vxlan.Backend); !ok || dpB.Fallback != nil {
		t.Fatalf("node b runs %T (fallback %+v), want kernel vxlan", dpB.Backend, dpB.Fallback)
	}
	if note := recv(t, a.notes, "node a's condition"); !strings.Contains(note, "uvxlan in place of vxlan") || !strings.Contains(note, "no VXLAN driver") {
		t.Errorf("node a's condition note %q", note)
	}
	if note := recv(t, b.notes, "node b's condition"); note != "" {
		t.Errorf("node b's condition note %q, want none", note)
	}
	if got := fallbackGauge(t, a.reg); got != "configured=vxlan,reason=no_vxlan_driver,running=uvxlan" {
		t.Errorf("node a: weft_backend_fallback %q", got)
	}
	if got := fallbackGauge(t, b.reg); got != "" {
		t.Errorf("node b: weft_backend_fallback %q, want none", got)
	}
	if _, err := a.host.Handle.LinkByName("weft-u.1"); err != nil {
		t.Errorf("node a has no uvxlan TAP: %v", err)
	}
	if _, err := a.host.Handle.LinkByName("weft.1"); err == nil {
		t.Error("node a has a weft.1 device")
	}

	// The lease is a vxlan node's, in Flannel's format.
	la := a.d.Lease()
	resp, err := client.Get(ctx, etcd.DefaultPrefix+"/subnets/"+la.Key())
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("node a's lease %s: %v", la.Key(), err)
	}
	want := fmt.Sprintf(`{"PublicIP":"%s","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"%s"}}`,
		a.host.Addr, vtep.DeviceMAC(a.host.Addr, 1))
	var got, wantV any
	if err := errors.Join(json.Unmarshal(resp.Kvs[0].Value, &got), json.Unmarshal([]byte(want), &wantV)); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(wantV) {
		t.Errorf("node a's lease value %s, want %s", resp.Kvs[0].Value, want)
	}

	waitFor(t, func() bool { return a.d.Ready() && b.d.Ready() })
	a.addPod(t, "fbapod", 1450)
	b.addPod(t, "fbbpod", 1450)
	for _, p := range []struct {
		from *fallbackNode
		to   netip.Addr
	}{{a, b.pod}, {b, a.pod}} {
		if out, err := p.from.podNS.Run("ping", "-c", "3", "-i", "0.2", "-W", "2", p.to.String()); err != nil {
			t.Errorf("ping %s from %s's pod: %v\n%s", p.to, p.from.host.Name, err, out)
		}
	}
	if out, err := a.podNS.Run("ping", "-c", "2", "-s", "1400", "-M", "do", "-W", "2", b.pod.String()); err != nil {
		t.Errorf("full-size ping from node a's pod: %v\n%s", err, out)
	}
	tcpTransfer(t, b, a, 4<<20)
	tcpTransfer(t, a, b, 4<<20)
	st := dpA.Backend.Stats()
	if st.Events[uvxlan.EventFastAttaches] == 0 {
		t.Errorf("node a's fast path never attached: %v", st.Events)
	}
	if st.Events[uvxlan.EventFastTxFrames] == 0 || st.Events[uvxlan.EventFastRxFrames] == 0 {
		t.Errorf("node a's pod traffic did not take the fast path: %v", st.Events)
	}

	// "FastPath": false in the vxlan config: the fallback runs without it
	// (New only opens the maps; nothing is programmed before Run).
	off, err := subnet.ParseConfig([]byte(`{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan","FastPath":false}}`))
	if err != nil {
		t.Fatal(err)
	}
	dpOff, err := buildOrFallBack(a.host.Handle, subnet.BackendTypeVXLAN, false, off, *la, 1450,
		a.ul, nil, site{netns: a.host.Path, addLink: noDriver}, slog.New(slog.DiscardHandler))
	if err != nil || dpOff.Fallback == nil {
		t.Fatalf("fallback with FastPath false: %v (fallback %+v)", err, dpOff.Fallback)
	}
	if ub, ok := dpOff.Backend.(*uvxlan.Backend); !ok || ub.Config().FastPath {
		t.Errorf("fallback with \"FastPath\": false runs %T with the fast path", dpOff.Backend)
	}
	if ub, _ := dpA.Backend.(*uvxlan.Backend); !ub.Config().FastPath {
		t.Error("node a's fallback runs without the fast path by default")
	}

	// --backend vxlan, explicit, fails with the fix.
	cfg, err := subnet.ParseConfig([]byte(`{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}`))
	if err != nil {
		t.Fatal(err)
	}
	_, err = buildOrFallBack(a.host.Handle, subnet.BackendTypeVXLAN, true, cfg, *la, 1450,
		a.ul, nil, site{netns: a.host.Path, addLink: noDriver}, slog.New(slog.DiscardHandler))
	if !errors.Is(err, vxlan.ErrNoDriver) || !strings.Contains(err.Error(), "linux-modules-extra") || !strings.Contains(err.Error(), "--backend uvxlan") {
		t.Errorf("--backend vxlan without the driver: %v", err)
	}
}

// fallbackGauge returns the labels of the weft_backend_fallback series set
// to 1, as name=value pairs, or "" when there is none.
func fallbackGauge(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "weft_backend_fallback" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetGauge().GetValue() != 1 {
				continue
			}
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
			return strings.Join(ls, ",")
		}
	}
	return ""
}

// recv returns the next value on ch, failing the test after 20 s.
func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(20 * time.Second):
		t.Fatalf("no %s within 20 s", what)
		panic("unreachable")
	}
}

// tcpTransfer sends size bytes over TCP from from's pod to to's pod and
// checks that they all arrive, in order.
func tcpTransfer(t *testing.T, from, to *fallbackNode, size int) {
	t.Helper()
	var ln net.Listener
	if err := to.podNS.Do(func() (err error) { ln, err = net.Listen("tcp", net.JoinHostPort(to.pod.String(), "0")); return err }); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan []byte, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- nil
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(20 * time.Second))
		b, _ := io.ReadAll(c)
		got <- b
	}()
	want := make([]byte, size)
	for i := range want {
		want[i] = byte(i * 7)
	}
	var c net.Conn
	if err := from.podNS.Do(func() (err error) {
		c, err = net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
		return err
	}); err != nil {
		t.Fatalf("connect %s → %s: %v", from.host.Name, ln.Addr(), err)
	}
	c.SetDeadline(time.Now().Add(20 * time.Second))
	_, err := c.Write(want)
	c.Close()
	if err != nil {
		t.Fatalf("send %s → %s: %v", from.host.Name, to.host.Name, err)
	}
	if b := recv(t, got, "transfer"); !bytes.Equal(b, want) {
		t.Errorf("TCP %s → %s: %d bytes arrived of %d, or changed", from.host.Name, to.host.Name, len(b), size)
	}
}
