package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/weft-net/weft/internal/testkit/kubetest"
	"github.com/weft-net/weft/internal/testkit/nettest"
)

// npEnv is the cluster of the NetworkPolicy tests.
type npEnv struct {
	t    *testing.T
	ctx  context.Context
	k    *kubetest.Cluster
	c    *Cluster
	pods []*npPod
}

func newNPEnv(t *testing.T, args ...string) *npEnv {
	k := kubetest.Start(t)
	k.StartControllers(t, "nodeipam")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	t.Cleanup(cancel)
	netConf := applyManifests(ctx, t, k)
	kubeconfig := saKubeconfig(ctx, t, k, "kube-weft", "weft")
	e := &npEnv{t: t, ctx: ctx, k: k, c: NewCluster(t, Options{Nodes: 0})}
	apiserver := strings.TrimPrefix(k.Admin.Host, "https://")
	e.c.OnNode = func(n *Node) { nettest.ForwardLoopback(t, n, apiserver) }
	for _, name := range []string{"n1", "n2"} {
		createNode(ctx, t, k, name)
		// the node's CNI address store (plugintest: <node dir>/cni/<network>)
		store := filepath.Join(e.c.Dir, name, "cni", "weft")
		e.c.AddNode(name, append([]string{"--kube-subnet-mgr", "--kubeconfig", kubeconfig, "--node-name", name, "--net-config-path", netConf,
			"--pod-address-store", store}, args...)...)
	}
	for _, n := range e.c.Nodes {
		n.WaitReady()
	}
	for _, ns := range []string{"x", "y"} {
		e.createNamespace("np-"+ns, map[string]string{"ns": ns})
	}
	// a and c on n1, b on n2, in both namespaces; the named port "web" is
	// TCP 80 on a, TCP 81 on b and c (two numbers on one node).
	for _, ns := range []string{"np-x", "np-y"} {
		for _, p := range []struct {
			name string
			node int
			web  int32
		}{{"a", 0, 80}, {"b", 1, 81}, {"c", 0, 81}} {
			e.addPod(ns, p.name, e.c.Nodes[p.node], p.web)
		}
	}
	return e
}

