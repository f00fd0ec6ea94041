package main

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

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/util/retry"

	"github.com/weft-net/weft/internal/ops/connectivity/kubeprobe"
	"github.com/weft-net/weft/internal/testkit/kubecluster"
)

// probeNS is the namespace of kube-manifests/weft-connectivity.yml.
const probeNS = "weft-connectivity"

// connEnv runs `weftctl connectivity --kubeconfig` on the real cluster as
// the ServiceAccount of kube-manifests/weft-connectivity.yml, its probes
// run by the nodes' kubelets from weft's image.
type connEnv struct {
	t       *testing.T
	ctx     context.Context
	s       *kubecluster.State
	c       kubernetes.Interface
	weftctl string
	runner  string // the kubeconfig weftctl runs with
	image   string
	pairRE  *regexp.Regexp
}

// checkConnectivity: every probe pair passes on the healthy cluster; with
// the last node's VXLAN port blocked (an nftables rule in its namespace)
// exactly its pairs fail and weftctl exits 2; weftctl interrupted still
// deletes its probes; and with a Node whose kubelet is down, its probes are
// named as Pending, the others measured, and its terminating pods reported.
func checkConnectivity(t *testing.T, ctx context.Context, s *kubecluster.State, c kubernetes.Interface, image string) {
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Kubectl(ctx, kubeBin(t), "apply", "-f", filepath.Join(root, "kube-manifests", "weft-connectivity.yml")); err != nil {
		t.Fatal(err)
	}
	checkConnectivityRBAC(t, ctx, s, c)
	weftctl := filepath.Join(t.TempDir(), "weftctl")
	if out, err := exec.Command("go", "build", "-o", weftctl, filepath.Join(root, "cmd", "weftctl")).CombinedOutput(); err != nil {
		t.Fatalf("build weftctl: %v: %s", err, out)
	}
	var names []string
	for _, n := range s.Nodes {
		names = append(names, regexp.QuoteMeta(n.Name))
	}
	nodeRE := "(" + strings.Join(names, "|") + ")"
	e := &connEnv{t: t, ctx: ctx, s: s, c: c, weftctl: weftctl, image: image,
		runner: saKubeconfig(t, ctx, s, c, probeNS, "weftctl"),
		pairRE: regexp.MustCompile(`(?m)^(✗ |  )` + nodeRE + `\s+` + nodeRE + `\s+\d+%`)}
	n := len(s.Nodes)
	all := fmt.Sprintf("%d pairs, failed []", n*(n-1))
	pods, nodes, _ := e.run(0, "60s")
	e.checkCleanedUp()
	for what, m := range map[string]map[string]bool{"pod to pod": pods, "node to node": nodes} {
		if got := failed(m); got != all {
			t.Errorf("healthy cluster, %s: %s", what, got)
		}
	}
	last := s.Nodes[n-1]
	var want []string
	for _, o := range s.Nodes[:n-1] {
		want = append(want, o.Name+"→"+last.Name, last.Name+"→"+o.Name)
	}
	sort.Strings(want)
	if _, err := last.Run(ctx, "nft", "add table inet wefttest; add chain inet wefttest in { type filter hook input priority 0; }; add rule inet wefttest in udp dport 8472 drop"); err != nil {
		t.Fatal(err)
	}
	pods, nodes, _ = e.run(2, "60s")
	if _, err := last.Run(ctx, "nft", "delete table inet wefttest"); err != nil {
		t.Fatal(err)
	}
	e.checkCleanedUp()
	for what, m := range map[string]map[string]bool{"pod to pod": pods, "node to node": nodes} {
		if got, want := failed(m), fmt.Sprintf("%d pairs, failed %v", n*(n-1), want); got != want {
			t.Errorf("%s's port blocked, %s: %s, want %s", last.Name, what, got, want)
		}
	}
	e.interrupted()
	e.nodeDown(all)
}

// run runs weftctl connectivity, expects the exit status want, and returns
// both matrices and the output.
func (e *connEnv) run(want int, wait string) (pods, nodes map[string]bool, out string) {
	t := e.t
	t.Helper()
	cmd := exec.CommandContext(e.ctx, e.weftctl, "connectivity", "--kubeconfig", e.runner, "--image", e.image, "--count", "2", "--wait", wait)
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
		t.Fatalf("exit %d, want %d", code, want)
	}
	pod, node, ok := strings.Cut(string(b), "Node to node")
	if !ok {
		t.Fatal("no node-to-node matrix")
	}
	return e.pairs(pod), e.pairs(node), string(b)
}

