package ipip

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/vtep"
)

// requireIPIP fails (or, when asked, skips) the test where the kernel cannot
// make an IPIP tunnel: it tries one in a namespace of its own.
func requireIPIP(t *testing.T) {
	t.Helper()
	ns := nettest.NewNS(t, "ipprobe")
	if out, err := ns.Run("ip", "link", "add", "probe0", "type", "ipip", "local", "192.0.2.1"); err != nil {
		nettest.CannotRun(t, nettest.SkipTools, fmt.Sprintf("the kernel makes no IPIP tunnel (CONFIG_NET_IPIP, modprobe ipip): %v %s", err, out))
	}
}

// node is a test host on the underlay with node subnet 10.244.<n>.0/24
// and a bridge cni0 holding <subnet>.1 for its pods.
type node struct {
	*nettest.Host
	Subnet   netip.Prefix
	underlay int
}

func newNode(t *testing.T, u *nettest.Underlay, n int) *node {
	t.Helper()
	h := u.AddHost(t, fmt.Sprintf("n%d", n), "eth0")
	nd := &node{Host: h, Subnet: netip.MustParsePrefix(fmt.Sprintf("10.244.%d.0/24", n))}
	l, err := h.Handle.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	nd.underlay = l.Attrs().Index
	gw := netip.PrefixFrom(nd.Subnet.Addr().Next(), nd.Subnet.Bits())
	nettest.MustRun(t, h, "ip", "link", "add", "cni0", "type", "bridge")
	nettest.MustRun(t, h, "ip", "addr", "add", gw.String(), "dev", "cni0")
	nettest.MustRun(t, h, "ip", "link", "set", "cni0", "up")
	nettest.MustRun(t, h, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	return nd
}

// pod wires a pod namespace to nd's bridge, as Flannel's CNI delegate does:
// a veth with <subnet>.<i+1> in the pod, its host end on cni0, a default
// route via the bridge's address.
func (nd *node) pod(t *testing.T, i int) (*nettest.NS, netip.Addr) {
	t.Helper()
	p := nettest.NewNS(t, "pod")
	host := fmt.Sprintf("vp%d-%d", nd.Subnet.Addr().As4()[2], i)
	nettest.Veth(t, p, "eth0", nd.NS, host)
	nettest.MustRun(t, nd, "ip", "link", "set", host, "master", "cni0")
	a := nd.Subnet.Addr().Next()
	for range i {
		a = a.Next()
	}
	nettest.MustRun(t, p, "ip", "addr", "add", netip.PrefixFrom(a, nd.Subnet.Bits()).String(), "dev", "eth0")
	nettest.MustRun(t, p, "ip", "route", "add", "default", "via", nd.Subnet.Addr().Next().String())
	return p, a
}

func (nd *node) config(direct bool) Config {
	return Config{Handle: nd.Handle, NetNS: nd.Path, UnderlayIndex: nd.underlay, Local: nd.Addr,
		Subnet: nd.Subnet, DirectRouting: direct}
}

func testLogger(t *testing.T) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(&tlog{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

type tlog struct{ t *testing.T }

func (w *tlog) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// run starts b and waits until it is ready; the test's end stops it.
func run(t *testing.T, b *Backend) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	select {
	case <-b.Ready():
	case err := <-done:
		t.Fatalf("Run ended: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("not ready")
	}
}

// waitFor polls cond (every 20 ms, up to 5 s) until it returns "".
func waitFor(t *testing.T, what string, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		msg := cond()
		if msg == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s", what, msg)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// flanneldLeases is what flanneld's ipip backend writes in etcd for three
// nodes (key → value), and one vxlan node's lease that ipip nodes ignore.
var flanneldLeases = map[string]string{
	"10.244.1.0-24": `{"PublicIP":"192.168.77.1","PublicIPv6":null,"BackendType":"ipip"}`,
	"10.244.2.0-24": `{"PublicIP":"192.168.77.2","PublicIPv6":null,"BackendType":"ipip"}`,
	"10.244.3.0-24": `{"PublicIP":"192.168.77.3","PublicIPv6":null,"BackendType":"ipip"}`,
	"10.244.9.0-24": `{"PublicIP":"192.168.77.9","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"4e:fb:7d:bf:6b:2d"}}`,
}

// tableFor is the table the daemon builds for the node with subnet self
// from flanneldLeases: each value parsed as a lease value, then
// vtep.FromLeasesOf for the ipip lease type.
func tableFor(t *testing.T, self netip.Prefix) vtep.Table {
	t.Helper()
	var leases []subnet.Lease
	var me subnet.Lease
	for key, val := range flanneldLeases {
		v4, v6, err := subnet.ParseKey(key)
		if err != nil {
			t.Fatal(err)
		}
		l := subnet.Lease{Subnet: v4, IPv6Subnet: v6}
		if err := json.Unmarshal([]byte(val), &l.Attrs); err != nil {
			t.Fatalf("lease %s: %v", key, err)
		}
		if v4 == self {
			me = l
		}
		leases = append(leases, l)
	}
	return vtep.FromLeasesOf(subnet.BackendTypeIPIP, leases, me)
}

// TestPodsPingOverIPIP runs the backend on three nodes of one segment, each
// programmed from leases in flanneld's ipip format, and pings between pods
// behind each node's bridge, and from a node to a remote pod. Without
// DirectRouting the packets go through flannel.ipip (its counters grow) and
// the routes go via the peer's address onlink over it; with DirectRouting
// the peers are on-link, so the routes go over eth0 and nothing goes
// through the tunnel. The vxlan node's lease gets no route.
func TestPodsPingOverIPIP(t *testing.T) {
	requireIPIP(t)
	for _, direct := range []bool{false, true} {
		t.Run(fmt.Sprintf("DirectRouting=%v", direct), func(t *testing.T) {
			u := nettest.NewUnderlay(t, netip.MustParsePrefix("192.168.77.0/24"), 0)
			nodes := []*node{newNode(t, u, 1), newNode(t, u, 2), newNode(t, u, 3)}
			type pod struct {
				ns *nettest.NS
				ip netip.Addr
			}
			var pods []pod
			for _, nd := range nodes {
				b, err := New(nd.config(direct), testLogger(t))
				if err != nil {
					t.Fatal(err)
				}
				b.Set(tableFor(t, nd.Subnet))
				run(t, b)
				for i := 1; i <= 2; i++ {
					ns, ip := nd.pod(t, i)
					pods = append(pods, pod{ns, ip})
				}
			}
			n1 := nodes[0]
			dev := "dev " + DeviceName + " proto 87 onlink"
			if direct {
				dev = "dev eth0 proto 87"
			}
			want := fmt.Sprintf("10.244.2.0/24 via 192.168.77.2 %s \n10.244.3.0/24 via 192.168.77.3 %s \n", dev, dev)
			if got := nettest.MustRun(t, n1, "ip", "route", "show", "proto", "87"); got != want {
				t.Errorf("routes on n1:\n%s\nwant:\n%s", got, want)
			}
			link := nettest.MustRun(t, n1, "ip", "-d", "-o", "link", "show", DeviceName)
			for _, w := range []string{"mtu 1480 ", "ipip ", "remote any local 192.168.77.1 "} {
				if !strings.Contains(link, w) {
					t.Errorf("%s lacks %q: %s", DeviceName, w, link)
				}
			}
			if got := nettest.MustRun(t, n1, "ip", "-4", "-o", "addr", "show", "dev", DeviceName); !strings.Contains(got, "inet 10.244.1.0/32 ") {
				t.Errorf("address of %s: %q", DeviceName, got)
			}
			for _, from := range pods {
				for _, to := range pods {
					if from.ip.As4()[2] == to.ip.As4()[2] {
						continue
					}
					if out, err := from.ns.Run("ping", "-c", "2", "-i", "0.2", "-W", "2", to.ip.String()); err != nil {
						t.Errorf("ping %s from %s: %v\n%s", to.ip, from.ip, err, out)
					}
				}
			}
			if out, err := n1.Run("ping", "-c", "2", "-i", "0.2", "-W", "2", pods[2].ip.String()); err != nil {
				t.Errorf("ping %s from node 1: %v\n%s", pods[2].ip, err, out)
			}
			l, err := n1.Handle.LinkByName(DeviceName)
			if err != nil {
				t.Fatal(err)
			}
			tx := l.Attrs().Statistics.TxPackets
			if direct && tx != 0 {
				t.Errorf("DirectRouting: %d packets went through %s", tx, DeviceName)
			}
			if !direct && tx == 0 {
				t.Errorf("no packet went through %s", DeviceName)
			}
		})
	}
}

// TestRepairAndAdopt: a deleted route and a deleted device come back and
// are counted; a second backend on the same node (a restarted weftd)
// adopts everything without a change.
func TestRepairAndAdopt(t *testing.T) {
	requireIPIP(t)
	u := nettest.NewUnderlay(t, netip.MustParsePrefix("192.168.77.0/24"), 0)
	nd := newNode(t, u, 1)
	c := nd.config(false)
	c.ResyncInterval = time.Hour // repairs must come from notifications
	b, err := New(c, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	b.Set(tableFor(t, nd.Subnet))
	run(t, b)
	want := "10.244.2.0/24 via 192.168.77.2 dev flannel.ipip proto 87 onlink \n" +
		"10.244.3.0/24 via 192.168.77.3 dev flannel.ipip proto 87 onlink \n"
	routes := func() string {
		if got := nettest.MustRun(t, nd, "ip", "route", "show", "proto", "87"); got != want {
			return got
		}
		return ""
	}
	waitFor(t, "routes", routes)
	nettest.MustRun(t, nd, "ip", "route", "del", "10.244.3.0/24")
	waitFor(t, "route repaired", routes)
	waitFor(t, "route repair counted", func() string {
		if n := b.Stats().Repairs["route"]; n < 1 {
			return "none"
		}
		return ""
	})
	nettest.MustRun(t, nd, "ip", "link", "del", DeviceName)
	waitFor(t, "device repaired", routes)
	if n := b.Stats().Repairs["device"]; n != 1 {
		t.Errorf("device repairs %d, want 1", n)
	}

	b2, err := New(nd.config(false), testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	s, err := b2.spec()
	if err != nil {
		t.Fatal(err)
	}
	if _, created, err := ensureDevice(nd.Handle, s, b2.log); err != nil || created {
		t.Errorf("second backend: created=%v, %v", created, err)
	}
}
