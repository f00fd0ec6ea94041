package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"

	"github.com/weft-net/weft/internal/namespace"
	"github.com/weft-net/weft/internal/testkit/kubetest"
	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/internal/testkit/plugintest"
)

// kubelet plays the scheduler's and the kubelets' part for the pods of
// one namespace on the test's nodes (this cluster runs neither): it binds
// each pod the DaemonSet controller creates to the node its affinity
// names, runs the container's command in a pod namespace wired by the
// node's weft CNI config (in the node's namespace for a hostNetwork pod;
// the image's weftctl stands for the image), with
// the service-account token, CA and namespace mounted where
// rest.InClusterConfig reads them and the API server reachable at
// KUBERNETES_SERVICE_HOST:PORT from inside the pod, waits for the
// container's TCP readiness probe (dialled from the node, as a kubelet
// does), reports the pod's status, and on deletion stops the process,
// runs CNI DEL and removes the pod.
type kubelet struct {
	t         *testing.T
	k         *kubetest.Cluster
	ns        string
	nodes     map[string]*Node
	images    map[string]string // command name → binary
	apiserver string            // host:port of the API server
	dir       string

	mu          sync.Mutex
	running     map[types.UID]*runningPod
	tried       map[types.UID]bool // only the loop's goroutine uses it
	startingUID map[types.UID]bool
	starting    sync.WaitGroup
	client      kubernetes.Interface // the admin's, without client-side throttling
	started     int
}

type runningPod struct {
	name string
	node *Node
	pod  *plugintest.Pod // nil for a pod on the node's network
	ns   *nettest.NS     // the pod's network namespace, or the node's
	ip   netip.Addr
	cmd  *exec.Cmd
	done chan error
	log  string
}

// startKubelet runs the kubelet until the test ends.
func startKubelet(t *testing.T, k *kubetest.Cluster, ns string, nodes []*Node, images map[string]string) *kubelet {
	kl := &kubelet{t: t, k: k, ns: ns, nodes: map[string]*Node{}, images: images, dir: t.TempDir(),
		apiserver: strings.TrimPrefix(k.Admin.Host, "https://"), running: map[types.UID]*runningPod{}, tried: map[types.UID]bool{}, startingUID: map[types.UID]bool{}}
	cfg := rest.CopyConfig(k.Admin)
	cfg.QPS, cfg.Burst = 1000, 1000 // a kubelet per node would each have its own budget
	var err error
	if kl.client, err = kubernetes.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		kl.nodes[n.Label] = n
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); kl.loop(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		kl.starting.Wait()
		kl.mu.Lock()
		defer kl.mu.Unlock()
		for _, rp := range kl.running {
			kl.stop(rp)
		}
	})
	return kl
}

// loop syncs every pod of the namespace, a few times a second, and stops
// the containers of pods that are gone.
func (kl *kubelet) loop(ctx context.Context) {
	for {
		pods, err := kl.client.CoreV1().Pods(kl.ns).List(ctx, metav1.ListOptions{})
		if err == nil {
			live := map[types.UID]bool{}
			for i := range pods.Items {
				live[pods.Items[i].UID] = true
				kl.sync(ctx, &pods.Items[i])
			}
			kl.mu.Lock()
			for uid, rp := range kl.running {
				if !live[uid] {
					kl.stop(rp)
					delete(kl.running, uid)
				}
			}
			kl.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (kl *kubelet) sync(ctx context.Context, p *corev1.Pod) {
	kl.mu.Lock()
	rp, starting := kl.running[p.UID], kl.startingUID[p.UID]
	kl.mu.Unlock()
	switch {
	case starting: // its start finishes first
	case p.DeletionTimestamp != nil && (rp != nil || kl.nodes[p.Spec.NodeName] != nil || p.Spec.NodeName == ""):
		if rp != nil {
			kl.stop(rp)
			kl.mu.Lock()
			delete(kl.running, p.UID)
			kl.mu.Unlock()
		}
		zero := int64(0)
		err := kl.client.CoreV1().Pods(kl.ns).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &p.UID}})
		if err != nil && !apierrors.IsNotFound(err) && ctx.Err() == nil {
			kl.t.Errorf("kubelet: remove pod %s: %v", p.Name, err)
		}
	case p.Spec.NodeName == "":
		kl.bind(ctx, p)
	case rp == nil && kl.nodes[p.Spec.NodeName] != nil && !kl.tried[p.UID]:
		kl.tried[p.UID] = true // a pod that failed to start stays Pending
		kl.mu.Lock()
		kl.startingUID[p.UID] = true
		kl.mu.Unlock()
		kl.starting.Add(1)
		go func() { // pods start in parallel, as on real kubelets
			defer kl.starting.Done()
			kl.start(ctx, p)
			kl.mu.Lock()
			delete(kl.startingUID, p.UID)
			kl.mu.Unlock()
		}()
	}
}

