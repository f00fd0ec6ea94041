package cni

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/vishvananda/netlink"
	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/internal/testkit/plugintest"
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

// cycle runs one ADD and one DEL and adds their wall time to s.busy. Each
// plugin's DEL returns once the veth pair is deleted, so the cycle holds
// the kernel's deletion and nothing of it runs into the next cycle.
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

// flannelSide is Flannel's own chain, flannel → bridge → host-local, with
// the delegate options of kube-flannel.yml, when WEFT_BENCH_FLANNEL_CNI
// names a built flannel CNI plugin (github.com/flannel-io/cni-plugin; it is
// not served by the Go module proxy, so the benchmark cannot fetch it).
func flannelSide(b *testing.B) *side {
	bin := os.Getenv("WEFT_BENCH_FLANNEL_CNI")
	if bin == "" {
		return nil
	}
	if _, err := os.Stat(bin); err != nil {
		b.Fatalf("WEFT_BENCH_FLANNEL_CNI: %v", err)
	}
	node := nettest.NewNS(b, "bfl")
	sf := filepath.Join(b.TempDir(), "subnet.env")
	if err := subnet.WriteFile(sf, file); err != nil {
		b.Fatal(err)
	}
	// libcni looks plugins up by type: link the binary in as "flannel".
	dir := b.TempDir()
	if err := os.Symlink(bin, filepath.Join(dir, "flannel")); err != nil {
		b.Fatal(err)
	}
	conf := map[string]any{
		"cniVersion": "1.0.0", "name": "cbr0",
		"plugins": []any{map[string]any{
			"type": "flannel", "subnetFile": sf, "dataDir": b.TempDir(),
			"delegate": map[string]any{"hairpinMode": true, "isDefaultGateway": true},
			"ipam":     map[string]any{"dataDir": b.TempDir()}, // host-local, kept out of /var/lib
		}},
	}
	raw, _ := json.Marshal(conf)
	list, err := libcni.NetworkConfFromBytes(raw)
	if err != nil {
		b.Fatal(err)
	}
	exec := &plugintest.NSExec{RawExec: invoke.RawExec{Stderr: io.Discard}, NS: node}
	cni := libcni.NewCNIConfigWithCacheDir([]string{dir, nettest.ReferencePlugins(b)}, b.TempDir(), exec)
	return &side{cni: cni, list: list, pod: nettest.NewNS(b, "bflpod")}
}

// BenchmarkAddDel interleaves ADD+DEL cycles of weft and of the reference
// chain, one of each per iteration, and reports both rates and their ratio.
func BenchmarkAddDel(b *testing.B) {
	nettest.RequireRoot(b)
	weft, ref := weftSide(b), refSide(b)
	sides := []*side{weft, ref}
	if fl := flannelSide(b); fl != nil {
		sides = append(sides, fl)
	}
	for _, s := range sides {
		s.cycle(b) // warm up: bridge creation, page cache
		s.n, s.busy, s.add = 0, 0, 0
	}
	b.ResetTimer()
	for b.Loop() {
		for _, s := range sides {
			s.cycle(b)
		}
	}
	create, del := vethFloor(b)
	b.ReportMetric(weft.rate(), "weft-cycles/s")
	b.ReportMetric(ref.rate(), "ref-cycles/s")
	b.ReportMetric(weft.rate()/ref.rate(), "ratio")
	b.Logf("%d cycles each: weft %.1f ADD+DEL/s, bridge+host-local %.1f ADD+DEL/s, ratio %.2fx",
		weft.n, weft.rate(), ref.rate(), weft.rate()/ref.rate())
	if len(sides) > 2 {
		fl := sides[2]
		b.ReportMetric(fl.rate(), "flannel-cycles/s")
		b.ReportMetric(weft.rate()/fl.rate(), "flannel-ratio")
		b.Logf("flannel → bridge → host-local %.1f ADD+DEL/s, weft %.2fx that", fl.rate(), weft.rate()/fl.rate())
	}
	for _, s := range sides {
		b.Logf("%s: mean ADD %v, mean DEL %v", s.list.Name, s.add/time.Duration(s.n), (s.busy-s.add)/time.Duration(s.n))
	}
	b.Logf("kernel floor: veth pair create %v, delete %v (the delete waits in rcu_barrier)", create, del)
	for _, s := range sides {
		cycle := s.busy / time.Duration(s.n)
		b.Logf("%s: the kernel's veth work is %.0f%% of its %v ADD+DEL cycle", s.list.Name,
			100*(create+del).Seconds()/cycle.Seconds(), cycle)
	}
}

// vethFloor measures what the kernel alone takes to create and to delete a
// veth pair in a test namespace: costs every ADD+DEL cycle pays.
func vethFloor(b *testing.B) (create, del time.Duration) {
	n := nettest.NewNS(b, "bf")
	const rounds = 10
	for i := range rounds {
		la := netlink.NewLinkAttrs()
		la.Name = fmt.Sprintf("fl%d", i)
		v := &netlink.Veth{LinkAttrs: la, PeerName: fmt.Sprintf("fp%d", i)}
		start := time.Now()
		if err := n.Handle.LinkAdd(v); err != nil {
			b.Fatal(err)
		}
		mid := time.Now()
		if err := n.Handle.LinkDel(v); err != nil {
			b.Fatal(err)
		}
		create, del = create+mid.Sub(start), del+time.Since(mid)
	}
	return create / rounds, del / rounds
}
