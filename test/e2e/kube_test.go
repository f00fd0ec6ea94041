package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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

// TestKubernetesMode runs weftd --kube-subnet-mgr on node namespaces against
// a real kube-apiserver, as the ServiceAccount of kube-manifests/ under its
// RBAC, with podCIDRs assigned by kube-controller-manager.
func TestKubernetesMode(t *testing.T) {
	k := kubetest.Start(t)
	k.StartControllerManager(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	netConf := applyManifests(ctx, t, k)
	kubeconfig := saKubeconfig(ctx, t, k, "kube-weft", "weft")

	c := NewCluster(t, Options{Nodes: 0})
	apiserver := strings.TrimPrefix(k.Admin.Host, "https://")
	c.OnNode = func(n *Node) { nettest.ForwardLoopback(t, n, apiserver) }
	kubeArgs := func(name string) []string {
		return []string{"--kube-subnet-mgr", "--kubeconfig", kubeconfig, "--node-name", name, "--net-config-path", netConf}
	}
	// n3's weftd starts before its Node exists: it waits, then comes up.
	n3 := c.AddNode("n3", kubeArgs("n3")...)
	for _, name := range []string{"n1", "n2"} {
		createNode(ctx, t, k, name)
	}
	n1, n2 := c.AddNode("n1", kubeArgs("n1")...), c.AddNode("n2", kubeArgs("n2")...)
	n1.WaitReady()
	n2.WaitReady()
	// n3's weftd must be waiting for its Node before the Node appears.
	Eventually(t, 30*time.Second, "n3's weftd waiting for its Node", func() error {
		if log, _ := os.ReadFile(n3.LogFile); !strings.Contains(string(log), "retrying") {
			return errors.New("not yet")
		}
		return nil
	})
	createNode(ctx, t, k, "n3")
	n3.WaitReady()

	a, b := n1.CNI.AddPod(t, "a"), n3.CNI.AddPod(t, "b")
	Eventually(t, 5*time.Second, "pod on n1 → pod on n3", func() error { return Ping(a.NS, b.IP) })
	if err := Ping(b.NS, a.IP); err != nil {
		t.Errorf("pod on n3 → pod on n1: %v", err)
	}

	for _, n := range []*Node{n1, n2, n3} {
		node, err := k.Client.CoreV1().Nodes().Get(ctx, n.Label, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := n.Subnet().String(); got != node.Spec.PodCIDR {
			t.Errorf("%s: subnet file says %s, podCIDR is %s", n.Label, got, node.Spec.PodCIDR)
		}
		checkAnnotations(t, n, node)
	}

	gone := n2.Subnet()
	if err := k.Client.CoreV1().Nodes().Delete(ctx, "n2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	took := Eventually(t, 2*time.Second, "n2's subnet gone from n1's kernel", func() error {
		if strings.Contains(nettest.MustRun(t, n1, "ip", "route", "show", "dev", device), gone.String()) {
			return fmt.Errorf("route to %s still there", gone)
		}
		return nil
	})
	t.Logf("Node deleted → peer state gone on n1 in %s", took.Round(time.Millisecond))
	if log, _ := os.ReadFile(n3.LogFile); !strings.Contains(string(log), "retrying") {
		t.Errorf("n3's weftd did not say it was waiting for its Node:\n%s", tail(string(log), 20))
	}
}

func checkAnnotations(t *testing.T, n *Node, node *corev1.Node) {
	t.Helper()
	const p = "flannel.alpha.coreos.com/"
	ann := node.Annotations
	var data struct {
		VNI     int
		VtepMAC string
	}
	if err := json.Unmarshal([]byte(ann[p+"backend-data"]), &data); err != nil {
		t.Errorf("%s: backend-data %q: %v", n.Label, ann[p+"backend-data"], err)
	}
	if ann[p+"backend-type"] != "vxlan" || ann[p+"public-ip"] != n.Addr.String() ||
		ann[p+"kube-subnet-manager"] != "true" || data.VNI != 1 || data.VtepMAC != linkMAC(t, n) {
		t.Errorf("%s: annotations %v", n.Label, ann)
	}
	ok := false
	for _, c := range node.Status.Conditions {
		ok = ok || c.Type == corev1.NodeNetworkUnavailable && c.Status == corev1.ConditionFalse
	}
	if !ok {
		t.Errorf("%s: no NetworkUnavailable=False condition: %+v", n.Label, node.Status.Conditions)
	}
}

func createNode(ctx context.Context, t *testing.T, k *kubetest.Cluster, name string) {
	t.Helper()
	if _, err := k.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// applyManifests creates every object of kube-manifests/kube-weft.yml,
// with strict field validation, and returns a file with the net-conf.json
// of its ConfigMap.
func applyManifests(ctx context.Context, t *testing.T, k *kubetest.Cluster) string {
	t.Helper()
	objs := applyStrict(ctx, t, k, filepath.Join(ModuleRootDir(t), "kube-manifests", "kube-weft.yml"))
	var cm corev1.ConfigMap
	fromObjs(t, objs, "ConfigMap", &cm)
	netConf := filepath.Join(t.TempDir(), "net-conf.json")
	if err := os.WriteFile(netConf, []byte(cm.Data["net-conf.json"]), 0o644); err != nil {
		t.Fatal(err)
	}
	return netConf
}
