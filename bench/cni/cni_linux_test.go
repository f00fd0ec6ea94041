package cni

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/vishvananda/netlink"
	"github.com/weft-net/weft/internal/nettest"
	"github.com/weft-net/weft/plugin/plugintest"
	"github.com/weft-net/weft/subnet"
)

// side is one plugin chain on its own node namespace with one pod namespace
// that is attached and detached over and over.
type side struct {
	cni  *libcni.CNIConfig
	list *libcni.NetworkConfigList
	pod  *nettest.NS
	n    int
	busy time.Duration
	add  time.Duration // the ADD part of busy
}

// cycle runs one ADD and one DEL and adds their wall time to s.busy.
func (s *side) cycle(b *testing.B) {
	s.n++
	rt := &libcni.RuntimeConf{ContainerID: fmt.Sprintf("bench-%d", s.n), NetNS: s.pod.Path, IfName: "eth0"}
	start := time.Now()
	if _, err := s.cni.AddNetworkList(context.Background(), s.list, rt); err != nil {
		b.Fatalf("ADD %s: %v", s.list.Name, err)
	}
	s.add += time.Since(start)
	if err := s.cni.DelNetworkList(context.Background(), s.list, rt); err != nil {
		b.Fatalf("DEL %s: %v", s.list.Name, err)
	}
	s.busy += time.Since(start)
}

func (s *side) rate() float64 { return float64(s.n) / s.busy.Seconds() }

var file = subnet.File{
	Network: netip.MustParsePrefix("10.244.0.0/16"),
	Subnet:  netip.MustParsePrefix("10.244.59.1/24"),
	MTU:     1450, IPMasq: true,
}

func weftSide(b *testing.B) *side {
	node := nettest.NewNS(b, "bw")
	sf := filepath.Join(b.TempDir(), "subnet.env")
	if err := subnet.WriteFile(sf, file); err != nil {
		b.Fatal(err)
	}
	n := plugintest.NewNode(b, node, nettest.Binary(b, "weft"), sf, plugintest.Options{Name: "weft", CNIVersion: "1.0.0"})
	return &side{cni: n.CNI, list: n.List, pod: nettest.NewNS(b, "bwpod")}
}

// refSide is what Flannel's plugin delegates to for this subnet file.
func refSide(b *testing.B) *side {
	node := nettest.NewNS(b, "br")
	conf := map[string]any{
		"cniVersion": "1.0.0", "name": "ref",
		"plugins": []any{map[string]any{
			"type": "bridge", "bridge": "cni0", "isGateway": true, "isDefaultGateway": true,
			"ipMasq": !file.IPMasq, "mtu": file.MTU, "hairpinMode": true,
			"ipam": map[string]any{
				"type": "host-local", "dataDir": b.TempDir(),
				"ranges": [][]map[string]string{{{"subnet": file.Subnet.Masked().String()}}},
				"routes": []map[string]string{{"dst": file.Network.String()}},
			},
		}},
	}
	raw, _ := json.Marshal(conf)
	list, err := libcni.NetworkConfFromBytes(raw)
	if err != nil {
		b.Fatal(err)
	}
	exec := &plugintest.NSExec{RawExec: invoke.RawExec{Stderr: os.Stderr}, NS: node}
	cni := libcni.NewCNIConfigWithCacheDir([]string{nettest.ReferencePlugins(b)}, b.TempDir(), exec)
	return &side{cni: cni, list: list, pod: nettest.NewNS(b, "brpod")}
}

// BenchmarkAddDel interleaves ADD+DEL cycles of weft and of the reference
// chain, one of each per iteration, and reports both rates and their ratio.
func BenchmarkAddDel(b *testing.B) {
	nettest.RequireRoot(b)
	weft, ref := weftSide(b), refSide(b)
	weft.cycle(b) // warm up: bridge creation, page cache
	ref.cycle(b)
	weft.n, weft.busy, weft.add, ref.n, ref.busy, ref.add = 0, 0, 0, 0, 0, 0
	b.ResetTimer()
	for b.Loop() {
		weft.cycle(b)
		ref.cycle(b)
	}
	floor := vethFloor(b)
	b.ReportMetric(weft.rate(), "weft-cycles/s")
	b.ReportMetric(ref.rate(), "ref-cycles/s")
	b.ReportMetric(weft.rate()/ref.rate(), "ratio")
	b.Logf("%d cycles each: weft %.1f ADD+DEL/s, bridge+host-local %.1f ADD+DEL/s, ratio %.2fx",
		weft.n, weft.rate(), ref.rate(), weft.rate()/ref.rate())
	for _, s := range []*side{weft, ref} {
		b.Logf("%s: mean ADD %v, mean DEL %v", s.list.Name, s.add/time.Duration(s.n), (s.busy-s.add)/time.Duration(s.n))
	}
	b.Logf("kernel floor shared by both: veth pair create+delete %v (the delete waits in rcu_barrier)", floor)
	for _, s := range []*side{weft, ref} {
		cycle := s.busy / time.Duration(s.n)
		b.Logf("%s: the kernel's veth create+delete is %.0f%% of its %v ADD+DEL cycle", s.list.Name,
			100*floor.Seconds()/cycle.Seconds(), cycle)
	}
}

// vethFloor measures what the kernel alone takes to create and delete a
// veth pair in a test namespace: a cost every ADD+DEL cycle pays.
func vethFloor(b *testing.B) time.Duration {
	n := nettest.NewNS(b, "bf")
	const rounds = 10
	start := time.Now()
	for i := range rounds {
		la := netlink.NewLinkAttrs()
		la.Name = fmt.Sprintf("fl%d", i)
		v := &netlink.Veth{LinkAttrs: la, PeerName: fmt.Sprintf("fp%d", i)}
		if err := n.Handle.LinkAdd(v); err != nil {
			b.Fatal(err)
		}
		if err := n.Handle.LinkDel(v); err != nil {
			b.Fatal(err)
		}
	}
	return time.Since(start) / rounds
}
