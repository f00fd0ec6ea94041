package plugin_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/vishvananda/netlink"
	"github.com/weft-net/weft/internal/namespace"
	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/internal/testkit/plugintest"
)

var gateway = netip.MustParseAddr("10.244.59.1")

// TestDel: when DEL returns, the veth pair is gone (from the node and from
// the pod), the address is free and a second DEL succeeds, whether the pod's
// namespace still holds the pod end, is gone, holds it under another name,
// or is not the pod's at all: then its eth0 stays, also when it is paired
// with a port of another bridge, or with a link whose index is a port of
// cni0 in another namespace.
func TestDel(t *testing.T) {
	f := v4File(true)
	e := newEnv(t, &f)
	n := e.newNode(t, plugintest.Options{})
	cases := []struct {
		name string
		// before runs between ADD and DEL and returns the namespace that
		// DEL is given as CNI_NETNS (nil: the pod's is gone).
		before func(t *testing.T, p *plugintest.Pod) *nettest.NS
		// keep names links of that namespace that DEL must leave, ports
		// the ports of cni0 that are not the pod's.
		keep, ports []string
	}{
		{name: "netns present", before: func(t *testing.T, p *plugintest.Pod) *nettest.NS { return p.NS }},
		{name: "netns gone", before: func(t *testing.T, p *plugintest.Pod) *nettest.NS {
			if err := p.NS.Delete(); err != nil {
				t.Fatal(err)
			}
			return nil
		}},
		{name: "pod end renamed", before: func(t *testing.T, p *plugintest.Pod) *nettest.NS {
			nettest.MustRun(t, p.NS, "ip", "link", "set", "eth0", "down")
			nettest.MustRun(t, p.NS, "ip", "link", "set", "eth0", "name", "moved0")
			return p.NS
		}},
		{name: "another namespace's eth0", keep: []string{"eth0", "peer0"}, before: func(t *testing.T, p *plugintest.Pod) *nettest.NS {
			other := nettest.NewNS(t, "other")
			nettest.Veth(t, other, "eth0", other, "peer0")
			p.RT.NetNS = other.Path
			return other
		}},
		// Its eth0 is paired with a node link that is a port of another
		// bridge (another network's): not this network's, both stay.
		{name: "eth0 paired off this bridge", keep: []string{"eth0"}, before: func(t *testing.T, p *plugintest.Pod) *nettest.NS {
			other := nettest.NewNS(t, "other")
			nettest.Veth(t, e.node, "other0", other, "eth0")
			if err := namespace.Bridge(e.node, "cni1"); err != nil {
				t.Fatal(err)
			}
			nettest.MustRun(t, e.node, "ip", "link", "set", "other0", "master", "cni1")
			t.Cleanup(func() {
				if _, err := e.node.Handle.LinkByName("other0"); err != nil {
					t.Errorf("DEL removed other0, the node end of another namespace's eth0: %v", err)
				}
			})
			p.RT.NetNS = other.Path
			return other
		}},
		// Its eth0 (index 301) is paired with index 300 of a third
		// namespace, and the node's link 300 is a port of cni0 paired with
		// an index 301 of a fourth: the indexes match, the namespaces do
		// not. Every link stays.
		{name: "eth0 paired elsewhere, indexes of a port", keep: []string{"eth0"}, ports: []string{"port300"}, before: func(t *testing.T, p *plugintest.Pod) *nettest.NS {
			other, third, fourth := nettest.NewNS(t, "other"), nettest.NewNS(t, "third"), nettest.NewNS(t, "fourth")
			nettest.MustRun(t, e.node, "ip", "link", "add", "port300", "index", "300", "master", "cni0", "type", "veth",
				"peer", "name", "eth0", "index", "301", "netns", fourth.Path)
			nettest.MustRun(t, third, "ip", "link", "add", "q300", "index", "300", "type", "veth",
				"peer", "name", "eth0", "index", "301", "netns", other.Path)
			t.Cleanup(func() {
				for _, l := range []struct {
					ns   *nettest.NS
					name string
				}{{e.node, "port300"}, {third, "q300"}, {fourth, "eth0"}} {
					if _, err := l.ns.Handle.LinkByName(l.name); err != nil {
						t.Errorf("DEL removed %s of %s: %v", l.name, l.ns.Name, err)
					}
				}
				if l, err := e.node.Handle.LinkByName("port300"); err == nil {
					e.node.Handle.LinkDel(l)
				}
			})
			p.RT.NetNS = other.Path
			return other
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := n.AddPod(t, "del") // its cleanup DEL is the second one
			host := p.Result.Interfaces[1].Name
			ns := c.before(t, p)
			if err := n.Del(p); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			if _, err := e.node.Handle.LinkByName(host); err == nil {
				t.Errorf("host veth %s still there when DEL returned", host)
			}
			if ports := e.bridgePorts(t); !sameSet(ports, c.ports) {
				t.Errorf("bridge ports when DEL returned: %v, want %v", ports, c.ports)
			}
			if left := plugintest.StoreFiles(t, e.dataDir, "weft"); len(left) != 0 {
				t.Errorf("allocations left after DEL: %v", left)
			}
			if ns != nil {
				if got, want := linkNames(t, ns), append([]string{"lo"}, c.keep...); !sameSet(got, want) {
					t.Errorf("links in CNI_NETNS when DEL returned: %v, want %v", got, want)
				}
			}
		})
	}
}

