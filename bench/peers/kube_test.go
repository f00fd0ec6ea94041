package peers

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/weft-net/weft/internal/testkit/kubetest"
	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/test/e2e"
)

// BenchmarkPeersKube1000 runs weftd --kube-subnet-mgr against a real
// kube-apiserver holding 1,000 peer Nodes (with kubelet-sized status):
// start to all routes programmed, new Node to route, and the daemon's
// memory. WEFT_BENCH_BASE_WEFTD interleaves an earlier build as for
// BenchmarkPeers5000.
func BenchmarkPeersKube1000(b *testing.B) {
	const peers = 1000
	k := kubetest.Start(b)
	ctx := context.Background()
	fast := rest.CopyConfig(k.Admin)
	fast.QPS, fast.Burst = 500, 1000
	cs, err := kubernetes.NewForConfig(fast)
	if err != nil {
		b.Fatal(err)
	}
	var g errgroup.Group
	g.SetLimit(16)
	for i := range peers {
		g.Go(func() error {
			_, err := cs.CoreV1().Nodes().Create(ctx, kubetest.PeerNode(i), metav1.CreateOptions{})
			return err
		})
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
	netConf := filepath.Join(b.TempDir(), "net-conf.json")
	if err := os.WriteFile(netConf, []byte(config), 0o644); err != nil {
		b.Fatal(err)
	}
	bins := []struct{ label, path string }{{"this tree", ""}}
	if base := os.Getenv("WEFT_BENCH_BASE_WEFTD"); base != "" {
		bins = append(bins, struct{ label, path string }{"base " + base, base})
	}
	round := 0
	for range b.N {
		for _, bin := range bins {
			round++
			r := kubeRound(b, k, cs, bin.path, netConf, round)
			fmt.Printf("kube round %d %s: nodes=%d %s\n", round, bin.label, peers, r)
		}
	}
}

func kubeRound(b *testing.B, k *kubetest.Cluster, cs kubernetes.Interface, weftd, netConf string, round int) string {
	ctx := context.Background()
	self := fmt.Sprintf("self-%d", round)
	sn := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 200, byte(round), 0}), 24)
	if _, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: self},
		Spec: corev1.NodeSpec{PodCIDR: sn.String(), PodCIDRs: []string{sn.String()}}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	defer cs.CoreV1().Nodes().Delete(ctx, self, metav1.DeleteOptions{}) //nolint:errcheck // best effort between rounds
	c := e2e.NewCluster(b, e2e.Options{Nodes: 0, Config: config, Weftd: weftd})
	apiserver := strings.TrimPrefix(k.Admin.Host, "https://")
	c.OnNode = func(n *e2e.Node) { nettest.ForwardLoopback(b, n, apiserver) }
	load := loadAvg()
	start := time.Now()
	node := c.AddNode("k1", "--kube-subnet-mgr", "--kubeconfig", k.Kubeconfig(), "--node-name", self, "--net-config-path", netConf)
	defer node.Stop()
	var startup time.Duration
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(5 * time.Millisecond) {
		if n := countRoutes(b, node.Handle, "weft.1"); n >= 1000 {
			startup = time.Since(start)
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("only %d routes after 3 minutes", countRoutes(b, node.Handle, "weft.1"))
		}
	}
	node.WaitReady()
	lat := probeLatency(b, node, 50, func(i int) netip.Prefix {
		n := kubetest.PeerNode(5000 + 100*round + i)
		if _, err := cs.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		return netip.MustParsePrefix(n.Spec.PodCIDR)
	})
	anon, file := rssOf(b, node)
	time.Sleep(restWait) // a memory figure at rest, not a synchronisation
	restAnon, restFile, restMax := rssOver(b, node, restSpan)
	return fmt.Sprintf("startup_to_all_programmed=%s new_node_to_route p50=%s p99=%s weftd_rss anon=%.1fMB file=%.1fMB total=%.1fMB "+
		"(at rest, from %s later, over %s: mean anon=%.1fMB file=%.1fMB total=%.1fMB, most %.1fMB) load=%s",
		startup.Round(time.Millisecond), lat[len(lat)/2].Round(time.Microsecond), lat[len(lat)*99/100].Round(time.Microsecond),
		anon, file, anon+file, restWait, restSpan, restAnon, restFile, restAnon+restFile, restMax, load)
}
