package main

import (
	"context"
	"encoding/json"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/weft-net/weft/internal/testkit/kubecluster"
	"github.com/weft-net/weft/internal/testkit/kubetest"
	"github.com/weft-net/weft/internal/testkit/nettest"
)

// TestFlannelKustomization renders, with the real kubectl, the
// kustomization up applies over Flannel's own kube-flannel.yml (from the
// Go module proxy): only the images and the ConfigMap's data change, and
// they change to what the cluster needs.
func TestFlannelKustomization(t *testing.T) {
	kb, err := kubetest.BinDir()
	if err != nil {
		nettest.CannotRun(t, nettest.SkipTools, err.Error())
	}
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	manifest, err := flannelManifest(context.Background(), root)
	if err != nil {
		t.Fatal(err)
	}
	imgs := []image{{"ghcr.io/flannel-io/flannel:built-here", ""}, {"ghcr.io/flannel-io/flannel-cni-plugin:plugin-built-here", ""}}
	dir, err := flannelKustomization(t.TempDir(), manifest, "host-gw", imgs)
	if err != nil {
		t.Fatal(err)
	}
	out, err := osexec.Command(filepath.Join(kb, "kubectl"), "kustomize", dir).Output()
	if err != nil {
		t.Fatalf("kubectl kustomize: %v", err)
	}
	orig, err := os.ReadFile(manifest)
	if err != nil {
		t.Fatal(err)
	}
	got, want := objects(t, string(out)), objects(t, string(orig))
	if len(got) != len(want) {
		t.Fatalf("%d objects rendered, the manifest has %d", len(got), len(want))
	}
	for key, o := range want {
		if key == "DaemonSet/kube-flannel-ds" || key == "ConfigMap/kube-flannel-cfg" {
			continue
		}
		if g, w := mustJSON(t, got[key]), mustJSON(t, o); g != w {
			t.Errorf("%s changed:\n%s\nwant\n%s", key, g, w)
		}
	}
	ds := mustJSON(t, got["DaemonSet/kube-flannel-ds"])
	for _, img := range []string{`"image":"ghcr.io/flannel-io/flannel:built-here"`, `"image":"ghcr.io/flannel-io/flannel-cni-plugin:plugin-built-here"`} {
		if !strings.Contains(ds, img) {
			t.Errorf("DaemonSet has no %s: %s", img, ds)
		}
	}
	if strings.Contains(ds, ":v0.") || strings.Contains(ds, ":v1.") {
		t.Errorf("DaemonSet still names an upstream tag: %s", ds)
	}
	data := got["ConfigMap/kube-flannel-cfg"]["data"].(map[string]any)
	var net, cni map[string]any
	if err := json.Unmarshal([]byte(data["net-conf.json"].(string)), &net); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(data["cni-conf.json"].(string)), &cni); err != nil {
		t.Fatal(err)
	}
	if net["Network"] != kubecluster.ClusterCIDR || net["Backend"].(map[string]any)["Type"] != "host-gw" || net["EnableNFTables"] != false {
		t.Errorf("net-conf.json: %v", net)
	}
	if cni["cniVersion"] != flannelCNIVersion || cni["name"] != "cbr0" || len(cni["plugins"].([]any)) != 2 {
		t.Errorf("cni-conf.json: %v", cni)
	}
}

// objects parses a multi-document YAML stream into objects by kind/name.
func objects(t *testing.T, stream string) map[string]map[string]any {
	t.Helper()
	m := map[string]map[string]any{}
	for _, doc := range strings.Split(stream, "\n---\n") {
		var o map[string]any
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
			t.Fatal(err)
		}
		if o == nil {
			continue
		}
		m[o["kind"].(string)+"/"+o["metadata"].(map[string]any)["name"].(string)] = o
	}
	return m
}

func mustJSON(t *testing.T, v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// checkFlannelInstalled checks that a Flannel pod runs on every node,
// logging no error, and that its init containers installed Flannel's CNI
// plugin and conflist in the node's CNI directories.
func checkFlannelInstalled(t *testing.T, ctx context.Context, s *kubecluster.State, c kubernetes.Interface) {
	pods, err := c.CoreV1().Pods(flannelNS).List(ctx, metav1.ListOptions{LabelSelector: "app=flannel"})
	if err != nil {
		t.Fatal(err)
	}
	on := map[string]bool{}
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodRunning {
			on[p.Spec.NodeName] = true
		}
		b, err := c.CoreV1().Pods(flannelNS).GetLogs(p.Name, &corev1.PodLogOptions{Container: "kube-flannel"}).DoRaw(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "E") { // klog's error lines
				t.Errorf("flanneld on %s: %s", p.Spec.NodeName, l)
			}
		}
	}
	for _, n := range s.Nodes {
		if !on[n.Name] {
			t.Errorf("no Running Flannel pod on %s", n.Name)
		}
		for _, f := range []string{"/opt/cni/bin/flannel", "/etc/cni/net.d/10-flannel.conflist", "/run/flannel/subnet.env"} {
			if _, err := n.Run(ctx, "test", "-s", f); err != nil {
				t.Errorf("%s on %s: %v", f, n.Name, err)
			}
		}
	}
}