// bind places a DaemonSet pod on the node its required affinity names.
func (kl *kubelet) bind(ctx context.Context, p *corev1.Pod) {
	a := p.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return
	}
	for _, term := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		for _, f := range term.MatchFields {
			if f.Key == "metadata.name" && len(f.Values) == 1 {
				b := &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: p.Name, UID: p.UID},
					Target: corev1.ObjectReference{Kind: "Node", Name: f.Values[0]}}
				if err := kl.client.CoreV1().Pods(kl.ns).Bind(ctx, b, metav1.CreateOptions{}); err != nil && ctx.Err() == nil {
					kl.t.Logf("kubelet: bind %s to %s: %v", p.Name, f.Values[0], err)
				}
				return
			}
		}
	}
}

// start wires the pod and starts its container.
func (kl *kubelet) start(ctx context.Context, p *corev1.Pod) {
	n := kl.nodes[p.Spec.NodeName]
	kl.mu.Lock()
	kl.started++
	id := fmt.Sprintf("kp%d", kl.started)
	kl.mu.Unlock()
	rp := &runningPod{name: p.Name, node: n, ns: n.NS, ip: n.Addr, done: make(chan error, 1), log: filepath.Join(kl.dir, p.Name+".log")}
	if !p.Spec.HostNetwork { // the node's namespace forwards the API server already
		ns, err := namespace.Create(id)
		if err != nil {
			kl.t.Errorf("kubelet: %s: %v", p.Name, err)
			return
		}
		kl.t.Cleanup(func() { ns.Delete() })
		pod, err := n.CNI.Add(ns, id)
		if err != nil {
			kl.t.Errorf("kubelet: CNI ADD for %s on %s: %v", p.Name, n.Label, err)
			return
		}
		if err := forwardAPI(kl.t, pod.NS, kl.apiserver); err != nil {
			kl.t.Errorf("kubelet: %s: %v", p.Name, err)
			return
		}
		rp.pod, rp.ns, rp.ip = pod, pod.NS, pod.IP
	}
	if err := kl.exec(ctx, p, rp); err != nil {
		kl.t.Errorf("kubelet: start %s: %v", p.Name, err)
		if rp.pod != nil {
			n.CNI.Del(rp.pod)
		}
		return
	}
	kl.mu.Lock()
	kl.running[p.UID] = rp
	kl.mu.Unlock()
	c := p.Spec.Containers[0]
	if rp2 := c.ReadinessProbe; rp2 != nil && rp2.TCPSocket != nil {
		if err := kl.awaitReady(ctx, rp, rp2.TCPSocket.Port.IntValue()); err != nil {
			kl.t.Errorf("kubelet: %s never ready: %v\n%s", p.Name, err, readTail(rp.log))
			return
		}
	}
	if err := kl.reportRunning(ctx, p, rp); err != nil && ctx.Err() == nil && !apierrors.IsNotFound(err) {
		kl.t.Errorf("kubelet: status of %s: %v", p.Name, err)
	}
}

// exec starts the container's command in the pod's namespace, with a
// private mount namespace in which the service-account files are where a
// kubelet mounts them (a tmpfs on /run, so nothing leaks to the host).
func (kl *kubelet) exec(ctx context.Context, p *corev1.Pod, rp *runningPod) error {
	c := p.Spec.Containers[0]
	argv := append(append([]string{}, c.Command...), c.Args...)
	bin, ok := kl.images[argv[0]]
	if !ok {
		return fmt.Errorf("no binary for the command %q", argv[0])
	}
	argv[0] = bin
	sa, err := kl.serviceAccount(ctx, p)
	if err != nil {
		return err
	}
	const mount = `d=$1; shift; mount -t tmpfs tmpfs /run && mkdir -p /run/secrets/kubernetes.io/serviceaccount && ` +
		`mount --bind "$d" /run/secrets/kubernetes.io/serviceaccount && exec "$@"`
	args := append([]string{"unshare", "--mount", "--propagation", "private", "sh", "-c", mount, "sh", sa}, argv...)
	cmd := rp.ns.Command(context.Background(), args...)
	_, port, _ := strings.Cut(kl.apiserver, ":")
	cmd.Env = append(os.Environ(), "KUBERNETES_SERVICE_HOST=127.0.0.1", "KUBERNETES_SERVICE_PORT="+port)
	for _, e := range c.Env {
		v := e.Value
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			v = map[string]string{"metadata.name": p.Name, "metadata.namespace": p.Namespace,
				"spec.nodeName": p.Spec.NodeName, "status.podIP": rp.ip.String()}[e.ValueFrom.FieldRef.FieldPath]
		}
		cmd.Env = append(cmd.Env, e.Name+"="+v)
	}
	log, err := os.Create(rp.log)
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		return err
	}
	rp.cmd = cmd
	go func() { rp.done <- cmd.Wait(); log.Close() }()
	return nil
}

