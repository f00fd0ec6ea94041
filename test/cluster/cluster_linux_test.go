package main

import (
	"cmp"
	"context"
	"fmt"
	"net/netip"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/weft-net/weft/internal/testkit/kubecluster"
	"github.com/weft-net/weft/internal/testkit/kubetest"
	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/internal/testkit/ociimage"
)

func TestMain(m *testing.M) {
	kubecluster.MaybeForward() // Up runs this test binary as the API server's forwarder
	os.Exit(m.Run())
}

const busyboxImage = "weft.test/busybox:local"

// TestCluster brings up a real two-node cluster (kubelet, containerd,
// kube-proxy per node, in iptables mode or WEFT_CLUSTER_PROXY_MODE's; the
// control plane in a namespace of its own), with
// weft installed by applying its manifest (or, with WEFT_CLUSTER_CNI=flannel,
// Flannel by its own; then Kubernetes' CI subset, whose NetworkPolicy specs
// Flannel cannot pass, is left out), checks that pods on different
// nodes reach each other, directly and through a ClusterIP Service, and
// that the Service kubernetes answers from a pod, runs Kubernetes' own CI
// subset of network specs, checks that weftctl flows names the
// NetworkPolicy that drops a connection, replaces weft by its Helm chart's install and
// checks it again; then takes the cluster down and checks that nothing is
// left on the machine.
func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("builds weft's image and runs a real cluster: minutes")
	}
	nettest.RequireRoot(t)
	if _, err := kubetest.BinDir(); err != nil {
		nettest.CannotRun(t, nettest.SkipTools, err.Error())
	}
	// A fixed directory: a run that was killed left its state there, and
	// this run takes that cluster down first (restoring the sysctls its
	// kubelets changed).
	// WEFT_TEST_CLUSTER_NAME names another (name and directory), so that
	// two checkouts' suites can run side by side.
	name := cmp.Or(os.Getenv("WEFT_TEST_CLUSTER_NAME"), "test")
	dir := "/var/tmp/weft-cluster-" + name
	if _, err := kubecluster.LoadState(dir); err == nil {
		t.Logf("taking down the cluster a killed run left in %s", dir)
		if err := kubecluster.Down(dir); err != nil {
			t.Fatal(err)
		}
	}
	// kube-proxy's mode: iptables, or nftables when asked.
	proxyMode := cmp.Or(os.Getenv("WEFT_CLUSTER_PROXY_MODE"), "iptables")
	cni := cmp.Or(os.Getenv("WEFT_CLUSTER_CNI"), "weft")
	before := kubecluster.Sysctls(kubecluster.WatchedSysctls)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	t0 := time.Now()
	s, err := bringUp(ctx, options{Name: name, Dir: dir, Nodes: 2, ProxyMode: proxyMode, CNI: cni}, testLog{t})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cluster up with %s in %s", cni, time.Since(t0).Round(time.Second))
	downed := false
	t.Cleanup(func() {
		if !downed {
			if err := kubecluster.Down(dir); err != nil {
				t.Error(err)
			}
		}
	})
	c, err := s.Client()
	if err != nil {
		t.Fatal(err)
	}
	if cni == "flannel" {
		t.Run("Flannel installed by its DaemonSet", func(t *testing.T) { checkFlannelInstalled(t, ctx, s, c) })
	} else {
		t.Run("weft installed by its DaemonSet", func(t *testing.T) { checkWeftInstalled(t, ctx, s, c) })
	}
	t.Run("machine's sysctls unchanged but kubelet's", func(t *testing.T) {
		kubelets := map[string]bool{}
		for _, sc := range s.Sysctls {
			kubelets[sc.Name] = true
		}
		for _, sc := range before {
			if kubelets[sc.Name] {
				continue
			}
			if now := kubecluster.Sysctls([]string{sc.Name}); len(now) != 1 || now[0].Value != sc.Value {
				t.Errorf("%s is %v while the cluster runs, was %q", sc.Name, now, sc.Value)
			}
		}
	})
	bb := busyboxArchive(t)
	if err := s.ImportImage(ctx, bb); err != nil {
		t.Fatal(err)
	}
	a := runPod(t, ctx, c, "web-a", s.Nodes[0].Name)
	b := runPod(t, ctx, c, "web-b", s.Nodes[1].Name)
	t.Run("pods get addresses from their node's podCIDR", func(t *testing.T) {
		for _, p := range []*corev1.Pod{a, b} {
			checkInPodCIDR(t, ctx, c, p)
		}
	})
	t.Run("pod to pod across nodes", func(t *testing.T) {
		podExec(t, ctx, s, a.Name, "ping", "-c", "3", "-W", "2", b.Status.PodIP)
		podExec(t, ctx, s, b.Name, "ping", "-c", "3", "-W", "2", a.Status.PodIP)
		if got := podExec(t, ctx, s, a.Name, "httpget", "http://"+b.Status.PodIP+":8080/"); strings.TrimSpace(got) != b.Name {
			t.Fatalf("web-b answered %q", got)
		}
	})
	t.Run("ClusterIP Service across nodes", func(t *testing.T) { checkService(t, ctx, s, c, a.Name) })
	t.Run("cluster DNS", func(t *testing.T) {
		// Up deploys CoreDNS when its image was there.
		if _, err := c.AppsV1().Deployments("kube-system").Get(ctx, "coredns", metav1.GetOptions{}); err != nil {
			nettest.CannotRun(t, nettest.SkipTools, "no CoreDNS: its image was missing at bring-up (test/cluster/images.sh builds "+corednsArchive()+"): "+err.Error())
		}
		svc, err := c.CoreV1().Services("default").Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		out := podExec(t, ctx, s, a.Name, "nslookup", "web.default.svc.cluster.local")
		if !strings.Contains(out, svc.Spec.ClusterIP) {
			t.Fatalf("nslookup web.default.svc.cluster.local: %q, want %s", out, svc.Spec.ClusterIP)
		}
	})
	t.Run("Service kubernetes from a pod", func(t *testing.T) {
		out := podExec(t, ctx, s, a.Name, "httpget", "https://"+kubernetesIP(t, ctx, c)+"/version")
		if !strings.Contains(out, `"gitVersion": "`+kubetest.Version+`"`) {
			t.Fatalf("GET /version from a pod answered %q", out)
		}
	})
	if cni != "flannel" {
		t.Run("Kubernetes' own specs, the CI subset", func(t *testing.T) {
			// e2e.sh's "ci" selection: Services, DNS, pod-to-pod and node-to-pod
			// across nodes, NetworkPolicy deny and allow (docs/kubernetes-e2e.md).
			out := t.TempDir()
			cmd := osexec.CommandContext(ctx, "./e2e.sh", "-o", out, "-l", "test-"+proxyMode, s.Kubeconfig, "ci")
			b, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("e2e.sh ci: %v\n%s", err, tail(string(b), 60))
			}
			t.Logf("e2e.sh ci:\n%s", tail(string(b), 8))
		})
		t.Run("weftctl flows shows a NetworkPolicy drop", func(t *testing.T) { checkFlows(t, ctx, s, c, a, b) })
		t.Run("weftctl connectivity, probes run by kubelet", func(t *testing.T) { checkConnectivity(t, ctx, s, c, weftImage(t, ctx, c)) })
		t.Run("weft reinstalled by its Helm chart", func(t *testing.T) { checkHelmReinstall(t, ctx, s, c, a) })
	}
	t.Run("down leaves nothing", func(t *testing.T) {
		downed = true
		if err := kubecluster.Down(dir); err != nil {
			t.Fatal(err)
		}
		if err := kubecluster.Leftovers(dir, name, before); err != nil {
			t.Fatal(err)
		}
	})
}

