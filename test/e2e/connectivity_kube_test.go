package e2e

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weft-net/weft/internal/kubetest"
	"github.com/weft-net/weft/internal/nettest"
)

// TestConnectivityKubernetes runs `weftctl connectivity --kubeconfig` as
// the ServiceAccount of kube-manifests/weft-connectivity.yml against a real
// API server with the real DaemonSet and garbage-collector controllers, on
// three node namespaces running weftd in Kubernetes mode. The test plays
// the scheduler and the kubelets (see kubelet): every probe runs the
// weftctl binary in a pod namespace wired by the weft plugin, reads the API
// as its own ServiceAccount, and measures the others over the real
// overlay. Then one node's VXLAN port is blocked: exactly its pairs fail
// and weftctl exits 2.
func TestConnectivityKubernetes(t *testing.T) {
	k := kubetest.Start(t)
	k.StartControllers(t, "nodeipam", "daemonset", "garbagecollector")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	netConf := applyManifests(ctx, t, k)
	applyStrict(ctx, t, k, filepath.Join(ModuleRootDir(t), "kube-manifests", "weft-connectivity.yml"))
	weftKubeconfig := saKubeconfig(ctx, t, k, "kube-weft", "weft")
	runner := saKubeconfig(ctx, t, k, "weft-connectivity", "weftctl")

	c := NewCluster(t, Options{Nodes: 0})
	apiserver := strings.TrimPrefix(k.Admin.Host, "https://")
	c.OnNode = func(n *Node) { n.ForwardLoopback(t, apiserver) }
	for _, name := range []string{"n1", "n2", "n3"} {
		createNode(ctx, t, k, name)
		c.AddNode(name, "--kube-subnet-mgr", "--kubeconfig", weftKubeconfig, "--node-name", name, "--net-config-path", netConf)
	}
	for _, n := range c.Nodes {
		n.WaitReady()
	}
	weftctl := nettest.Binary(t, "weftctl")
	kl := startKubelet(t, k, "weft-connectivity", c.Nodes, map[string]string{"weftctl": weftctl})

	run := func(want int) map[string]bool {
		t.Helper()
		cmd := exec.CommandContext(ctx, weftctl, "connectivity", "--kubeconfig", runner, "--image", "weft:e2e", "--count", "2", "--wait", "60s")
		out, err := cmd.CombinedOutput()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		t.Logf("weftctl connectivity (exit %d):\n%s", code, out)
		if code != want {
			t.Fatalf("exit %d, want %d; probe logs:\n%s", code, want, kl.Logs())
		}
		checkCleanedUp(ctx, t, k, kl)
		return pairs(t, string(out))
	}

	got := run(0)
	for pair, ok := range got {
		if !ok {
			t.Errorf("%s failed on a healthy cluster", pair)
		}
	}
	if len(got) != 6 {
		t.Errorf("%d pairs, want 6: %v", len(got), got)
	}

	c.Nodes[2].MustRun(t, "nft", "add table inet wefttest; add chain inet wefttest in { type filter hook input priority 0; }; add rule inet wefttest in udp dport 8472 drop")
	got = run(2)
	var failed []string
	for pair, ok := range got {
		if !ok {
			failed = append(failed, pair)
		}
	}
	sort.Strings(failed)
	if want := []string{"n1→n3", "n2→n3", "n3→n1", "n3→n2"}; strings.Join(failed, " ") != strings.Join(want, " ") || len(got) != 6 {
		t.Errorf("failed pairs %v of %d, want %v of 6", failed, len(got), want)
	}
}

// pairs reads the matrix: from→to and whether the pair passed.
func pairs(t *testing.T, out string) map[string]bool {
	t.Helper()
	m := map[string]bool{}
	re := regexp.MustCompile(`(?m)^(✗ |  )(n\d)\s+(n\d)\s+\d+%`)
	for _, g := range re.FindAllStringSubmatch(out, -1) {
		m[g[2]+"→"+g[3]] = g[1] == "  "
	}
	return m
}

// checkCleanedUp checks that weftctl left no DaemonSet and no pod, and
// that no probe runs any more.
func checkCleanedUp(ctx context.Context, t *testing.T, k *kubetest.Cluster, kl *kubelet) {
	t.Helper()
	dss, err := k.Client.AppsV1().DaemonSets("weft-connectivity").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pods, err := k.Client.CoreV1().Pods("weft-connectivity").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(dss.Items) != 0 || len(pods.Items) != 0 || kl.Running() != 0 {
		t.Errorf("after weftctl: %d DaemonSets, %d pods, %d probes running", len(dss.Items), len(pods.Items), kl.Running())
	}
}
