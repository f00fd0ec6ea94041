package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weft-net/weft/internal/testkit/kubetest"
	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/subnet/kube"
)

// TestDoctorKubernetes runs `weftctl doctor` against a real API server for
// a node without a podCIDR and for one whose network is up, and checks the
// Kubernetes checks. It runs in this process's namespace with --no-probe
// and only reads there; the node-level checks are not asserted.
func TestDoctorKubernetes(t *testing.T) {
	c := kubetest.Start(t)
	bin := nettest.Binary(t, "weftctl")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p := kube.DefaultAnnotationPrefix + "/"
	managed := map[string]string{p + "kube-subnet-manager": "true", p + "backend-type": "vxlan",
		p + "public-ip": "192.168.77.1", p + "backend-data": `{"VNI":1,"VtepMAC":"02:00:00:00:00:01"}`}
	up := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "up", Annotations: managed}, Spec: corev1.NodeSpec{PodCIDR: "10.244.1.0/24"}}
	bare := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "bare"}}
	for _, n := range []*corev1.Node{up, bare} {
		if _, err := c.Client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	got, err := c.Client.CoreV1().Nodes().Get(ctx, "up", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeNetworkUnavailable, Status: corev1.ConditionFalse, Reason: "WeftIsUp", LastTransitionTime: metav1.Now()}}
	if _, err := c.Client.CoreV1().Nodes().UpdateStatus(ctx, got, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(t.TempDir(), "net-conf.json")
	if err := os.WriteFile(conf, []byte(`{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	kubeChecks := func(node string) map[string]string {
		out, _ := exec.CommandContext(ctx, bin, "doctor", "--kubeconfig", c.Kubeconfig(), "--net-config-path", conf,
			"--node-name", node, "--no-probe", "--subnet-file", filepath.Join(t.TempDir(), "none.env"), "-o", "json").Output()
		var doc struct {
			Nodes []struct {
				Checks []struct{ Name, Status, Evidence string }
			}
		}
		if err := json.Unmarshal(out, &doc); err != nil || len(doc.Nodes) != 1 {
			t.Fatalf("doctor --node-name %s: %v:\n%s", node, err, out)
		}
		m := map[string]string{}
		for _, ch := range doc.Nodes[0].Checks {
			if strings.HasPrefix(ch.Name, "kube/") {
				m[ch.Name] = ch.Status + ": " + ch.Evidence
			}
		}
		return m
	}
	m := kubeChecks("up")
	for _, name := range []string{"kube/podcidr", "kube/network-unavailable", "kube/annotations"} {
		if !strings.HasPrefix(m[name], "ok: ") {
			t.Errorf("node up: %s = %q", name, m[name])
		}
	}
	m = kubeChecks("bare")
	if !strings.HasPrefix(m["kube/podcidr"], "fail: node bare has no spec.podCIDR") {
		t.Errorf("node bare: kube/podcidr = %q", m["kube/podcidr"])
	}
	if !strings.HasPrefix(m["kube/network-unavailable"], "warn: ") || !strings.HasPrefix(m["kube/annotations"], "fail: ") {
		t.Errorf("node bare: %v", m)
	}
}
