package peers

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/weft-net/weft/internal/testkit/benchreport"
	"github.com/weft-net/weft/internal/testkit/kubetest"
	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/test/e2e"
	"github.com/weft-net/weft/vtep"
)

// BenchmarkPeersKube runs weftd --kube-subnet-mgr against a real
// kube-apiserver holding 5,000 peer Nodes (WEFT_BENCH_NODES: another
// count) with kubelet-sized status: start to all routes programmed, new
// Node to route, and the daemon's memory and CPU at rest and under churn
// (a Node change a second), as BenchmarkPeers5000 measures them. The
// flanneld of WEFT_BENCH_FLANNELD (--kube-subnet-mgr, on the same
// apiserver and Nodes) and the earlier weftd of WEFT_BENCH_BASE_WEFTD run
// in the same rounds, interleaved; WEFT_BENCH_REPORT writes the report's
// Kube<count> section, with a verdict for each goal of issue 40.
func BenchmarkPeersKube(b *testing.B) {
	peers := 5000
	if n, err := strconv.Atoi(os.Getenv("WEFT_BENCH_NODES")); err == nil && n > 0 {
		peers = n
	}
	k, cs := peerNodes(b, peers)
	netConf := filepath.Join(b.TempDir(), "net-conf.json")
	if err := os.WriteFile(netConf, []byte(config), 0o644); err != nil {
		b.Fatal(err)
	}
	bins := benchDaemons()
	cols := make([]column, len(bins))
	run := 0
	for i := 0; b.Loop(); i++ {
		for k2 := range bins {
			j := k2
			if i%2 == 1 { // alternate which goes first
				j = len(bins) - 1 - k2
			}
			run++
			r := kubeRound(b, k, cs, bins[j], netConf, peers, run)
			r.round = i + 1
			cols[j].rs = append(cols[j].rs, r)
			fmt.Printf("kube round %d %s: nodes=%d %s\n", i+1, bins[j].label, peers, r)
		}
	}
	for j, d := range bins {
		cols[j].label = d.name()
	}
	report(b, kubeSection(bins, cols, peers))
}

// kubeProbes is how many new Nodes each round times to their route.
const kubeProbes = 100

// The goals of issue 40 in Kubernetes mode; the figures are weftd's over
// flanneld's (CPU: weftd's minus flanneld's, which idles at about 0).
const (
	goalKubeStart = "start to all routes, flanneld's time over weftd's"
	goalKubeP50   = "new Node → route p50, weftd's over flanneld's"
	goalKubeAnon  = "anonymous memory at rest, weftd's over flanneld's"
	goalKubeCPU   = "CPU at rest, weftd's minus flanneld's"
)

var kubeGoals = []benchreport.Goal{
	{Name: goalKubeStart, Bound: 1, Unit: "×"},
	{Name: goalKubeP50, AtMost: true, Bound: 1, Unit: "×"},
	{Name: goalKubeAnon, AtMost: true, Bound: 1, Unit: "×"},
	{Name: goalKubeCPU, AtMost: true, Bound: 0, Unit: "% of a core"},
}

