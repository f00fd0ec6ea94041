package plugin_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/weft-net/weft/internal/namespace"
	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/internal/testkit/plugintest"
	"github.com/weft-net/weft/subnet"
)

// flannelNode is weft installed as "flannel" on a test node, with one
// flannel entry (subnetFile, dataDir and ipam.dataDir set to the test's)
// whose keys the test chooses.
type flannelNode struct {
	e     *env
	node  *plugintest.Node
	store string // address store of network "cbr0"
	state string // Flannel's dataDir
}

func newFlannelNode(t *testing.T, f subnet.File, entry map[string]any) *flannelNode {
	t.Helper()
	e := newEnv(t, &f)
	bin := t.TempDir()
	if err := os.Symlink(e.bin, filepath.Join(bin, "flannel")); err != nil {
		t.Fatal(err)
	}
	n := &flannelNode{e: e, store: filepath.Join(e.dataDir, "cbr0"), state: filepath.Join(t.TempDir(), "flannel")}
	fl := map[string]any{"type": "flannel", "subnetFile": e.subnetFile, "dataDir": n.state}
	ipam := map[string]any{"dataDir": e.dataDir}
	for k, v := range entry {
		if k == "ipam" {
			for ik, iv := range v.(map[string]any) {
				ipam[ik] = iv
			}
			continue
		}
		fl[k] = v
	}
	fl["ipam"] = ipam
	b, _ := json.Marshal(map[string]any{"cniVersion": "1.0.0", "name": "cbr0", "plugins": []any{fl}})
	list, err := libcni.NetworkConfFromBytes(b)
	if err != nil {
		t.Fatal(err)
	}
	cni := libcni.NewCNIConfigWithCacheDir([]string{bin}, t.TempDir(), &plugintest.NSExec{RawExec: invoke.RawExec{Stderr: os.Stderr}, NS: e.node})
	n.node = &plugintest.Node{NS: e.node, CNI: cni, List: list}
	return n
}

// add ADDs a new pod namespace as eth0 with the runtime's capability args
// and CNI_ARGS; the pod is DELeted when the test ends.
func (n *flannelNode) add(t *testing.T, id string, caps map[string]any, args [][2]string) (*plugintest.Pod, error) {
	t.Helper()
	pod := nettest.NewNS(t, id)
	rt := &libcni.RuntimeConf{ContainerID: id, NetNS: pod.Path, IfName: "eth0", CapabilityArgs: caps, Args: args}
	res, err := n.node.CNI.AddNetworkList(context.Background(), n.node.List, rt)
	if err != nil {
		return &plugintest.Pod{NS: pod, ID: id, RT: rt}, err
	}
	cur, err := current.NewResultFromResult(res)
	if err != nil {
		t.Fatal(err)
	}
	p := &plugintest.Pod{NS: pod, ID: id, Result: cur, RT: rt}
	p.IP, _ = netip.AddrFromSlice(cur.IPs[0].Address.IP.To4())
	t.Cleanup(func() {
		if err := n.node.Del(p); err != nil {
			t.Errorf("DEL %s: %v", id, err)
		}
	})
	return p, nil
}

