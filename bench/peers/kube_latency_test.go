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

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/weft-net/weft/internal/testkit/kubetest"
	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/test/e2e"
)

// kubeLatency leases from a real kube-apiserver holding the peers as Nodes
// (kubetest.PeerNode: kubelet-sized, annotated as Flannel's kube subnet
// manager leaves them): weftd --kube-subnet-mgr and flanneld
// --kube-subnet-mgr alike, each on a Node of its own with a podCIDR. Each
// peer count has an apiserver of its own, started on first use; a new peer
// is a Node created (and deleted after the round).
type kubeLatency struct {
	netConf  string
	clusters map[int]*kubeSet
	run      int // numbers each measurement's own Node
}

// kubeSet is one apiserver and its client.
type kubeSet struct {
	k  *kubetest.Cluster
	cs kubernetes.Interface
}

// newKubeLatency fails when the kube-apiserver is not built.
func newKubeLatency(b *testing.B) (*kubeLatency, error) {
	if _, err := kubetest.BinDir(); err != nil {
		return nil, err
	}
	netConf := filepath.Join(b.TempDir(), "net-conf.json")
	if err := os.WriteFile(netConf, []byte(config), 0o644); err != nil {
		return nil, err
	}
	return &kubeLatency{netConf: netConf, clusters: map[int]*kubeSet{}}, nil
}

func (*kubeLatency) name() string        { return "kube" }
func (*kubeLatency) runs(d *daemon) bool { return true }

// cluster returns the apiserver holding n peer Nodes.
func (m *kubeLatency) cluster(b *testing.B, n int) *kubeSet {
	if s := m.clusters[n]; s != nil {
		return s
	}
	k, cs := peerNodes(b, n)
	s := &kubeSet{k: k, cs: cs}
	m.clusters[n] = s
	return s
}

func (m *kubeLatency) measure(b *testing.B, d *daemon, n, probes int) []time.Duration {
	s := m.cluster(b, n)
	ctx := context.Background()
	m.run++
	self := fmt.Sprintf("self-%d", m.run)
	sn := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 200, byte(m.run), 0}), 24)
	nodes := s.cs.CoreV1().Nodes()
	// Annotated as a kubelet's Node is (flanneld writes into the map and
	// panics on a Node without annotations).
	if _, err := nodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: self,
		Annotations: map[string]string{"volumes.kubernetes.io/controller-managed-attach-detach": "true"}},
		Spec: corev1.NodeSpec{PodCIDR: sn.String(), PodCIDRs: []string{sn.String()}}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	added := []string{self} // Nodes to delete after the round
	defer func() {
		for _, name := range added {
			nodes.Delete(ctx, name, metav1.DeleteOptions{}) //nolint:errcheck // best effort between rounds
		}
	}()
	opts := e2e.Options{Nodes: 0, Config: config}
	if !d.flanneld {
		opts.Weftd = d.path
	}
	c := e2e.NewCluster(b, opts)
	defer func() { c.Client.Close(); c.Etcd.Close() }() // the daemons do not use it here
	apiserver := strings.TrimPrefix(s.k.Admin.Host, "https://")
	c.OnNode = func(nd *e2e.Node) {
		nettest.ForwardLoopback(b, nd, apiserver)
		if d.flanneld {
			nd.Prog, nd.OwnArgs, nd.Env = d.path, true, []string{"NODE_NAME=" + self}
			nd.Args = []string{"--kube-subnet-mgr", "--kubeconfig-file", s.k.Kubeconfig(), "--net-config-path", m.netConf,
				"--iface", "eth0", "--subnet-file", nd.SubnetFile, "--iptables-forward-rules=false", "--ip-masq=false"}
		}
	}
	node := c.AddNode("k1", "--kube-subnet-mgr", "--kubeconfig", s.k.Kubeconfig(), "--node-name", self, "--net-config-path", m.netConf)
	defer node.Stop()
	waitRoutes(b, node, d.device(), n)
	d.waitReady(b, node)
	d.readVersion(node)
	first := 6000 + 250*m.run // probe Nodes of no other round (subnets far below 10.200.0.0/16)
	return probeLatency(b, node, probes, func(i int) netip.Prefix {
		pn := kubetest.PeerNode(first + i)
		if _, err := nodes.Create(ctx, pn, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		added = append(added, pn.Name)
		return netip.MustParsePrefix(pn.Spec.PodCIDR)
	})
}