func kubeSection(bins []*daemon, cols []column, peers int) section {
	n := thousands(peers)
	var tail []string
	got := map[string]float64{}
	if f := cols[len(cols)-1]; bins[len(bins)-1].flanneld {
		w := cols[0]
		startup := func(r result) float64 { return r.startup.Seconds() }
		p50 := func(r result) float64 { return ms(r.p50) }
		anon := func(r result) float64 { return r.rest.anon }
		cpu := func(r result) float64 { return r.rest.cpu }
		got[goalKubeStart] = f.median(startup) / w.median(startup)
		got[goalKubeP50] = w.median(p50) / f.median(p50)
		got[goalKubeAnon] = w.median(anon) / f.median(anon)
		got[goalKubeCPU] = w.median(cpu) - f.median(cpu)
		tail = append(tail, fmt.Sprintf("With %s Nodes: start to all routes weftd %.2f s, flanneld %.2f s; new Node → route p50 %.1f vs %.1f ms; anonymous memory at rest %.1f vs %.1f MB; CPU at rest %.2f vs %.2f %% of a core. "+
			"Lease → route p99 in Kubernetes mode, with 200 probes a round, is in the LeaseRoute section.",
			n, w.median(startup), f.median(startup), w.median(p50), f.median(p50), w.median(anon), f.median(anon), w.median(cpu), f.median(cpu)))
	} else {
		tail = append(tail, "flanneld not run (WEFT_BENCH_FLANNELD unset).")
	}
	for _, v := range benchreport.Verdicts(kubeGoals, got) {
		tail = append(tail, "**"+v+"**")
	}
	return section{
		name: "Kube" + strconv.Itoa(peers),
		intro: []string{
			fmt.Sprintf("weftd `--kube-subnet-mgr` and flanneld `--kube-subnet-mgr` against a real kube-apiserver (test/kube/build.sh) holding %s peer Nodes with kubelet-sized status; each daemon on a Node of its own with a podCIDR, in a network namespace of its own with a kernel VXLAN device (weftd `weft.1`, flanneld `flannel.1`). "+
				"Start: from the node's creation to all %s routes. New Node → route: %d Nodes created one at a time, each timed until its route appears (deleted after the round).", n, n, kubeProbes),
			fmt.Sprintf("Memory and CPU as in the etcd section: sampled every %s, at rest over %s from %s after the last new Node, then under churn: %d Node changes, one a second (in turn: a new Node, an existing peer's public-ip and backend-data annotations moved to another address, the deletion of the Node added two seconds before).",
				human(sampleEvery), human(restSpan), human(restWait), churnChanges),
		},
		cols: cols,
		figs: slices.Concat([]figure{
			{fmt.Sprintf("start to all %s routes, s", n), 2, func(r result) float64 { return r.startup.Seconds() }},
			{"new Node → route p50, ms", 1, func(r result) float64 { return ms(r.p50) }},
			{fmt.Sprintf("new Node → route, the slowest of %d, ms", kubeProbes), 1, func(r result) float64 { return ms(r.max) }},
		}, memFigures, goFigures),
		perHdr: []string{"start s", "p50 ms", "slowest ms", "anon at rest MB (max)", "PSS at rest MB (max)",
			"anon under churn MB (max)", "PSS under churn MB (max)", "CPU at rest %", "CPU under churn %"},
		perRow: func(r result) []string {
			return []string{fmt.Sprintf("%.2f", r.startup.Seconds()), fmt.Sprintf("%.1f", ms(r.p50)), fmt.Sprintf("%.1f", ms(r.max)),
				fmt.Sprintf("%.1f (%.1f)", r.rest.anon, r.rest.anonMax), fmt.Sprintf("%.1f (%.1f)", r.rest.pss, r.rest.pssMax),
				fmt.Sprintf("%.1f (%.1f)", r.churn.anon, r.churn.anonMax), fmt.Sprintf("%.1f (%.1f)", r.churn.pss, r.churn.pssMax),
				fmt.Sprintf("%.2f", r.rest.cpu), fmt.Sprintf("%.2f", r.churn.cpu)}
		},
		tail: tail,
	}
}

// kubeMovedPub is the public address the churn of run gives peer Node i.
func kubeMovedPub(i, run int) netip.Addr {
	n := i + 1
	return netip.AddrFrom4([4]byte{100, byte(96 + run%32), byte(n >> 8), byte(n)})
}

