package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/weft-net/weft/internal/ops/connectivity/kubeprobe"
	"github.com/weft-net/weft/internal/testkit/kubetest"
	"github.com/weft-net/weft/internal/testkit/nettest"
)

// TestConnectivityKubernetes runs `weftctl connectivity --kubeconfig` as
// the ServiceAccount of kube-manifests/weft-connectivity.yml against a real
// API server with the real DaemonSet and garbage-collector controllers, on
// three node namespaces running weftd in Kubernetes mode. The test plays
// the scheduler and the kubelets (see kubelet): every probe runs the
// weftctl binary, in a pod namespace wired by the weft plugin or (node to
// node) in its node's namespace, reads the API as its own ServiceAccount,
// and measures the others over the real overlay. Then one node's VXLAN
// port is blocked: exactly its pairs fail and weftctl exits 2. Then weftctl
// is interrupted, and last a node without a kubelet is added.
func TestConnectivityKubernetes(t *testing.T) {
	e := newConnEnv(t)
	pods, nodes, _ := e.run(0, "60s")
	e.checkCleanedUp()
	for what, m := range map[string]map[string]bool{"pod to pod": pods, "node to node": nodes} {
		if got := failed(m); got != "6 pairs, failed []" {
			t.Errorf("healthy cluster, %s: %s", what, got)
		}
	}

	nettest.MustRun(t, e.c.Nodes[2], "nft", "add table inet wefttest; add chain inet wefttest in { type filter hook input priority 0; }; add rule inet wefttest in udp dport 8472 drop")
	pods, nodes, _ = e.run(2, "60s")
	e.checkCleanedUp()
	for what, m := range map[string]map[string]bool{"pod to pod": pods, "node to node": nodes} {
		if got, want := failed(m), "6 pairs, failed [n1→n3 n2→n3 n3→n1 n3→n2]"; got != want {
			t.Errorf("n3's port blocked, %s: %s, want %s", what, got, want)
		}
	}
	nettest.MustRun(t, e.c.Nodes[2], "nft", "delete table inet wefttest")

	e.interrupted()
	e.nodeDown()
}

// connEnv is the cluster of TestConnectivityKubernetes.
type connEnv struct {
	t       *testing.T
	ctx     context.Context
	k       *kubetest.Cluster
	c       *Cluster
	kl      *kubelet
	weftctl string
	runner  string // the kubeconfig weftctl runs with
}

func newConnEnv(t *testing.T) *connEnv {
	k := kubetest.Start(t)
	k.StartControllers(t, "nodeipam", "daemonset", "garbagecollector")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	t.Cleanup(cancel)
	netConf := applyManifests(ctx, t, k)
	applyStrict(ctx, t, k, filepath.Join(ModuleRootDir(t), "kube-manifests", "weft-connectivity.yml"))
	checkConnectivityRBAC(ctx, t, k)
	weftKubeconfig := saKubeconfig(ctx, t, k, "kube-weft", "weft")
	e := &connEnv{t: t, ctx: ctx, k: k, runner: saKubeconfig(ctx, t, k, "weft-connectivity", "weftctl")}

	e.c = NewCluster(t, Options{Nodes: 0})
	apiserver := strings.TrimPrefix(k.Admin.Host, "https://")
	e.c.OnNode = func(n *Node) { nettest.ForwardLoopback(t, n, apiserver) }
	for _, name := range []string{"n1", "n2", "n3"} {
		createNode(ctx, t, k, name)
		e.c.AddNode(name, "--kube-subnet-mgr", "--kubeconfig", weftKubeconfig, "--node-name", name, "--net-config-path", netConf)
	}
	for _, n := range e.c.Nodes {
		n.WaitReady()
	}
	e.weftctl = nettest.Binary(t, "weftctl")
	e.kl = startKubelet(t, k, "weft-connectivity", e.c.Nodes, map[string]string{"weftctl": e.weftctl})
	return e
}

// run runs weftctl connectivity, expects the exit status want, and returns
// both matrices and the output.
func (e *connEnv) run(want int, wait string) (pods, nodes map[string]bool, out string) {
	t := e.t
	t.Helper()
	cmd := exec.CommandContext(e.ctx, e.weftctl, "connectivity", "--kubeconfig", e.runner, "--image", "weft:e2e", "--count", "2", "--wait", wait)
	b, err := cmd.CombinedOutput()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	t.Logf("weftctl connectivity (exit %d):\n%s", code, b)
	if code != want {
		t.Fatalf("exit %d, want %d; probe logs:\n%s", code, want, e.kl.Logs())
	}
	pod, node, ok := strings.Cut(string(b), "Node to node")
	if !ok {
		t.Fatal("no node-to-node matrix")
	}
	return pairs(t, pod), pairs(t, node), string(b)
}

// failed sums a matrix up: its size and its failed pairs.
func failed(m map[string]bool) string {
	var f []string
	for pair, ok := range m {
		if !ok {
			f = append(f, pair)
		}
	}
	sort.Strings(f)
	return fmt.Sprintf("%d pairs, failed %v", len(m), f)
}

// interrupted interrupts weftctl while its probes run: it still deletes
// them.
func (e *connEnv) interrupted() {
	t := e.t
	cmd := exec.CommandContext(e.ctx, e.weftctl, "connectivity", "--kubeconfig", e.runner, "--image", "weft:e2e", "--wait", "60s")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 30*time.Second, "a probe pod running", func() error {
		if e.kl.Running() == 0 {
			return errors.New("none yet")
		}
		return nil
	})
	cmd.Process.Signal(os.Interrupt)
	if err := cmd.Wait(); err == nil || !strings.Contains(stderr.String(), "weftctl: interrupted (probe DaemonSets deleted, unless a warning above says otherwise)") {
		t.Errorf("weftctl interrupted: %v", err)
	}
	t.Logf("weftctl interrupted:\n%s", stderr.String())
	e.checkCleanedUp()
}