func (n *flannelNode) mustAdd(t *testing.T, id string) *plugintest.Pod {
	t.Helper()
	p, err := n.add(t, id, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func podRoutes(t *testing.T, p *plugintest.Pod) string {
	return nettest.MustRun(t, p.NS, "ip", "-4", "route", "show")
}

// TestDefaultGatewayKeys: as "flannel", isDefaultGateway false (what Multus
// secondary networks set) and an unset one (the bridge plugin's default)
// give the pod no default route, only the cluster network's; true gives
// one.
func TestDefaultGatewayKeys(t *testing.T) {
	for _, c := range []struct {
		name     string
		delegate map[string]any
		def      bool
	}{
		{"isDefaultGateway false", map[string]any{"isDefaultGateway": false}, false},
		{"unset", map[string]any{}, false},
		{"isDefaultGateway true", map[string]any{"isDefaultGateway": true}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := newFlannelNode(t, v4File(true), map[string]any{"delegate": c.delegate})
			p := n.mustAdd(t, "p1")
			routes := podRoutes(t, p)
			if got := strings.Contains(routes, "default via 10.244.59.1"); got != c.def {
				t.Errorf("default route %v, want %v:\n%s", got, c.def, routes)
			}
			if !strings.Contains(routes, "10.244.0.0/16 via 10.244.59.1") {
				t.Errorf("no cluster network route:\n%s", routes)
			}
			hasDefault := false
			for _, r := range p.Result.Routes {
				hasDefault = hasDefault || r.Dst.String() == "0.0.0.0/0"
			}
			if hasDefault != c.def {
				t.Errorf("default route in the result %v, want %v", hasDefault, c.def)
			}
			ping(t, p.NS, netip.MustParseAddr("10.244.59.1"))
		})
	}
}

// TestIPAMRoutes: ipam.routes, which Flannel merges before its route to
// the cluster network, are added in the pod, via the gateway unless they
// name one, with their metric.
func TestIPAMRoutes(t *testing.T) {
	n := newFlannelNode(t, v4File(true), map[string]any{"ipam": map[string]any{"routes": []any{
		map[string]any{"dst": "192.168.9.0/24"},
		map[string]any{"dst": "172.16.0.0/12", "gw": "10.244.59.9", "priority": 7},
	}}, "delegate": map[string]any{"isDefaultGateway": true}})
	p := n.mustAdd(t, "p1")
	routes := podRoutes(t, p)
	for _, w := range []string{"192.168.9.0/24 via 10.244.59.1", "172.16.0.0/12 via 10.244.59.9 dev eth0 metric 7", "10.244.0.0/16 via 10.244.59.1", "default via 10.244.59.1"} {
		if !strings.Contains(routes, w) {
			t.Errorf("pod routes lack %q:\n%s", w, routes)
		}
	}
	if err := n.node.Check(p); err != nil {
		t.Errorf("CHECK: %v", err)
	}
}

// TestRequestedAddressAndMAC: the ips and mac capabilities (runtimeConfig)
// and CNI_ARGS IP and MAC give the pod that address and MAC, reserved in
// host-local's store; an address outside the node subnet, the gateway or
// one another pod holds is refused naming it, and leaves nothing behind.
func TestRequestedAddressAndMAC(t *testing.T) {
	n := newFlannelNode(t, v4File(true), map[string]any{"capabilities": map[string]bool{"ips": true, "mac": true},
		"delegate": map[string]any{"isDefaultGateway": true}})
	check := func(p *plugintest.Pod, ip, mac string) {
		t.Helper()
		if p.IP.String() != ip {
			t.Errorf("%s got %s, asked for %s", p.ID, p.IP, ip)
		}
		if out := nettest.MustRun(t, p.NS, "ip", "-o", "link", "show", "eth0"); !strings.Contains(out, "link/ether "+mac) {
			t.Errorf("%s's eth0 has not MAC %s:\n%s", p.ID, mac, out)
		}
		if b, err := os.ReadFile(filepath.Join(n.store, ip)); err != nil || string(b) != p.ID+"\r\neth0" {
			t.Errorf("reservation of %s: %q, %v", ip, b, err)
		}
	}
	a, err := n.add(t, "a", map[string]any{"ips": []string{"10.244.59.77/24"}, "mac": "0a:11:22:33:44:55"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	check(a, "10.244.59.77", "0a:11:22:33:44:55")
	b, err := n.add(t, "b", nil, [][2]string{{"IgnoreUnknown", "1"}, {"IP", "10.244.59.78"}, {"MAC", "0a:11:22:33:44:66"}})
	if err != nil {
		t.Fatal(err)
	}
	check(b, "10.244.59.78", "0a:11:22:33:44:66")
	ping(t, a.NS, b.IP)
	for _, c := range []struct{ ip, want string }{
		{"10.244.59.77", "10.244.59.77 is reserved already"},
		{"10.244.60.7", "10.244.60.7 is outside the node subnet"},
		{"10.244.59.1", "10.244.59.1 is the node subnet's gateway"},
	} {
		_, err := n.add(t, "bad", map[string]any{"ips": []string{c.ip}}, nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ADD asking for %s: %v, want %q", c.ip, err, c.want)
		}
		if ports := n.e.bridgePorts(t); len(ports) != 2 {
			t.Errorf("bridge ports after the refused ADD: %v", ports)
		}
	}
	if left := plugintest.StoreFiles(t, n.e.dataDir, "cbr0"); len(left) != 2 {
		t.Errorf("store after the refused ADDs: %v", left)
	}
}

// TestBridgeKeys: the delegate's bridge, mtu, hairpinMode (off by default
// as "flannel"), promiscMode and isGateway.
func TestBridgeKeys(t *testing.T) {
	t.Run("bridge, mtu, no hairpin by default", func(t *testing.T) {
		n := newFlannelNode(t, v4File(true), map[string]any{"delegate": map[string]any{"bridge": "br7", "mtu": 1400}})
		p := n.mustAdd(t, "p1")
		host := p.Result.Interfaces[1].Name
		out := nettest.MustRun(t, n.e.node, "ip", "-d", "link", "show", host)
		if !strings.Contains(out, "master br7") || !strings.Contains(out, "hairpin off") {
			t.Errorf("host veth not on br7 or with hairpin:\n%s", out)
		}
		if mtu := nettest.MustRun(t, p.NS, "cat", "/sys/class/net/eth0/mtu"); strings.TrimSpace(mtu) != "1400" {
			t.Errorf("pod MTU %s, want 1400", mtu)
		}
	})
	t.Run("hairpinMode", func(t *testing.T) {
		n := newFlannelNode(t, v4File(true), map[string]any{"delegate": map[string]any{"hairpinMode": true}})
		p := n.mustAdd(t, "p1")
		if out := nettest.MustRun(t, n.e.node, "ip", "-d", "link", "show", p.Result.Interfaces[1].Name); !strings.Contains(out, "hairpin on") {
			t.Errorf("host veth without hairpin:\n%s", out)
		}
	})
	t.Run("promiscMode", func(t *testing.T) {
		n := newFlannelNode(t, v4File(true), map[string]any{"delegate": map[string]any{"promiscMode": true}})
		n.mustAdd(t, "p1")
		if out := nettest.MustRun(t, n.e.node, "ip", "link", "show", "cni0"); !strings.Contains(out, "PROMISC") {
			t.Errorf("cni0 not promiscuous:\n%s", out)
		}
	})
	t.Run("isGateway false", func(t *testing.T) {
		n := newFlannelNode(t, v4File(true), map[string]any{"delegate": map[string]any{"isGateway": false}})
		p := n.mustAdd(t, "p1")
		if out := n.e.bridgeAddrs(t, "cni0"); strings.Contains(out, "10.244.59.1") {
			t.Errorf("cni0 holds the gateway though isGateway is false:\n%s", out)
		}
		if p.Result.IPs[0].Gateway.String() != "10.244.59.1" {
			t.Errorf("result gateway %s (the bridge plugin keeps host-local's)", p.Result.IPs[0].Gateway)
		}
	})
}

// TestForceAddress: with a foreign address on cni0 (outside the cluster
// network, which weft keeps by default), forceAddress true replaces it as
// the bridge plugin does, false refuses to, naming the key.
func TestForceAddress(t *testing.T) {
	for _, force := range []bool{true, false} {
		t.Run(map[bool]string{true: "true", false: "false"}[force], func(t *testing.T) {
			n := newFlannelNode(t, v4File(true), map[string]any{"delegate": map[string]any{"forceAddress": force}})
			if err := namespace.Bridge(n.e.node, "cni0"); err != nil {
				t.Fatal(err)
			}
			if err := namespace.AddAddr(n.e.node, "cni0", netip.MustParsePrefix("192.168.50.1/24")); err != nil {
				t.Fatal(err)
			}
			_, err := n.add(t, "p1", nil, nil)
			addrs := n.e.bridgeAddrs(t, "cni0")
			if force {
				if err != nil || strings.Contains(addrs, "192.168.50.1") || !strings.Contains(addrs, "10.244.59.1/24") {
					t.Errorf("ADD %v; cni0:\n%s", err, addrs)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), "forceAddress is false") || !strings.Contains(addrs, "192.168.50.1") {
				t.Errorf("ADD %v; cni0:\n%s", err, addrs)
			}
		})
	}
}

// TestIPMasqKey: the delegate's ipMasq wins over the subnet file's
// FLANNEL_IPMASQ either way.
func TestIPMasqKey(t *testing.T) {
	for _, c := range []struct {
		name        string
		daemon, key bool
	}{{"true though the daemon masquerades", true, true}, {"false though the daemon does not", false, false}} {
		t.Run(c.name, func(t *testing.T) {
			n := newFlannelNode(t, v4File(c.daemon), map[string]any{"delegate": map[string]any{"ipMasq": c.key}})
			n.mustAdd(t, "p1")
			rules := nettest.MustRun(t, n.e.node, "nft", "list", "ruleset")
			if got := strings.Contains(rules, "masq-cbr0"); got != c.key {
				t.Errorf("masquerade chain %v, want %v:\n%s", got, c.key, rules)
			}
		})
	}
}

// TestDNSKeys: the delegate's dns, else ipam.resolvConf, is the result's.
func TestDNSKeys(t *testing.T) {
	resolv := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(resolv, []byte("nameserver 10.96.0.53\nsearch svc.cluster.local\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	n := newFlannelNode(t, v4File(true), map[string]any{"ipam": map[string]any{"resolvConf": resolv}})
	if d := n.mustAdd(t, "p1").Result.DNS; len(d.Nameservers) != 1 || d.Nameservers[0] != "10.96.0.53" || d.Search[0] != "svc.cluster.local" {
		t.Errorf("dns from resolvConf: %+v", d)
	}
	n = newFlannelNode(t, v4File(true), map[string]any{"ipam": map[string]any{"resolvConf": resolv},
		"delegate": map[string]any{"dns": map[string]any{"nameservers": []string{"10.96.0.10"}}}})
	if d := n.mustAdd(t, "p1").Result.DNS; len(d.Nameservers) != 1 || d.Nameservers[0] != "10.96.0.10" {
		t.Errorf("dns of the delegate: %+v", d)
	}
}

// TestFlannelStateFile: as "flannel", ADD writes <dataDir>/<containerID>
// with what Flannel's plugin would hand its delegate for the pod (the
// configuration plugintest.FlannelDelegate builds from Flannel's code), and DEL
// removes it; a failed ADD leaves none.
func TestFlannelStateFile(t *testing.T) {
	entry := map[string]any{"delegate": map[string]any{"hairpinMode": true, "isDefaultGateway": true},
		"ipam": map[string]any{"routes": []any{map[string]any{"dst": "192.168.9.0/24"}}}}
	f := v4File(true)
	n := newFlannelNode(t, f, entry)
	p := n.mustAdd(t, "p1")
	b, err := os.ReadFile(filepath.Join(n.state, "p1"))
	if err != nil {
		t.Fatalf("no state file: %v", err)
	}
	fl := map[string]any{"delegate": entry["delegate"], "ipam": map[string]any{"dataDir": n.e.dataDir}}
	want := plugintest.FlannelDelegate(fl, f)
	want["ipam"].(map[string]any)["routes"] = []map[string]string{{"dst": "192.168.9.0/24"}, {"dst": "10.244.0.0/16"}}
	want["name"], want["cniVersion"] = "cbr0", "1.0.0"
	var got, wantJSON any
	wb, _ := json.Marshal(want)
	json.Unmarshal(wb, &wantJSON)
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("state file is not JSON: %v: %s", err, b)
	}
	if gb, _ := json.Marshal(got); string(gb) != string(mustJSON(t, wantJSON)) {
		t.Errorf("state file\n%s\nwant\n%s", gb, mustJSON(t, wantJSON))
	}
	if err := n.node.Del(p); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(n.state, "p1")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("state file after DEL: %v", err)
	}
	if _, err := n.add(t, "bad", map[string]any{}, [][2]string{{"IP", "10.244.60.1"}}); err == nil {
		t.Fatal("ADD of an address outside the subnet succeeded")
	}
	if _, err := os.Stat(filepath.Join(n.state, "bad")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("state file after a failed ADD: %v", err)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