// pairs reads the matrix: from→to and whether the pair passed.
func (e *connEnv) pairs(out string) map[string]bool {
	m := map[string]bool{}
	for _, g := range e.pairRE.FindAllStringSubmatch(out, -1) {
		m[g[2]+"→"+g[3]] = g[1] == "  "
	}
	return m
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

// running counts the probe pods kubelet runs.
func (e *connEnv) running() int {
	pods, err := e.c.CoreV1().Pods(probeNS).List(e.ctx, metav1.ListOptions{})
	if err != nil {
		return 0
	}
	n := 0
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodRunning {
			n++
		}
	}
	return n
}

// interrupted interrupts weftctl while its probes run: it still deletes
// them.
func (e *connEnv) interrupted() {
	t := e.t
	cmd := exec.CommandContext(e.ctx, e.weftctl, "connectivity", "--kubeconfig", e.runner, "--image", e.image, "--wait", "60s")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(60 * time.Second); e.running() == 0; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(end) {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("no probe pod running after 60s:\n%s", stderr.String())
		}
	}
	cmd.Process.Signal(os.Interrupt)
	if err := cmd.Wait(); err == nil || !strings.Contains(stderr.String(), "weftctl: interrupted (probe DaemonSets deleted, unless a warning above says otherwise)") {
		t.Errorf("weftctl interrupted: %v", err)
	}
	t.Logf("weftctl interrupted:\n%s", stderr.String())
	e.checkCleanedUp()
}