// nodeDown adds a fourth node without a kubelet (down): its probes stay
// Pending and are named; the others are measured; its pods stay
// terminating, which weftctl reports, until the test removes them as the
// node controller would. A probe DaemonSet left by a killed run (placed on
// no node) is named too.
func (e *connEnv) nodeDown() {
	t, ctx, k := e.t, e.ctx, e.k
	createNode(ctx, t, k, "n4")
	left := kubeprobe.Spec{Run: "killed", Image: "weft:e2e", Port: 9471, Count: 1, Timeout: "1s"}.DaemonSet()
	left.Spec.Template.Spec.NodeSelector = map[string]string{"nowhere": "true"}
	if _, err := k.Client.AppsV1().DaemonSets("weft-connectivity").Create(ctx, left, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pods, nodes, out := e.run(2, "8s")
	if !strings.Contains(out, "another run's probe DaemonSet") || !strings.Contains(out, "name=weft-probe-killed") {
		t.Errorf("the leftover DaemonSet is not named")
	}
	if err := k.Client.AppsV1().DaemonSets("weft-connectivity").Delete(ctx, left.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if failed(pods) != "6 pairs, failed []" || failed(nodes) != "6 pairs, failed []" ||
		!regexp.MustCompile(`(?m)^✗ node n4: probe pod weft-probe-\w+-\w+ not ready \(Pending\)$`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^✗ node n4: probe pod weft-probe-host-\w+-\w+ not ready \(Pending\)$`).MatchString(out) ||
		!strings.Contains(out, "2 probe(s) did not take part") || !strings.Contains(out, "is still being deleted") {
		t.Errorf("with n4 down: pods %s, nodes %s", failed(pods), failed(nodes))
	}
	left4, err := k.Client.CoreV1().Pods("weft-connectivity").List(ctx, metav1.ListOptions{})
	if err != nil || len(left4.Items) != 2 {
		t.Fatalf("pods left: %v %v", left4, err)
	}
	zero := int64(0)
	for _, p := range left4.Items {
		if p.Spec.NodeName != "n4" {
			t.Errorf("pod %s on %s left", p.Name, p.Spec.NodeName)
		}
		if err := k.Client.CoreV1().Pods("weft-connectivity").Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
			t.Fatal(err)
		}
	}
	Eventually(t, 30*time.Second, "the DaemonSets gone", func() error {
		dss, err := k.Client.AppsV1().DaemonSets("weft-connectivity").List(ctx, metav1.ListOptions{})
		if err == nil && len(dss.Items) > 0 {
			err = errors.New("still there")
		}
		return err
	})
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
func (e *connEnv) checkCleanedUp() {
	t, ctx, k := e.t, e.ctx, e.k
	t.Helper()
	dss, err := k.Client.AppsV1().DaemonSets("weft-connectivity").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pods, err := k.Client.CoreV1().Pods("weft-connectivity").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(dss.Items) != 0 || len(pods.Items) != 0 || e.kl.Running() != 0 {
		t.Errorf("after weftctl: %d DaemonSets, %d pods, %d probes running", len(dss.Items), len(pods.Items), e.kl.Running())
	}
}

// checkConnectivityRBAC checks that the two ServiceAccounts of
// weft-connectivity.yml may do nothing beyond what a run needs (what it
// needs, the run itself shows).
func checkConnectivityRBAC(ctx context.Context, t *testing.T, k *kubetest.Cluster) {
	t.Helper()
	client := func(name string) kubernetes.Interface {
		cfg, err := k.ServiceAccountConfig(ctx, "weft-connectivity", name)
		if err != nil {
			t.Fatal(err)
		}
		c, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	probe, runner := client("weft-probe"), client("weftctl")
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "rogue"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}}}
	for _, f := range []struct {
		name string
		do   func() error
	}{
		{"probe lists pods", func() error {
			_, err := probe.CoreV1().Pods("weft-connectivity").List(ctx, metav1.ListOptions{})
			return err
		}},
		{"probe gets pods elsewhere", func() error {
			_, err := probe.CoreV1().Pods("kube-weft").Get(ctx, "x", metav1.GetOptions{})
			return err
		}},
		{"probe gets DaemonSets", func() error {
			_, err := probe.AppsV1().DaemonSets("weft-connectivity").Get(ctx, "x", metav1.GetOptions{})
			return err
		}},
		{"weftctl creates pods", func() error {
			_, err := runner.CoreV1().Pods("weft-connectivity").Create(ctx, pod, metav1.CreateOptions{})
			return err
		}},
		{"weftctl lists pods elsewhere", func() error { _, err := runner.CoreV1().Pods("kube-weft").List(ctx, metav1.ListOptions{}); return err }},
		{"weftctl gets DaemonSets elsewhere", func() error {
			_, err := runner.AppsV1().DaemonSets("kube-weft").Get(ctx, "weft", metav1.GetOptions{})
			return err
		}},
		{"weftctl lists nodes", func() error { _, err := runner.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); return err }},
		{"weftctl reads secrets", func() error {
			_, err := runner.CoreV1().Secrets("weft-connectivity").List(ctx, metav1.ListOptions{})
			return err
		}},
	} {
		if err := f.do(); !apierrors.IsForbidden(err) {
			t.Errorf("%s: %v, want Forbidden", f.name, err)
		}
	}
}