func (e *npEnv) createNamespace(name string, labels map[string]string) {
	t := e.t
	if _, err := e.k.Client.CoreV1().Namespaces().Create(e.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "np", Namespace: name}}
	if _, err := e.k.Client.CoreV1().ServiceAccounts(name).Create(e.ctx, sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// addPod wires a pod on n with the CNI plugin, starts its servers and
// writes its Pod object with its IP in the status, as a kubelet would.
func (e *npEnv) addPod(ns, name string, n *Node, web int32) {
	t := e.t
	cp := n.CNI.AddPod(t, ns[len(ns)-1:]+name)
	p := &npPod{ns: ns, name: name, node: n.Label, labels: map[string]string{"pod": name}, net: cp.NS, ip: cp.IP,
		ports: []corev1.ContainerPort{{Name: "web", ContainerPort: web, Protocol: corev1.ProtocolTCP}}}
	serve(t, p)
	no := false
	obj := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: p.labels},
		Spec: corev1.PodSpec{NodeName: n.Label, ServiceAccountName: "np", AutomountServiceAccountToken: &no,
			Containers: []corev1.Container{{Name: "srv", Image: "srv", Ports: p.ports}}}}
	pods := e.k.Client.CoreV1().Pods(ns)
	obj, err := pods.Create(e.ctx, obj, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	obj.Status.Phase = corev1.PodRunning
	obj.Status.PodIP = p.ip.String()
	obj.Status.PodIPs = []corev1.PodIP{{IP: p.ip.String()}}
	if _, err := pods.UpdateStatus(e.ctx, obj, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.pods = append(e.pods, p)
}

func (e *npEnv) pod(ns, name string) *npPod {
	for _, p := range e.pods {
		if p.ns == ns && p.name == name {
			return p
		}
	}
	e.t.Fatalf("no pod %s/%s", ns, name)
	return nil
}

// apply makes the test namespaces' policies exactly ps.
func (e *npEnv) apply(t *testing.T, ps []*networkingv1.NetworkPolicy) {
	t.Helper()
	for _, ns := range []string{"np-x", "np-y"} {
		if err := e.k.Client.NetworkingV1().NetworkPolicies(ns).DeleteCollection(e.ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range ps {
		if _, err := e.k.Client.NetworkingV1().NetworkPolicies(p.Namespace).Create(e.ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create %s/%s: %v", p.Namespace, p.Name, err)
		}
	}
}

// probes is every probe of the matrix: each pod to each other pod, TCP and
// UDP, on each port.
func (e *npEnv) probes() []probe {
	var out []probe
	for _, from := range e.pods {
		for _, to := range e.pods {
			if from == to {
				continue
			}
			for _, proto := range []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP} {
				for _, port := range npPorts {
					out = append(out, probe{from, to, proto, port})
				}
			}
		}
	}
	return out
}

// matrix runs every probe, 40 at a time.
func (e *npEnv) matrix() map[probe]bool {
	ps := e.probes()
	out := make(map[probe]bool, len(ps))
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 40)
	for _, pr := range ps {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			ok := try(pr)
			mu.Lock()
			out[pr] = ok
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

const probeTimeout = 600 * time.Millisecond

// try reports whether the probe got through: a TCP connection that echoes,
// or a UDP datagram answered.
func try(pr probe) bool { return tryWithin(pr, probeTimeout) }

// UDP probes take their source ports in turn from 20000 to 32767, below the
// kernel's ephemeral range: thousands of probes pass before one is reused,
// minutes later, long after conntrack forgot the flow.
const udpProbePortBase, udpProbePorts = 20000, 12768

var udpProbePort atomic.Uint32

func nextUDPProbePort() int { return udpProbePortBase + int(udpProbePort.Add(1)%udpProbePorts) }

// tryWithin is try with a timeout of its own.
func tryWithin(pr probe, probeTimeout time.Duration) bool {
	network := "tcp4"
	if pr.proto == corev1.ProtocolUDP {
		network = "udp4"
	}
	var c net.Conn
	err := pr.from.net.Do(func() error {
		d := net.Dialer{Timeout: probeTimeout}
		if network != "udp4" {
			var err error
			c, err = d.Dial(network, netip.AddrPortFrom(pr.to.ip, uint16(pr.port)).String())
			return err
		}
		// Each UDP probe from its own source port: conntrack keeps a UDP
		// flow for up to 120 s after its last datagram, so a probe that
		// happened to reuse the ephemeral port of an earlier probe that a
		// policy then allowed would continue that flow, accepted as
		// established (TestNetworkPolicyEstablished's case), where the
		// truth table asks about new flows.
		for range udpProbePorts {
			d.LocalAddr = &net.UDPAddr{Port: nextUDPProbePort()}
			var err error
			if c, err = d.Dial(network, netip.AddrPortFrom(pr.to.ip, uint16(pr.port)).String()); !errors.Is(err, syscall.EADDRINUSE) {
				return err
			}
		}
		return errors.New("no free UDP source port for the probe")
	})
	if err != nil {
		return false
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(probeTimeout))
	if _, err := c.Write([]byte("ping")); err != nil {
		return false
	}
	buf := make([]byte, 4)
	_, err = io.ReadFull(c, buf)
	return err == nil && string(buf) == "ping"
}

func dialFrom(t *testing.T, from, to *npPod, port int) net.Conn {
	t.Helper()
	var c net.Conn
	if err := from.net.Do(func() error {
		var err error
		c, err = net.DialTimeout("tcp4", netip.AddrPortFrom(to.ip, uint16(port)).String(), 2*time.Second)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return c
}

// serve starts echo servers on every port of npPorts, TCP and UDP, in the
// pod; they stop when the test ends.
func serve(t *testing.T, p *npPod) {
	var closers []io.Closer
	err := p.net.Do(func() error {
		for _, port := range npPorts {
			l, err := net.Listen("tcp4", fmt.Sprintf(":%d", port))
			if err != nil {
				return err
			}
			u, err := net.ListenPacket("udp4", fmt.Sprintf(":%d", port))
			if err != nil {
				return err
			}
			closers = append(closers, l, u)
			go func() {
				for {
					c, err := l.Accept()
					if err != nil {
						return
					}
					go func() { defer c.Close(); io.Copy(c, c) }()
				}
			}()
			go func() {
				buf := make([]byte, 1500)
				for {
					n, from, err := u.ReadFrom(buf)
					if err != nil {
						return
					}
					u.WriteTo(buf[:n], from)
				}
			}()
		}
		return nil
	})
	t.Cleanup(func() {
		for _, c := range closers {
			c.Close()
		}
	})
	if err != nil {
		t.Fatalf("servers in %s: %v", p.id(), err)
	}
}

func diff(want, got map[probe]bool) error {
	var bad []string
	for pr, w := range want {
		if got[pr] != w {
			bad = append(bad, fmt.Sprintf("%s: want allowed=%v, got %v", pr, w, got[pr]))
		}
	}
	if len(bad) == 0 {
		return nil
	}
	sort.Strings(bad)
	return fmt.Errorf("%d of %d probes wrong:\n%s", len(bad), len(want), strings.Join(bad, "\n"))
}

func countTrue(m map[probe]bool) int {
	n := 0
	for _, v := range m {
		if v {
			n++
		}
	}
	return n
}

// Policy builders.

var (
	ingressOnly = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	egressOnly  = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
	both        = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
)

type npRule struct {
	egress bool
	ports  []networkingv1.NetworkPolicyPort
	peers  []networkingv1.NetworkPolicyPeer
}

func ingress(ports []networkingv1.NetworkPolicyPort, peers ...networkingv1.NetworkPolicyPeer) npRule {
	return npRule{false, ports, peers}
}
func egress(ports []networkingv1.NetworkPolicyPort, peers ...networkingv1.NetworkPolicyPeer) npRule {
	return npRule{true, ports, peers}
}

func npPolicy(ns, name string, pods *metav1.LabelSelector, types []networkingv1.PolicyType, rules ...npRule) *networkingv1.NetworkPolicy {
	p := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: networkingv1.NetworkPolicySpec{PolicyTypes: types}}
	if pods != nil {
		p.Spec.PodSelector = *pods
	}
	for _, r := range rules {
		if r.egress {
			p.Spec.Egress = append(p.Spec.Egress, networkingv1.NetworkPolicyEgressRule{Ports: r.ports, To: r.peers})
		} else {
			p.Spec.Ingress = append(p.Spec.Ingress, networkingv1.NetworkPolicyIngressRule{Ports: r.ports, From: r.peers})
		}
	}
	return p
}

func sel(k, v string) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchLabels: map[string]string{k: v}}
}
func peerPods(s *metav1.LabelSelector) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{PodSelector: s}
}
func peerNS(s *metav1.LabelSelector) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{NamespaceSelector: s}
}
func numPort(proto corev1.Protocol, port, end int32) networkingv1.NetworkPolicyPort {
	p := networkingv1.NetworkPolicyPort{Protocol: &proto, Port: &intstr.IntOrString{IntVal: port}}
	if end != 0 {
		p.EndPort = &end
	}
	return p
}
func namedPort(proto corev1.Protocol, name string) networkingv1.NetworkPolicyPort {
	return networkingv1.NetworkPolicyPort{Protocol: &proto, Port: &intstr.IntOrString{Type: intstr.String, StrVal: name}}
}
