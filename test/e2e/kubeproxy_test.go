package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weft-net/weft/internal/testkit/kubetest"
)

// svcProxyArgs keep kube-proxy from writing anything outside its network
// namespace: the conntrack table size and TCP timeouts are left as they
// are (nf_conntrack_max is global); everything else it sets is per
// namespace.
var svcProxyArgs = []string{
	"--conntrack-max-per-core=0",
	"--conntrack-tcp-timeout-established=0",
	"--conntrack-tcp-timeout-close-wait=0",
}

// proxyKubeconfig creates kube-proxy's ServiceAccount kube-system/kube-proxy
// bound to the ClusterRole system:node-proxier, as kubeadm does, and
// returns a kubeconfig for it.
func proxyKubeconfig(ctx context.Context, t *testing.T, k *kubetest.Cluster) string {
	t.Helper()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "kube-proxy", Namespace: "kube-system"}}
	if _, err := k.Client.CoreV1().ServiceAccounts("kube-system").Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	crb := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "kube-proxy"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "system:node-proxier"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "kube-proxy", Namespace: "kube-system"}}}
	if _, err := k.Client.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return saKubeconfig(ctx, t, k, "kube-system", "kube-proxy")
}

// startKubeProxy runs kube-proxy in n's namespace, as the node n.Label at
// its underlay address, until stopKubeProxy or the test's end.
func (e *svcEnv) startKubeProxy(t *testing.T, n *Node, args []string) {
	argv := append([]string{e.proxyBin,
		"--kubeconfig=" + e.proxyKubeconfig,
		"--hostname-override=" + n.Label,
		"--bind-address=" + n.Addr.String(),
		"--nodeport-addresses=" + n.Addr.String() + "/32",
		"--cluster-cidr=" + kubetest.ClusterCIDR,
		"--healthz-bind-address=127.0.0.1:10256",
		"--metrics-bind-address=127.0.0.1:10249",
		"--v=2",
	}, append(slices.Clone(svcProxyArgs), args...)...)
	logPath := filepath.Join(t.TempDir(), "kube-proxy-"+n.Label+".log")
	log, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := n.Command(context.Background(), argv...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait(); log.Close() }()
	stop := func() {
		if cmd.Process == nil {
			return
		}
		// ip netns exec execs kube-proxy in place: the PID is kube-proxy's.
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		cmd.Process = nil
	}
	e.stops[n] = stop
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("kube-proxy log of %s:\n%s", n.Label, tail(string(b), 40))
		}
	})
}

// stopKubeProxy stops n's kube-proxy and removes its rules with
// kube-proxy --cleanup, as an operator switching modes does.
func (e *svcEnv) stopKubeProxy(t *testing.T, n *Node) {
	e.stops[n]()
	if out, err := n.Run(e.proxyBin, "--cleanup", "--v=0"); err != nil {
		t.Errorf("kube-proxy --cleanup on %s: %v\n%s", n.Label, err, out)
	}
}

// svcSysctls are the root namespace's settings kube-proxy could change
// (conntrack table size and hash size, conntrack timeouts and liberal
// mode, forwarding, localhost routing, bridge netfilter).
var svcSysctls = []string{
	"/proc/sys/net/netfilter/nf_conntrack_max",
	"/proc/sys/net/netfilter/nf_conntrack_buckets",
	"/sys/module/nf_conntrack/parameters/hashsize",
	"/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_established",
	"/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_close_wait",
	"/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal",
	"/proc/sys/net/netfilter/nf_conntrack_udp_timeout",
	"/proc/sys/net/netfilter/nf_conntrack_udp_timeout_stream",
	"/proc/sys/net/ipv4/ip_forward",
	"/proc/sys/net/ipv4/conf/all/forwarding",
	"/proc/sys/net/ipv4/conf/all/route_localnet",
	"/proc/sys/net/ipv6/conf/all/forwarding",
	"/proc/sys/net/bridge/bridge-nf-call-iptables",
	"/proc/sys/net/ipv4/vs/conntrack",
}

// rootSysctls reads svcSysctls in the root network namespace (the one the
// test binary started in) on a thread checked to be in it. A file that does
// not exist reads as "absent".
func rootSysctls(t *testing.T) map[string]string {
	t.Helper()
	m := map[string]string{}
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		self, err := os.Readlink("/proc/thread-self/ns/net")
		if err != nil {
			done <- err
			return
		}
		want := startNetns
		if self != want {
			done <- fmt.Errorf("this thread is in %s, not the root network namespace %s", self, want)
			return
		}
		m["netns"] = self
		for _, p := range svcSysctls {
			b, err := os.ReadFile(p)
			switch {
			case errors.Is(err, os.ErrNotExist):
				m[p] = "absent"
			case err != nil:
				done <- err
				return
			default:
				m[p] = strings.TrimSpace(string(b))
			}
		}
		done <- nil
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	return m
}

// diffSysctls names every setting that differs.
func diffSysctls(before, after map[string]string) string {
	var d []string
	for _, p := range append([]string{"netns"}, svcSysctls...) {
		if before[p] != after[p] {
			d = append(d, fmt.Sprintf("%s %s → %s", p, before[p], after[p]))
		}
	}
	return strings.Join(d, "; ")
}
