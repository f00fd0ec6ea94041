package e2e

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

	"github.com/weft-net/weft/internal/testkit/kubetest"
	"github.com/weft-net/weft/internal/testkit/nettest"
)

// ipv6OnlyConfig is an IPv6-only network: no IPv4 network at all.
const ipv6OnlyConfig = `{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd00:10:244::/56","Backend":{"Type":"vxlan"}}`

// TestIPv6Only runs an IPv6-only cluster (etcd mode) on an IPv6-only
// underlay, on vxlan and uvxlan: each pod gets an IPv6 address only, and
// TCP crosses between pods on the two nodes both ways.
func TestIPv6Only(t *testing.T) {
	for _, backend := range []string{"vxlan", "uvxlan"} {
		t.Run(backend, func(t *testing.T) {
			c := NewCluster(t, Options{Nodes: 0, UnderlayV6: netip.MustParsePrefix("fd77::/64"), Config: ipv6OnlyConfig})
			c.OnNode = func(n *Node) { ipv6OnlyUnderlay(t, n.NS) }
			var args []string
			if backend == "uvxlan" {
				args = []string{"--backend", "uvxlan"}
			}
			n1, n2 := c.AddNode("n1", args...), c.AddNode("n2", args...)
			n1.WaitReady()
			n2.WaitReady()
			// uvxlan's one TAP has the plain name; kernel vxlan names its
			// IPv6 device apart.
			dev, absent := "weft-v6.1", device
			if backend == "uvxlan" {
				dev, absent = "weft-u.1", "weft-u6.1"
			}
			checkOverlayDevices(t, n1, dev, absent)
			checkIPv6OnlyPods(t, n1, n2)
		})
	}
}

// checkOverlayDevices checks that n has the overlay device dev with the
// IPv6 overlay's MTU (1500 less 70 bytes of IPv6 VXLAN headers) and no
// device absent.
func checkOverlayDevices(t *testing.T, n *Node, dev, absent string) {
	t.Helper()
	links := nettest.MustRun(t, n, "ip", "-o", "link", "show")
	if !strings.Contains(links, " "+dev+": ") ||
		strings.Contains(links, " "+absent+": ") || !strings.Contains(nettest.MustRun(t, n, "ip", "link", "show", dev), " mtu 1430 ") {
		t.Errorf("%s: want the IPv6 overlay device %s with MTU 1430 and no %s:\n%s", n.Label, dev, absent, links)
	}
}

// ipv6OnlyUnderlay takes the IPv4 address and routes off a host's eth0, so
// that its underlay is IPv6 only.
func ipv6OnlyUnderlay(t *testing.T, ns *nettest.NS) {
	t.Helper()
	nettest.MustRun(t, ns, "ip", "-4", "addr", "flush", "dev", "eth0")
	nettest.MustRun(t, ns, "ip", "-6", "route", "add", "default", "via", "fd77::ffff", "dev", "eth0", "onlink")
}

// checkIPv6OnlyPods adds a pod on each node, checks that each has an IPv6
// address and no IPv4 one, and sends TCP between them both ways.
func checkIPv6OnlyPods(t *testing.T, n1, n2 *Node) {
	t.Helper()
	a, b := n1.CNI.AddPod(t, "a"), n2.CNI.AddPod(t, "b")
	for _, p := range []struct {
		name string
		ns   *nettest.NS
	}{{"a", a.NS}, {"b", b.NS}} {
		if out := nettest.MustRun(t, p.ns, "ip", "-4", "-o", "addr", "show", "dev", "eth0"); strings.TrimSpace(out) != "" {
			t.Errorf("pod %s has an IPv4 address on an IPv6-only network:\n%s", p.name, out)
		}
	}
	a6, b6 := podIPv6(t, a), podIPv6(t, b)
	for _, d := range []struct {
		name string
		src  *nettest.NS
		dst  *nettest.NS
		ip   netip.Addr
	}{{"n1 → n2", a.NS, b.NS, b6}, {"n2 → n1", b.NS, a.NS, a6}} {
		// A new pod's address is usable once duplicate address detection
		// is over.
		Eventually(t, 10*time.Second, d.name+" ping", func() error { return Ping(d.src, d.ip, "-W", "1") })
		rate, err := Transfer(d.src, d.dst, d.ip, 10<<20)
		if err != nil {
			t.Fatalf("TCP %s: %v", d.name, err)
		}
		t.Logf("TCP %s: 10 MiB at %.2f Gb/s", d.name, rate*8/1e9)
	}
}

// TestIPv6OnlyKubernetes runs the IPv6-only cluster of TestIPv6Only in
// Kubernetes mode against a real kube-apiserver, as the ServiceAccount of
// kube-manifests/ under its RBAC: each Node has an IPv6 podCIDR only.
func TestIPv6OnlyKubernetes(t *testing.T) {
	k := kubetest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	applyManifests(ctx, t, k)
	kubeconfig := saKubeconfig(ctx, t, k, "kube-weft", "weft")
	for _, backend := range []string{"vxlan", "uvxlan"} {
		t.Run(backend, func(t *testing.T) {
			netConf := filepath.Join(t.TempDir(), "net-conf.json")
			if err := os.WriteFile(netConf, []byte(ipv6OnlyConfig), 0o644); err != nil {
				t.Fatal(err)
			}
			c := NewCluster(t, Options{Nodes: 0, UnderlayV6: netip.MustParsePrefix("fd77::/64")})
			apiserver := strings.TrimPrefix(k.Admin.Host, "https://")
			c.OnNode = func(n *Node) {
				ipv6OnlyUnderlay(t, n.NS)
				nettest.ForwardLoopback(t, n, apiserver)
			}
			var nodes []*Node
			for i, name := range []string{backend + "-n1", backend + "-n2"} {
				cidr := fmt.Sprintf("fd00:10:244:%x::/64", 0x10*(map[string]int{"vxlan": 1, "uvxlan": 2}[backend])+i)
				createNodeWithCIDR(ctx, t, k, name, cidr)
				args := []string{"--kube-subnet-mgr", "--kubeconfig", kubeconfig, "--node-name", name, "--net-config-path", netConf}
				if backend == "uvxlan" {
					args = append(args, "--backend", "uvxlan")
				}
				nodes = append(nodes, c.AddNode(fmt.Sprintf("n%d", i+1), args...))
			}
			for _, n := range nodes {
				n.WaitReady()
			}
			dev, absent := "weft-v6.1", device
			if backend == "uvxlan" {
				dev, absent = "weft-u.1", "weft-u6.1"
			}
			checkOverlayDevices(t, nodes[0], dev, absent)
			node, err := k.Client.CoreV1().Nodes().Get(ctx, backend+"-n1", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			const p = "flannel.alpha.coreos.com/"
			if node.Annotations[p+"public-ipv6"] != ipv6Of(t, nodes[0]).String() || node.Annotations[p+"public-ip"] != "" {
				t.Errorf("n1's annotations: %v, want public-ipv6 %s and no public-ip", node.Annotations, ipv6Of(t, nodes[0]))
			}
			checkIPv6OnlyPods(t, nodes[0], nodes[1])
		})
	}
}

// createNodeWithCIDR creates the Node name with the one podCIDR cidr.
func createNodeWithCIDR(ctx context.Context, t *testing.T, k *kubetest.Cluster, name, cidr string) {
	t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{PodCIDR: cidr, PodCIDRs: []string{cidr}}}
	if _, err := k.Client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}