// checkHelmReinstall replaces the manifest's weft by the Helm chart's, the
// second way users install it (the chart with default values renders the
// manifest's objects, test/helm): kubectl delete of the kustomization up
// applied, the plugin and conflist removed from the nodes so that only the
// chart's init containers can put them back, helm install with the same
// image set by --set (up -install helm), then the checks of the manifest's
// install, and new pods on both nodes reaching each other and pod old,
// which kept its network across the change.
func checkHelmReinstall(t *testing.T, ctx context.Context, s *kubecluster.State, c kubernetes.Interface, old *corev1.Pod) {
	ref := weftImage(t, ctx, c)
	if _, err := s.Kubectl(ctx, kubeBin(t), "delete", "-k", filepath.Join(s.Dir, "kustomize", "kube-weft"), "--wait", "--timeout=3m"); err != nil {
		t.Fatal(err)
	}
	for _, n := range s.Nodes {
		if _, err := n.Run(ctx, "rm", "-f", "/opt/cni/bin/weft", "/etc/cni/net.d/10-weft.conflist"); err != nil {
			t.Fatal(err)
		}
	}
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if err := helmInstall(ctx, s, options{}, kubeBin(t), root, ref); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	if err := s.WaitReady(wctx, weftNamespace, "weft"); err != nil {
		t.Fatal(err)
	}
	t.Logf("weft installed by helm, every node Ready in %s", time.Since(t0).Round(time.Second))
	ds, err := c.AppsV1().DaemonSets(weftNamespace).Get(ctx, "weft", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ds.Annotations["meta.helm.sh/release-name"] != "weft" {
		t.Fatalf("DaemonSet weft not installed by helm: annotations %v", ds.Annotations)
	}
	checkWeftInstalled(t, ctx, s, c)
	p0 := runPod(t, ctx, c, "web-c", s.Nodes[0].Name)
	p1 := runPod(t, ctx, c, "web-d", s.Nodes[1].Name)
	if got := podExec(t, ctx, s, p0.Name, "httpget", "http://"+p1.Status.PodIP+":8080/"); strings.TrimSpace(got) != p1.Name {
		t.Fatalf("%s answered %q", p1.Name, got)
	}
	if got := podExec(t, ctx, s, p1.Name, "httpget", "http://"+old.Status.PodIP+":8080/"); strings.TrimSpace(got) != old.Name {
		t.Fatalf("%s answered %q", old.Name, got)
	}
}

// weftImage is the image weft's DaemonSet runs.
func weftImage(t *testing.T, ctx context.Context, c kubernetes.Interface) string {
	ds, err := c.AppsV1().DaemonSets(weftNamespace).Get(ctx, "weft", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return ds.Spec.Template.Spec.Containers[0].Image
}

type testLog struct{ t *testing.T }

func (l testLog) Write(b []byte) (int, error) {
	l.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// checkWeftInstalled checks that a weft pod runs on every node, logging
// neither errors nor warnings, and that its init containers installed the
// plugin and the conflist in the node's CNI directories.
func checkWeftInstalled(t *testing.T, ctx context.Context, s *kubecluster.State, c kubernetes.Interface) {
	pods, err := c.CoreV1().Pods("kube-weft").List(ctx, metav1.ListOptions{LabelSelector: "k8s-app=weft"})
	if err != nil {
		t.Fatal(err)
	}
	on := map[string]bool{}
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodRunning {
			on[p.Spec.NodeName] = true
		}
	}
	// A fresh node is nothing to complain about.
	for _, p := range pods.Items {
		b, err := c.CoreV1().Pods("kube-weft").GetLogs(p.Name, &corev1.PodLogOptions{Container: "weftd"}).DoRaw(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, "level=ERROR") || strings.Contains(l, "level=WARN") {
				t.Errorf("weftd on %s: %s", p.Spec.NodeName, l)
			}
		}
	}
	for _, n := range s.Nodes {
		if !on[n.Name] {
			t.Errorf("no Running weft pod on %s", n.Name)
		}
		for _, f := range []string{"/opt/cni/bin/weft", "/etc/cni/net.d/10-weft.conflist"} {
			if _, err := n.Run(ctx, "test", "-s", f); err != nil {
				t.Errorf("%s on %s: %v", f, n.Name, err)
			}
		}
	}
}

// busyboxArchive builds the test pods' image: busybox and httpget
// (testdata/httpget) as /bin/httpget.
func busyboxArchive(t *testing.T) string {
	bin := filepath.Join(t.TempDir(), "httpget")
	cmd := osexec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, "./testdata/httpget")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build httpget: %v: %s", err, out)
	}
	hg, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	layer, err := ociimage.BusyboxLayer(ociimage.File{Name: "bin/httpget", Mode: 0o755, Data: hg})
	if err != nil {
		t.Fatal(err)
	}
	b, err := ociimage.Archive(busyboxImage, layer, nil)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "busybox.tar")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// runPod runs a busybox pod on node serving its own name over HTTP on
