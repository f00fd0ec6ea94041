package plugin_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/weft-net/weft/internal/namespace"
	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/internal/testkit/plugintest"
	"github.com/weft-net/weft/subnet"
)

// TestParallel: 50 concurrent ADDs on one node get 50 distinct addresses
// (and one masquerade rule between them); 50 concurrent DELs free them all
// and leave only the persistent files.
func TestParallel(t *testing.T) {
	const pods = 50
	f := v4File(false)
	e := newEnv(t, &f)
	n := e.newNode(t, plugintest.Options{})
	nss := make([]*nettest.NS, pods)
	for i := range nss {
		nss[i] = nettest.NewNS(t, fmt.Sprintf("p%d", i))
	}
	got := make([]*plugintest.Pod, pods)
	parallel(t, pods, func(i int) (err error) {
		got[i], err = n.Add(nss[i], fmt.Sprintf("pod-%d", i))
		return err
	})
	seen := map[netip.Addr]string{}
	for _, p := range got {
		if p == nil {
			t.FailNow()
		}
		if other, dup := seen[p.IP]; dup {
			t.Errorf("%s and %s both got %s", p.ID, other, p.IP)
		}
		seen[p.IP] = p.ID
	}
	if len(plugintest.StoreFiles(t, e.dataDir, "weft")) != pods || len(e.bridgePorts(t)) != pods {
		t.Errorf("store %d entries, %d bridge ports; want %d: %v", len(plugintest.StoreFiles(t, e.dataDir, "weft")), len(e.bridgePorts(t)), pods, e.bridgePorts(t))
	}
	ping(t, got[0].NS, got[pods-1].IP)
	if rules := nettest.MustRun(t, e.node, "nft", "list", "table", "ip", "weft-cni"); strings.Count(rules, "masquerade") != 1 {
		t.Errorf("want one masquerade rule after parallel ADDs:\n%s", rules)
	}
	parallel(t, pods, func(i int) error { return n.Del(got[i]) })
	if left := plugintest.StoreFiles(t, e.dataDir, "weft"); len(left) != 0 {
		t.Errorf("allocations left: %v", left)
	}
	if ports := e.bridgePorts(t); len(ports) != 0 {
		t.Errorf("veths left: %v", ports)
	}
	entries, _ := os.ReadDir(e.dataDir + "/weft")
	for _, d := range entries {
		if d.Name() != "lock" && d.Name() != "last_reserved_ip.0" {
			t.Errorf("unexpected file left in the store: %s", d.Name())
		}
	}
}

func parallel(t *testing.T, n int, f func(i int) error) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { errs[i] = f(i) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

// TestGC: pods whose runtime cache is lost leak their addresses; GC of the
// weft+portmap chain with the list of valid attachments releases exactly
// the others (and their veths), and the valid ones still pass CHECK.
func TestGC(t *testing.T) {
	f := v4File(true)
	e := newEnv(t, &f)
	pm := nettest.ReferencePlugins(t)
	n := e.newNode(t, plugintest.Options{Portmap: pm})
	keep1, stale, keep2 := n.AddPod(t, "keep1"), n.AddPod(t, "stale"), n.AddPod(t, "keep2")
	// A runtime that lost its cache knows nothing to DEL: only GC frees them.
	fresh := plugintest.NewNode(t, e.node, e.bin, e.subnetFile, plugintest.Options{DataDir: e.dataDir, Portmap: pm})
	valid := []types.GCAttachment{{ContainerID: keep1.ID, IfName: "eth0"}, {ContainerID: keep2.ID, IfName: "eth0"}}
	if err := fresh.CNI.GCNetworkList(context.Background(), fresh.List, &libcni.GCArgs{ValidAttachments: valid}); err != nil {
		t.Fatalf("GC: %v", err)
	}
	left := plugintest.StoreFiles(t, e.dataDir, "weft")
	if strings.Join(left, ",") != strings.Join(sortedAddrs(keep1.IP, keep2.IP), ",") {
		t.Errorf("store after GC %v, want %s and %s (stale %s released)", left, keep1.IP, keep2.IP, stale.IP)
	}
	if ports := e.bridgePorts(t); len(ports) != 2 {
		t.Errorf("bridge ports after GC: %v, want 2", ports)
	}
	if out := nettest.MustRun(t, stale.NS, "ip", "-o", "link"); strings.Contains(out, "eth0") {
		t.Errorf("stale pod still has eth0:\n%s", out)
	}
	for _, p := range []*plugintest.Pod{keep1, keep2} {
		if err := n.Check(p); err != nil {
			t.Errorf("CHECK %s after GC: %v", p.ID, err)
		}
	}
}

func sortedAddrs(a ...netip.Addr) []string {
	if a[1].Less(a[0]) {
		a[0], a[1] = a[1], a[0]
	}
	return []string{a[0].String(), a[1].String()}
}

// TestStatus: STATUS is "not available" (50) until the subnet file exists
// and parses, then succeeds.
func TestStatus(t *testing.T) {
	e := newEnv(t, nil)
	n := e.newNode(t, plugintest.Options{})
	status := func() error { return n.CNI.GetStatusNetworkList(context.Background(), n.List) }
	var ce *types.Error
	if err := status(); !errors.As(err, &ce) || ce.Code != types.ErrPluginNotAvailable {
		t.Fatalf("STATUS without a subnet file: %v, want code 50", err)
	}
	os.WriteFile(e.subnetFile, []byte("FLANNEL_NETWORK=10.244.0.0/16\n"), 0o644)
	if err := status(); !errors.As(err, &ce) || ce.Code != types.ErrPluginNotAvailable || !strings.Contains(ce.Msg, "FLANNEL_SUBNET") {
		t.Fatalf("STATUS with an incomplete file: %v, want code 50 naming the missing variable", err)
	}
	if err := subnet.WriteFile(e.subnetFile, v4File(true)); err != nil {
		t.Fatal(err)
	}
	if err := status(); err != nil {
		t.Fatalf("STATUS with the file: %v", err)
	}
}

// TestCheckDrift: CHECK reports a removed address or route with code 100
// and a vanished interface with code 3.
func TestCheckDrift(t *testing.T) {
	f := v4File(true)
	e := newEnv(t, &f)
	n := e.newNode(t, plugintest.Options{})
	cases := []struct {
		name  string
		sabot []string // run inside the pod
		code  uint
	}{
		{"address removed", []string{"ip", "addr", "flush", "dev", "eth0"}, 100},
		{"route removed", []string{"ip", "route", "del", "10.244.0.0/16"}, 100},
		{"interface gone", []string{"ip", "link", "del", "eth0"}, 3},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := n.AddPod(t, "drift")
			if err := n.Check(p); err != nil {
				t.Fatalf("CHECK before: %v", err)
			}
			nettest.MustRun(t, p.NS, c.sabot...)
			var ce *types.Error
			if err := n.Check(p); !errors.As(err, &ce) || ce.Code != c.code {
				t.Fatalf("CHECK after %s: %v, want code %d", c.name, err, c.code)
			}
		})
	}
}

