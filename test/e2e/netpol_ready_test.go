package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weft-net/weft/internal/testkit/kubetest"
	"github.com/weft-net/weft/internal/testkit/nettest"
)

// TestNetworkPolicyNotReadyUntilProgrammed is the review's fail-open case:
// weftd whose ServiceAccount may not list NetworkPolicies (its informer
// never syncs) used to report ready with every pod open. Now it stays not
// ready (/readyz 503, weft_ready and weft_network_policy_ready 0, the
// Node's NetworkUnavailable not cleared) and writes no subnet file, so the
// CNI plugin wires no pod (it used to wire them with nothing programmed).
// Once the permission is back it lists, commits its table, writes the
// subnet file (a pod gets an address) and becomes ready.
func TestNetworkPolicyNotReadyUntilProgrammed(t *testing.T) {
	k := kubetest.Start(t)
	k.StartControllers(t, "nodeipam")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	netConf := applyManifests(ctx, t, k)
	roles := k.Client.RbacV1().ClusterRoles()
	role, err := roles.Get(ctx, "weft", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	full := role.DeepCopy()
	role.Rules = role.Rules[:0]
	for _, r := range full.Rules {
		if len(r.APIGroups) != 1 || r.APIGroups[0] != "networking.k8s.io" {
			role.Rules = append(role.Rules, r)
		}
	}
	if len(role.Rules) == len(full.Rules) {
		t.Fatal("the manifest's ClusterRole has no networkpolicies rule")
	}
	if role, err = roles.Update(ctx, role, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	kubeconfig := saKubeconfig(ctx, t, k, "kube-weft", "weft")
	c := NewCluster(t, Options{Nodes: 0})
	apiserver := strings.TrimPrefix(k.Admin.Host, "https://")
	c.OnNode = func(n *Node) { nettest.ForwardLoopback(t, n, apiserver) }
	createNode(ctx, t, k, "n1")
	n1 := c.AddNode("n1", "--kube-subnet-mgr", "--kubeconfig", kubeconfig, "--node-name", "n1", "--net-config-path", netConf)

	Eventually(t, 30*time.Second, "weftd serving metrics", func() error {
		_, err := n1.Metric("weft_network_policy_enabled")
		return err
	})
	time.Sleep(5 * time.Second)
	// No subnet file, so the CNI plugin wires no pod: none can open a
	// connection that conntrack would keep once the table comes.
	if _, err := os.Stat(n1.SubnetFile); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("subnet file written before any policy table (%v)", err)
	}
	if p, err := n1.CNI.Add(nettest.NewNS(t, "a0"), "pod-a0"); err == nil {
		t.Errorf("a pod was wired (%s) while no policy table was programmed", p.IP)
		if err := n1.CNI.Del(p); err != nil {
			t.Error(err)
		}
	}
	if code, _, err := n1.HTTPGet("http://127.0.0.1:9470/readyz"); err != nil || code != 503 {
		t.Errorf("/readyz without a policy table: %d %v, want 503", code, err)
	}
	for _, m := range []string{"weft_ready", "weft_network_policy_ready"} {
		if v, err := n1.Metric(m); err != nil || v != 0 {
			t.Errorf("%s = %v (%v), want 0", m, v, err)
		}
	}
	if v, err := n1.Metric("weft_network_policy_enabled"); err != nil || v != 1 {
		t.Errorf("weft_network_policy_enabled = %v (%v), want 1", v, err)
	}
	if err := networkAvailable(ctx, k, "n1"); err == nil {
		t.Error("the Node's NetworkUnavailable was cleared without a policy table")
	}

	role.Rules = full.Rules
	if _, err := roles.Update(ctx, role, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 90*time.Second, "ready once it can list NetworkPolicies", func() error {
		if code, _, err := n1.HTTPGet("http://127.0.0.1:9470/readyz"); err != nil || code != 200 {
			return fmt.Errorf("/readyz %d %v", code, err)
		}
		return networkAvailable(ctx, k, "n1")
	})
	if v, err := n1.Metric("weft_network_policy_ready"); err != nil || v != 1 {
		t.Errorf("weft_network_policy_ready = %v (%v) once ready, want 1", v, err)
	}
	if out, err := n1.NS.Run("nft", "list", "table", "inet", "weft-policy"); err != nil {
		t.Errorf("no policy table once ready: %v\n%s", err, out)
	}
	if _, err := os.Stat(n1.SubnetFile); err != nil {
		t.Errorf("no subnet file once ready: %v", err)
	}
	if pod := n1.CNI.AddPod(t, "a"); !pod.IP.IsValid() {
		t.Error("no address for a pod once ready")
	}
}

// networkAvailable is nil when the Node's NetworkUnavailable condition is
// False.
func networkAvailable(ctx context.Context, k *kubetest.Cluster, name string) error {
	n, err := k.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeNetworkUnavailable {
			if c.Status == corev1.ConditionFalse {
				return nil
			}
			return fmt.Errorf("NetworkUnavailable %s (%s)", c.Status, c.Reason)
		}
	}
	return errors.New("no NetworkUnavailable condition")
}