// nodeDown registers a Node whose kubelet is down (registered as a kubelet
// registers, then silent): its probes are bound to it and stay Pending and
// are named; the others are measured; its pods stay terminating, which
// weftctl reports, until the test removes them as the node controller
// would. A probe DaemonSet left by a killed run (placed on no node) is
// named too. The Node is deleted at the end.
func (e *connEnv) nodeDown(all string) {
	t, ctx, c := e.t, e.ctx, e.c
	const down = "kc-down"
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: down, Labels: map[string]string{"kubernetes.io/hostname": down, "kubernetes.io/os": "linux"}}}
	node, err := c.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.CoreV1().Nodes().Delete(ctx, down, metav1.DeleteOptions{}); err != nil {
			t.Error(err)
		}
	}()
	capacity := corev1.ResourceList{corev1.ResourcePods: resource.MustParse("110"),
		corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("4Gi")}
	// The controller manager writes the new Node too (its podCIDR, its
	// taints): update the latest version.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if node, err = c.CoreV1().Nodes().Get(ctx, down, metav1.GetOptions{}); err != nil {
			return err
		}
		node.Status.Capacity, node.Status.Allocatable = capacity, capacity
		_, err := c.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	left := kubeprobe.Spec{Run: "killed", Image: e.image, Port: 9471, Count: 1, Timeout: "1s"}.DaemonSet()
	left.Spec.Template.Spec.NodeSelector = map[string]string{"nowhere": "true"}
	if _, err := c.AppsV1().DaemonSets(probeNS).Create(ctx, left, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pods, nodes, out := e.run(2, "20s")
	if !strings.Contains(out, "another run's probe DaemonSet") || !strings.Contains(out, "name=weft-probe-killed") {
		t.Errorf("the leftover DaemonSet is not named")
	}
	if err := c.AppsV1().DaemonSets(probeNS).Delete(ctx, left.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if failed(pods) != all || failed(nodes) != all ||
		!regexp.MustCompile(`(?m)^✗ node `+down+`: probe pod weft-probe-\w+-\w+ not ready \(Pending\)$`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^✗ node `+down+`: probe pod weft-probe-host-\w+-\w+ not ready \(Pending\)$`).MatchString(out) ||
		!strings.Contains(out, "2 probe(s) did not take part") || !strings.Contains(out, "is still being deleted") {
		t.Errorf("with %s down: pods %s, nodes %s", down, failed(pods), failed(nodes))
	}
	leftPods, err := c.CoreV1().Pods(probeNS).List(ctx, metav1.ListOptions{})
	if err != nil || len(leftPods.Items) != 2 {
		t.Fatalf("pods left: %v %v", leftPods, err)
	}
	zero := int64(0)
	for _, p := range leftPods.Items {
		if p.Spec.NodeName != down {
			t.Errorf("pod %s on %s left", p.Name, p.Spec.NodeName)
		}
		if err := c.CoreV1().Pods(probeNS).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
	}
	for end := time.Now().Add(60 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		dss, err := c.AppsV1().DaemonSets(probeNS).List(ctx, metav1.ListOptions{})
		if err == nil && len(dss.Items) == 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the probe DaemonSets not gone: %v %v", dss, err)
		}
	}
}

// checkCleanedUp checks that weftctl left no DaemonSet and no pod.
func (e *connEnv) checkCleanedUp() {
	t, ctx, c := e.t, e.ctx, e.c
	t.Helper()
	dss, err := c.AppsV1().DaemonSets(probeNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pods, err := c.CoreV1().Pods(probeNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(dss.Items) != 0 || len(pods.Items) != 0 {
		t.Errorf("after weftctl: %d DaemonSets, %d pods", len(dss.Items), len(pods.Items))
	}
}

// saConfig is a client config of the ServiceAccount ns/name: the admin
// kubeconfig's server and CA with a token requested for it.
func saConfig(t *testing.T, ctx context.Context, s *kubecluster.State, c kubernetes.Interface, ns, name string) *clientcmdapi.Config {
	t.Helper()
	admin, err := clientcmd.LoadFromFile(s.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cluster := admin.Clusters[admin.Contexts[admin.CurrentContext].Cluster]
	hour := int64(3600)
	tr, err := c.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &hour}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["k"] = cluster
	kc.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	kc.Contexts[name] = &clientcmdapi.Context{Cluster: "k", AuthInfo: name}
	kc.CurrentContext = name
	return kc
}

// saKubeconfig writes saConfig to a file and returns its path.
func saKubeconfig(t *testing.T, ctx context.Context, s *kubecluster.State, c kubernetes.Interface, ns, name string) string {
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*saConfig(t, ctx, s, c, ns, name), path); err != nil {
		t.Fatal(err)
	}
	return path
}

// checkConnectivityRBAC checks that the two ServiceAccounts of
// weft-connectivity.yml may do nothing beyond what a run needs (what it
// needs, the run itself shows).
func checkConnectivityRBAC(t *testing.T, ctx context.Context, s *kubecluster.State, admin kubernetes.Interface) {
	t.Helper()
	client := func(name string) kubernetes.Interface {
		cfg, err := clientcmd.NewDefaultClientConfig(*saConfig(t, ctx, s, admin, probeNS, name), nil).ClientConfig()
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
			_, err := probe.CoreV1().Pods(probeNS).List(ctx, metav1.ListOptions{})
			return err
		}},
		{"probe gets pods elsewhere", func() error {
			_, err := probe.CoreV1().Pods(weftNamespace).Get(ctx, "x", metav1.GetOptions{})
			return err
		}},
		{"probe gets DaemonSets", func() error {
			_, err := probe.AppsV1().DaemonSets(probeNS).Get(ctx, "x", metav1.GetOptions{})
			return err
		}},
		{"weftctl creates pods", func() error {
			_, err := runner.CoreV1().Pods(probeNS).Create(ctx, pod, metav1.CreateOptions{})
			return err
		}},
		{"weftctl lists pods elsewhere", func() error {
			_, err := runner.CoreV1().Pods(weftNamespace).List(ctx, metav1.ListOptions{})
			return err
		}},
		{"weftctl gets DaemonSets elsewhere", func() error {
			_, err := runner.AppsV1().DaemonSets(weftNamespace).Get(ctx, "weft", metav1.GetOptions{})
			return err
		}},
		{"weftctl lists nodes", func() error { _, err := runner.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); return err }},
		{"weftctl reads secrets", func() error {
			_, err := runner.CoreV1().Secrets(probeNS).List(ctx, metav1.ListOptions{})
			return err
		}},
	} {
		if err := f.do(); !apierrors.IsForbidden(err) {
			t.Errorf("%s: %v, want Forbidden", f.name, err)
		}
	}
}
