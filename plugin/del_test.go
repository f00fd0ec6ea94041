package plugin_test

import (
	"context"
	"slices"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/vishvananda/netlink"
	"github.com/weft-net/weft/internal/nettest"
	"github.com/weft-net/weft/plugin"
	"github.com/weft-net/weft/plugin/plugintest"
)

// TestDel: when DEL returns, the veth pair is gone (from the node and from
// the pod), the address is free and a second DEL succeeds, whether the pod's
// namespace still holds the pod end, is gone, holds it under another name,
// or is not the pod's at all (its own eth0 stays).
func TestDel(t *testing.T) {
	f := v4File(true)
	e := newEnv(t, &f)
	n := e.newNode(t, plugintest.Options{})
	cases := []struct {
		name string
		// before runs between ADD and DEL and returns the namespace that
		// DEL is given as CNI_NETNS (nil: the pod's is gone).
		before func(t *testing.T, p *plugintest.Pod) *nettest.NS
		// keep names links of that namespace that DEL must leave.
		keep []string
	}{
		{name: "netns present", before: func(t *testing.T, p *plugintest.Pod) *nettest.NS { return p.NS }},
		{name: "netns gone", before: func(t *testing.T, p *plugintest.Pod) *nettest.NS {
			if err := p.NS.Delete(); err != nil {
				t.Fatal(err)
			}
			return nil
		}},
		{name: "pod end renamed", before: func(t *testing.T, p *plugintest.Pod) *nettest.NS {
			p.NS.MustRun(t, "ip", "link", "set", "eth0", "down")
			p.NS.MustRun(t, "ip", "link", "set", "eth0", "name", "moved0")
			return p.NS
		}},
		{name: "another namespace's eth0", keep: []string{"eth0", "peer0"}, before: func(t *testing.T, p *plugintest.Pod) *nettest.NS {
			other := nettest.NewNS(t, "other")
			nettest.Veth(t, other, "eth0", other, "peer0")
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
			if ports := e.bridgePorts(t); len(ports) != 0 {
				t.Errorf("bridge ports when DEL returned: %v", ports)
			}
			if left := storeFiles(t, e.dataDir, "weft"); len(left) != 0 {
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

// TestGCLeftovers: GC deletes the node's veths in plugin.LeftoverGroup
// named weftrm<n> (with their peers), and only those.
func TestGCLeftovers(t *testing.T) {
	e := newEnv(t, nil)
	links := []struct {
		name    string
		group   uint32
		deleted bool
	}{
		{"weftrm90", plugin.LeftoverGroup, true},
		{"weftrm91", plugin.LeftoverGroup, true},
		{"weftrm92", 0, false},
		{"keep93", plugin.LeftoverGroup, false},
	}
	for _, l := range links {
		v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: l.name, Group: l.group}, PeerName: l.name + "p"}
		if err := e.node.Handle.LinkAdd(v); err != nil {
			t.Fatal(err)
		}
	}
	n := e.newNode(t, plugintest.Options{})
	if err := n.CNI.GCNetworkList(context.Background(), n.List, &libcni.GCArgs{}); err != nil {
		t.Fatalf("GC: %v", err)
	}
	have := linkNames(t, e.node)
	for _, l := range links {
		t.Run(l.name, func(t *testing.T) {
			for _, name := range []string{l.name, l.name + "p"} {
				if present := slices.Contains(have, name); present == l.deleted {
					t.Errorf("%s present %v after GC, want %v", name, present, !l.deleted)
				}
			}
		})
	}
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
