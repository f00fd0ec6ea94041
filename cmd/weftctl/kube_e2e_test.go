package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weft-net/weft/internal/testkit/kubetest"
	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/subnet/kube"
)

// TestLeasesKubernetes runs the weftctl binary against a real API server
// holding two nodes with Flannel-style lease annotations and one node that
// no subnet manager runs on (which must not be listed).
func TestLeasesKubernetes(t *testing.T) {
	c := kubetest.Start(t)
	bin := nettest.Binary(t, "weftctl")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := kube.DefaultAnnotationPrefix + "/"
	nodes := []*corev1.Node{
		{ObjectMeta: metav1.ObjectMeta{Name: "n1", Annotations: map[string]string{p + "kube-subnet-manager": "true", p + "backend-type": "vxlan",
			p + "public-ip": "192.168.77.1", p + "backend-data": `{"VNI":1,"VtepMAC":"02:00:00:00:00:01"}`}}, Spec: corev1.NodeSpec{PodCIDR: "10.244.1.0/24"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "n2", Annotations: map[string]string{p + "kube-subnet-manager": "true", p + "backend-type": "vxlan",
			p + "public-ip": "192.168.77.2", p + "backend-data": `{"VNI":1,"VtepMAC":"02:00:00:00:00:02"}`}}, Spec: corev1.NodeSpec{PodCIDR: "10.244.2.0/24"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "unmanaged"}, Spec: corev1.NodeSpec{PodCIDR: "10.244.3.0/24"}},
	}
	for _, n := range nodes {
		if _, err := c.Client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	conf := filepath.Join(t.TempDir(), "net-conf.json")
	if err := os.WriteFile(conf, []byte(`{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(ctx, bin, "leases", "--kubeconfig", c.Kubeconfig(), "--net-config-path", conf).CombinedOutput()
	if err != nil {
		t.Fatalf("weftctl leases: %v\n%s", err, out)
	}
	for _, want := range []string{
		`2 leases in Kubernetes API`,
		`10.244.1.0/24\s+192.168.77.1\s+02:00:00:00:00:01\s+vxlan\s+no TTL`,
		`10.244.2.0/24\s+192.168.77.2\s+02:00:00:00:00:02\s+vxlan\s+no TTL`,
	} {
		if !regexp.MustCompile(want).Match(out) {
			t.Errorf("no match for %q in:\n%s", want, out)
		}
	}
	if regexp.MustCompile(`10\.244\.3\.0`).Match(out) {
		t.Errorf("the unmanaged node is listed:\n%s", out)
	}

	// A ServiceAccount without RBAC: client-go's reflector fails to list
	// the nodes and logs it through klog, which must come out as weftctl's
	// own log lines, not klog's.
	if _, err := c.Client.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "nobody"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	nobody, err := c.ServiceAccountKubeconfig(ctx, t.TempDir(), "default", "nobody")
	if err != nil {
		t.Fatal(err)
	}
	out, err = exec.CommandContext(ctx, bin, "leases", "--kubeconfig", nobody, "--net-config-path", conf).CombinedOutput()
	if err == nil {
		t.Fatalf("weftctl leases as nobody: no error:\n%s", out)
	}
	t.Logf("weftctl leases as nobody:\n%s", out)
	if klogLine := regexp.MustCompile(`(?m)^[IWEF]\d{4} \d\d:\d\d:\d\d`); klogLine.Match(out) || !regexp.MustCompile(`level=ERROR .*component=client-go.*forbidden`).Match(out) {
		t.Errorf("want client-go's errors as weftctl log lines and no klog line:\n%s", out)
	}
}