// serviceAccount writes the pod's token (bound to the pod, as a kubelet
// projects it), the cluster CA and the namespace into a directory.
func (kl *kubelet) serviceAccount(ctx context.Context, p *corev1.Pod) (string, error) {
	exp := int64(3600)
	tr, err := kl.client.CoreV1().ServiceAccounts(p.Namespace).CreateToken(ctx, p.Spec.ServiceAccountName,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp,
			BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: p.Name, UID: p.UID}}},
		metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("token for %s: %w", p.Spec.ServiceAccountName, err)
	}
	dir := filepath.Join(kl.dir, "sa-"+p.Name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	for name, b := range map[string][]byte{"token": []byte(tr.Status.Token), "ca.crt": kl.k.Admin.CAData, "namespace": []byte(p.Namespace)} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			return "", err
		}
	}
	return dir, nil
}

// awaitReady dials the pod's port from its node until it answers.
func (kl *kubelet) awaitReady(ctx context.Context, rp *runningPod, port int) error {
	addr := rp.ip.String() + ":" + strconv.Itoa(port)
	deadline := time.Now().Add(20 * time.Second)
	for {
		dctx, cancel := context.WithTimeout(ctx, time.Second)
		c, err := rp.node.NS.DialContext(dctx, "tcp", addr)
		cancel()
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case err := <-rp.done:
			rp.done <- err
			return fmt.Errorf("the container exited: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("tcp %s from %s: %w", addr, rp.node.Label, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// reportRunning writes the status a kubelet reports for a started, ready
// container.
func (kl *kubelet) reportRunning(ctx context.Context, p *corev1.Pod, rp *runningPod) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error { return kl.updateStatus(ctx, p, rp) })
}

func (kl *kubelet) updateStatus(ctx context.Context, p *corev1.Pod, rp *runningPod) error {
	cur, err := kl.client.CoreV1().Pods(kl.ns).Get(ctx, p.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	now, yes := metav1.Now(), true
	cur.Status.Phase = corev1.PodRunning
	cur.Status.HostIP = rp.node.Addr.String()
	cur.Status.HostIPs = []corev1.HostIP{{IP: rp.node.Addr.String()}}
	cur.Status.PodIP = rp.ip.String()
	cur.Status.PodIPs = []corev1.PodIP{{IP: rp.ip.String()}}
	cur.Status.StartTime = &now
	cur.Status.Conditions = nil
	for _, c := range []corev1.PodConditionType{corev1.PodScheduled, corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady} {
		cur.Status.Conditions = append(cur.Status.Conditions, corev1.PodCondition{Type: c, Status: corev1.ConditionTrue, LastTransitionTime: now})
	}
	c := p.Spec.Containers[0]
	cur.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: c.Name, Image: c.Image, ImageID: "e2e://" + c.Image,
		ContainerID: "e2e://" + p.Name, Ready: true, Started: &yes,
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}}}
	_, err = kl.client.CoreV1().Pods(kl.ns).UpdateStatus(ctx, cur, metav1.UpdateOptions{})
	return err
}

// stop sends SIGTERM to the container (ip netns exec, unshare and sh exec
// in place, so the PID is the command's), waits, and runs CNI DEL.
func (kl *kubelet) stop(rp *runningPod) {
	if rp.cmd != nil {
		rp.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-rp.done:
		case <-time.After(10 * time.Second):
			rp.cmd.Process.Kill()
			<-rp.done
			kl.t.Errorf("kubelet: %s did not stop within 10s of SIGTERM\n%s", rp.name, readTail(rp.log))
		}
	}
	if rp.pod == nil {
		return
	}
	if err := rp.node.CNI.Del(rp.pod); err != nil {
		kl.t.Errorf("kubelet: CNI DEL for %s: %v", rp.name, err)
	}
}

// Running is the number of containers running now.
func (kl *kubelet) Running() int {
	kl.mu.Lock()
	defer kl.mu.Unlock()
	return len(kl.running)
}

// Logs returns every container log's tail, for a failing test.
func (kl *kubelet) Logs() string {
	files, _ := filepath.Glob(filepath.Join(kl.dir, "*.log"))
	var b strings.Builder
	for _, f := range files {
		fmt.Fprintf(&b, "--- %s\n%s\n", filepath.Base(f), readTail(f))
	}
	return b.String()
}

func readTail(path string) string {
	b, _ := os.ReadFile(path)
	return tail(string(b), 30)
}

// forwardAPI makes the API server reachable on the same address inside ns
// (nettest's Forward, without failing the test from this goroutine).
func forwardAPI(t *testing.T, ns *nettest.NS, target string) error {
	ln, err := ns.Forward(target)
	if err != nil {
		return err
	}
	t.Cleanup(func() { ln.Close() })
	return nil
}