// kubeRound measures d; run makes its own Node and the Nodes it adds
// differ from other rounds'.
func kubeRound(b *testing.B, k *kubetest.Cluster, cs kubernetes.Interface, d *daemon, netConf string, peers, run int) result {
	ctx := context.Background()
	self := fmt.Sprintf("self-%d", run)
	sn := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 200, byte(run), 0}), 24)
	// Annotated as a kubelet's Node is (flanneld writes into the map and
	// panics on a Node without annotations).
	if _, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: self,
		Annotations: map[string]string{"volumes.kubernetes.io/controller-managed-attach-detach": "true"}},
		Spec: corev1.NodeSpec{PodCIDR: sn.String(), PodCIDRs: []string{sn.String()}}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	var added []string // Nodes to delete after the round
	defer func() {
		for _, name := range append(added, self) {
			cs.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}) //nolint:errcheck // best effort between rounds
		}
	}()
	opts := e2e.Options{Nodes: 0, Config: config}
	if !d.flanneld {
		opts.Weftd = d.path
	}
	c := e2e.NewCluster(b, opts)
	defer func() { c.Client.Close(); c.Etcd.Close() }() // the daemons do not use it here
	apiserver := strings.TrimPrefix(k.Admin.Host, "https://")
	c.OnNode = func(n *e2e.Node) {
		nettest.ForwardLoopback(b, n, apiserver)
		if d.flanneld {
			n.Prog, n.OwnArgs, n.Env = d.path, true, []string{"NODE_NAME=" + self}
			n.Args = []string{"--kube-subnet-mgr", "--kubeconfig-file", k.Kubeconfig(), "--net-config-path", netConf,
				"--iface", "eth0", "--subnet-file", n.SubnetFile, "--iptables-forward-rules=false", "--ip-masq=false"}
		}
	}
	var r result
	r.loadStart = benchreport.LoadAvg("/")
	start := time.Now()
	node := c.AddNode("k1", "--kube-subnet-mgr", "--kubeconfig", k.Kubeconfig(), "--node-name", self, "--net-config-path", netConf)
	defer node.Stop()
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(5 * time.Millisecond) {
		if n := countRoutes(b, node.Handle, d.device()); n >= peers {
			r.startup = time.Since(start)
			break
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(node.LogFile)
			b.Fatalf("only %d routes after 3 minutes:\n%s", countRoutes(b, node.Handle, d.device()), tail(string(log), 30))
		}
	}
	d.waitReady(b, node)
	d.readVersion(node)
	lat := probeLatency(b, node, kubeProbes, func(i int) netip.Prefix {
		n := kubetest.PeerNode(max(peers, 5000) + kubeProbes*run + i)
		if _, err := cs.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		added = append(added, n.Name)
		return netip.MustParsePrefix(n.Spec.PodCIDR)
	})
	r.p50, r.p99, r.max = lat[len(lat)/2], lat[len(lat)*99/100], lat[len(lat)-1]
	time.Sleep(restWait) // a memory figure at rest, not a synchronisation
	r.rest = sample(b, node.PID(), restSpan, nil)
	r.gomem = readGoMem(node)
	routes := countRoutes(b, node.Handle, d.device())
	var moved int // the last peer the churn moved
	churned := func(i int) *corev1.Node { return kubetest.PeerNode(max(peers, 5000) + 15000 + 100*run + i/3) }
	r.churn = churn(b, node.PID(), func(i int) {
		var err error
		switch i % 3 {
		case 0:
			_, err = cs.CoreV1().Nodes().Create(ctx, churned(i), metav1.CreateOptions{})
		case 1:
			moved = (i / 3) % peers
			pub := kubeMovedPub(moved, run)
			bd, _ := json.Marshal(subnet.VXLANData{VNI: 1, VtepMAC: vtep.DeviceMAC(pub, 1)})
			patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
				"flannel.alpha.coreos.com/public-ip": pub.String(), "flannel.alpha.coreos.com/backend-data": string(bd)}}})
			_, err = cs.CoreV1().Nodes().Patch(ctx, kubetest.PeerNode(moved).Name, types.MergePatchType, patch, metav1.PatchOptions{})
		case 2:
			err = cs.CoreV1().Nodes().Delete(ctx, churned(i).Name, metav1.DeleteOptions{})
		}
		if err != nil {
			b.Fatal(err)
		}
	})
	psn, _ := fakePeer(moved) // kubetest.PeerNode(i) has fakePeer(i)'s subnet
	mac := vtep.DeviceMAC(kubeMovedPub(moved, run), 1)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		n := countRoutes(b, node.Handle, d.device())
		has := hasNeigh(node.Handle, d.device(), psn.Addr(), mac)
		if n == routes && has {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("after the churn: %d routes (before: %d), neighbour %s → %s: %v", n, routes, psn.Addr(), mac, has)
		}
	}
	r.loadEnd = benchreport.LoadAvg("/")
	return r
}

// peerNodes starts a kube-apiserver holding n peer Nodes (kubetest.PeerNode)
// and returns it with a client allowed to write fast.
func peerNodes(b *testing.B, n int) (*kubetest.Cluster, *kubernetes.Clientset) {
	k := kubetest.Start(b)
	fast := rest.CopyConfig(k.Admin)
	fast.QPS, fast.Burst = 500, 1000
	cs, err := kubernetes.NewForConfig(fast)
	if err != nil {
		b.Fatal(err)
	}
	var g errgroup.Group
	g.SetLimit(16)
	for i := range n {
		g.Go(func() error {
			_, err := cs.CoreV1().Nodes().Create(context.Background(), kubetest.PeerNode(i), metav1.CreateOptions{})
			return err
		})
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
	return k, cs
}