// TestDelWithRefusedKey: a key weft refuses (ipam.rangeStart here) added
// to the network config while a pod runs fails ADD, naming the key, but not
// the pod's DEL (its veth goes and its address is freed) nor GC.
func TestDelWithRefusedKey(t *testing.T) {
	f := v4File(true)
	e := newEnv(t, &f)
	p := e.newNode(t, plugintest.Options{}).AddPod(t, "refused")
	host := p.Result.Interfaces[1].Name
	edited := e.newNode(t, plugintest.Options{Extra: map[string]any{
		"ipam": map[string]any{"dataDir": e.dataDir, "rangeStart": "10.244.59.10"}}})
	if _, err := edited.Add(nettest.NewNS(t, "new"), "pod-new"); err == nil || !strings.Contains(err.Error(), "rangeStart") {
		t.Errorf("ADD with ipam.rangeStart: %v, want an error naming the key", err)
	}
	if err := edited.Del(p); err != nil {
		t.Fatalf("DEL with ipam.rangeStart in the config: %v", err)
	}
	if _, err := e.node.Handle.LinkByName(host); err == nil {
		t.Errorf("host veth %s still there when DEL returned", host)
	}
	if left := plugintest.StoreFiles(t, e.dataDir, "weft"); len(left) != 0 {
		t.Errorf("allocations left after DEL: %v", left)
	}
	if err := edited.CNI.GCNetworkList(context.Background(), edited.List, &libcni.GCArgs{}); err != nil {
		t.Errorf("GC with ipam.rangeStart in the config: %v", err)
	}
}

// TestDelThenAdd: DEL followed at once by ADD of the same container ID,
// netns and ifname (a runtime's retry, `podman network reload`), 40 times
// while every CPU is kept busy, leaves the pod wired each time: only its
// new eth0, its address, its default route via the gateway on eth0, the
// gateway and (through the default route) the node reachable, and CHECK
// passes.
func TestDelThenAdd(t *testing.T) {
	const rounds = 40
	f := v4File(true)
	e := newEnv(t, &f)
	n := e.newNode(t, plugintest.Options{})
	podNS := nettest.NewNS(t, "pod")
	const id = "pod-again"
	p, err := n.Add(podNS, id)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Del(p); err != nil {
			t.Errorf("DEL at the end: %v", err)
		}
	})
	stop := busyCPUs(t)
	defer stop()
	failed := 0
	for round := range rounds {
		if err := n.Del(p); err != nil {
			t.Fatalf("round %d: DEL: %v", round, err)
		}
		if p, err = n.Add(podNS, id); err != nil {
			t.Fatalf("round %d: ADD right after DEL: %v", round, err)
		}
		if errs := checkWired(t, n, p); len(errs) > 0 {
			failed++
			for _, err := range errs {
				t.Errorf("round %d: %v", round, err)
			}
		}
	}
	if failed > 0 {
		t.Errorf("%d of %d DEL+ADD rounds left the pod not wired", failed, rounds)
	}
}

// busyCPUs keeps every CPU busy with spinning goroutines until the
// returned function (also run at cleanup) stops them. GOMAXPROCS is raised
// meanwhile so that the spinners leave the test's own goroutines a P: the
// kernel, not the Go scheduler, shares the CPUs.
func busyCPUs(t *testing.T) (stop func()) {
	spinners := runtime.NumCPU()
	procs := runtime.GOMAXPROCS(spinners + 2)
	var done atomic.Bool
	var wg sync.WaitGroup
	for range spinners {
		wg.Go(func() {
			for !done.Load() {
			}
		})
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			done.Store(true)
			wg.Wait()
			runtime.GOMAXPROCS(procs)
		})
	}
	t.Cleanup(stop)
	return stop
}

// checkWired returns what is wrong with pod p right after its ADD.
func checkWired(t *testing.T, n *plugintest.Node, p *plugintest.Pod) []error {
	t.Helper()
	var errs []error
	if got := linkNames(t, p.NS); !sameSet(got, []string{"lo", "eth0"}) {
		errs = append(errs, fmt.Errorf("pod links %v, want lo and eth0 only", got))
	}
	eth0, err := p.NS.Handle.LinkByName("eth0")
	if err != nil {
		return append(errs, fmt.Errorf("pod eth0: %w", err))
	}
	want := netip.PrefixFrom(p.IP, 24)
	addrs, err := p.NS.Handle.AddrList(eth0, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(addrs, func(a netlink.Addr) bool { return a.IPNet.String() == want.String() }) {
		errs = append(errs, fmt.Errorf("eth0 lacks %s: %v", want, addrs))
	}
	var defaults []string
	routes, err := p.NS.Handle.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	onEth0 := false
	for _, r := range routes {
		if r.Dst == nil || r.Dst.String() == "0.0.0.0/0" {
			defaults = append(defaults, fmt.Sprintf("via %s dev index %d", r.Gw, r.LinkIndex))
			onEth0 = onEth0 || (r.Gw.Equal(net.IP(gateway.AsSlice())) && r.LinkIndex == eth0.Attrs().Index)
		}
	}
	if !onEth0 || len(defaults) != 1 {
		errs = append(errs, fmt.Errorf("default routes %v, want one via %s on eth0 (index %d)", defaults, gateway, eth0.Attrs().Index))
	}
	for _, to := range []netip.Addr{gateway, nodeAddr} { // the node's uplink only through the default route
		if out, err := p.NS.Run("ping", "-c", "1", "-W", "3", to.String()); err != nil {
			errs = append(errs, fmt.Errorf("ping %s: %v\n%s", to, err, out))
		}
	}
	if err := n.Check(p); err != nil {
		errs = append(errs, fmt.Errorf("CHECK: %w", err))
	}
	return errs
}

// linkNames names the links of n.
func linkNames(t *testing.T, n *nettest.NS) []string {
	t.Helper()
	ls, err := n.Handle.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range ls {
		names = append(names, l.Attrs().Name)
	}
	return names
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}