// TestFlannelInterop: a subnet file exactly as flanneld writes it is read,
// and a cni0 left with an address of an older node subnet is repaired.
func TestFlannelInterop(t *testing.T) {
	e := newEnv(t, nil)
	flanneld := "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.59.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n"
	if err := os.WriteFile(e.subnetFile, []byte(flanneld), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := namespace.Bridge(e.node, "cni0"); err != nil {
		t.Fatal(err)
	}
	if err := namespace.AddAddr(e.node, "cni0", netip.MustParsePrefix("10.244.7.1/24")); err != nil {
		t.Fatal(err)
	}
	n := e.newNode(t, plugintest.Options{})
	a := n.AddPod(t, "a")
	addrs := nettest.MustRun(t, e.node, "ip", "-4", "-o", "addr", "show", "dev", "cni0")
	if !strings.Contains(addrs, "10.244.59.1/24") || strings.Contains(addrs, "10.244.7.1") {
		t.Errorf("cni0 addresses after ADD:\n%s", addrs)
	}
	if !netip.MustParsePrefix("10.244.59.0/24").Contains(a.IP) {
		t.Errorf("pod address %s", a.IP)
	}
	ping(t, a.NS, netip.MustParseAddr("10.244.59.1"))
	if mtu := nettest.MustRun(t, a.NS, "cat", "/sys/class/net/eth0/mtu"); strings.TrimSpace(mtu) != "1450" {
		t.Errorf("pod MTU %s, want 1450", mtu)
	}
}

// TestMTUOverride: "mtu" in the config wins over FLANNEL_MTU; hairpin
// mode can be turned off.
func TestMTUOverride(t *testing.T) {
	f := v4File(true)
	e := newEnv(t, &f)
	a := e.newNode(t, plugintest.Options{MTU: 1400, Extra: map[string]any{"hairpinMode": false}}).AddPod(t, "a")
	if out := nettest.MustRun(t, e.node, "ip", "-d", "link", "show", a.Result.Interfaces[1].Name); !strings.Contains(out, "hairpin off") {
		t.Errorf("host veth with hairpin though hairpinMode is false:\n%s", out)
	}
	if mtu := nettest.MustRun(t, a.NS, "cat", "/sys/class/net/eth0/mtu"); strings.TrimSpace(mtu) != "1400" {
		t.Errorf("pod MTU %s, want 1400", mtu)
	}
}

// TestPlugintestAddPod: the one-call helper gives pods on one node distinct
// addresses from one store, and they reach each other.
func TestPlugintestAddPod(t *testing.T) {
	f := v4File(true)
	e := newEnv(t, &f)
	a, ipA := plugintest.AddPod(t, e.node, e.bin, e.subnetFile, "a")
	_, ipB := plugintest.AddPod(t, e.node, e.bin, e.subnetFile, "b")
	if ipA == ipB || !f.Subnet.Masked().Contains(ipA) {
		t.Fatalf("addresses %s, %s", ipA, ipB)
	}
	ping(t, a, ipB)
}