// 8080, and waits until it is Running.
func runPod(t *testing.T, ctx context.Context, c kubernetes.Interface, name, node string) *corev1.Pod {
	t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{
			NodeSelector:                  map[string]string{"kubernetes.io/hostname": node},
			TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{
				Name: "web", Image: busyboxImage,
				Command: []string{"sh", "-c", "mkdir -p /www && echo $POD > /www/index.html && exec httpd -f -p 8080 -h /www"},
				Env:     []corev1.EnvVar{{Name: "POD", Value: name}},
				Ports:   []corev1.ContainerPort{{ContainerPort: 8080}},
			}},
		},
	}
	if _, err := c.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var last *corev1.Pod
	for end := time.Now().Add(3 * time.Minute); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		got, err := c.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err == nil && got.Status.Phase == corev1.PodRunning && got.Status.PodIP != "" {
			return got
		}
		last = got
	}
	t.Fatalf("pod %s not Running: %+v", name, last.Status)
	return nil
}

func checkInPodCIDR(t *testing.T, ctx context.Context, c kubernetes.Interface, p *corev1.Pod) {
	t.Helper()
	n, err := c.CoreV1().Nodes().Get(ctx, p.Spec.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cidr, err1 := netip.ParsePrefix(n.Spec.PodCIDR)
	ip, err2 := netip.ParseAddr(p.Status.PodIP)
	if err1 != nil || err2 != nil || !cidr.Contains(ip) {
		t.Fatalf("pod %s has %s, not in %s's podCIDR %q", p.Name, p.Status.PodIP, n.Name, n.Spec.PodCIDR)
	}
}

// checkService makes a ClusterIP Service of both web pods and fetches
// through it from pod client until both pods (one on each node) answered.
func checkService(t *testing.T, ctx context.Context, s *kubecluster.State, c kubernetes.Interface, client string) {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "web"},
			Ports:    []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}},
		},
	}
	svc, err := c.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	var last string
	for end := time.Now().Add(2 * time.Minute); time.Now().Before(end) && len(seen) < 2; {
		out, err := s.Kubectl(ctx, kubeBin(t), "exec", client, "--", "httpget", "http://"+svc.Spec.ClusterIP+"/")
		if err == nil {
			seen[strings.TrimSpace(out)] = true
		}
		last = fmt.Sprint(out, err)
	}
	if !seen["web-a"] || !seen["web-b"] {
		t.Fatalf("through Service %s answered: %v (last: %s)", svc.Spec.ClusterIP, seen, last)
	}
}

// kubernetesIP is the ClusterIP of the Service kubernetes.
func kubernetesIP(t *testing.T, ctx context.Context, c kubernetes.Interface) string {
	svc, err := c.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return svc.Spec.ClusterIP
}

func kubeBin(t *testing.T) string {
	d, err := kubetest.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// podExec runs argv in the pod's container and fails the test on error.
func podExec(t *testing.T, ctx context.Context, s *kubecluster.State, pod string, argv ...string) string {
	t.Helper()
	out, err := s.Kubectl(ctx, kubeBin(t), append([]string{"exec", pod, "--"}, argv...)...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// tail is the last n lines of out.
func tail(out string, n int) string {
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
