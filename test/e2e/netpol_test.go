package e2e

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weft-net/weft/internal/testkit/nettest"
)

// npPod is a pod of the NetworkPolicy test: a namespace wired by the weft
// CNI plugin on a node, and the Pod object the test writes as a kubelet.
type npPod struct {
	ns, name, node string
	labels         map[string]string
	ports          []corev1.ContainerPort // named ports, for the evaluator too
	net            *nettest.NS
	ip             netip.Addr
}

func (p *npPod) id() string { return p.ns + "/" + p.name }

// probe is one attempt: a new TCP connection or a UDP request and its reply.
type probe struct {
	from, to *npPod
	proto    corev1.Protocol
	port     int
}

func (pr probe) String() string {
	return fmt.Sprintf("%s → %s %s/%d", pr.from.id(), pr.to.id(), pr.proto, pr.port)
}

// npPorts are the ports every pod serves, TCP and UDP each.
var npPorts = []int{80, 81}

// TestNetworkPolicyTruthTable runs weftd (network policy on, as in weft's
// manifest) on two vxlan nodes against a real apiserver, with pods in two
// namespaces on both nodes, and for a set of NetworkPolicies checks TCP and
// UDP from every pod to every other pod against the matrix an evaluator
// written from the API's documentation computes.
func TestNetworkPolicyTruthTable(t *testing.T) { truthTable(t) }

// TestNetworkPolicyTruthTableUVXLAN is the truth table on weft's userspace
// VXLAN dataplane, whose TAP device the forward hook sees as it sees the
// kernel's VXLAN device.
func TestNetworkPolicyTruthTableUVXLAN(t *testing.T) { truthTable(t, "--backend", "uvxlan") }

func truthTable(t *testing.T, args ...string) {
	e := newNPEnv(t, args...)
	x, y := "np-x", "np-y"
	n1Subnet := e.c.Nodes[0].Subnet().Masked().String()
	cases := []struct {
		name     string
		policies []*networkingv1.NetworkPolicy
	}{
		{"no policy", nil},
		{"deny all ingress in x", []*networkingv1.NetworkPolicy{npPolicy(x, "deny", nil, ingressOnly)}},
		{"allow from podSelector", []*networkingv1.NetworkPolicy{npPolicy(x, "from-b", sel("pod", "a"), ingressOnly,
			ingress(nil, peerPods(sel("pod", "b"))))}},
		{"allow from namespaceSelector", []*networkingv1.NetworkPolicy{npPolicy(x, "from-y", &metav1.LabelSelector{}, ingressOnly,
			ingress(nil, peerNS(sel("ns", "y"))))}},
		{"allow from namespace and pod selector", []*networkingv1.NetworkPolicy{npPolicy(y, "from-x-b", sel("pod", "a"), ingressOnly,
			ingress(nil, networkingv1.NetworkPolicyPeer{NamespaceSelector: sel("ns", "x"), PodSelector: sel("pod", "b")}))}},
		{"ipBlock with except", []*networkingv1.NetworkPolicy{npPolicy(x, "block", sel("pod", "b"), ingressOnly,
			ingress(nil, networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "10.244.0.0/16", Except: []string{n1Subnet}}}))}},
		{"named port", []*networkingv1.NetworkPolicy{npPolicy(x, "web", &metav1.LabelSelector{}, ingressOnly,
			ingress([]networkingv1.NetworkPolicyPort{namedPort(corev1.ProtocolTCP, "web")}))}},
		{"port range and protocol", []*networkingv1.NetworkPolicy{npPolicy(y, "range", &metav1.LabelSelector{}, ingressOnly,
			ingress([]networkingv1.NetworkPolicyPort{numPort(corev1.ProtocolTCP, 81, 0), numPort(corev1.ProtocolUDP, 80, 81)}))}},
		{"egress deny but DNS-like UDP", []*networkingv1.NetworkPolicy{npPolicy(x, "egress", &metav1.LabelSelector{}, egressOnly,
			egress([]networkingv1.NetworkPolicyPort{numPort(corev1.ProtocolUDP, 81, 0)}))}},
		{"egress named port", []*networkingv1.NetworkPolicy{npPolicy(x, "egress-web", sel("pod", "a"), egressOnly,
			egress([]networkingv1.NetworkPolicyPort{namedPort(corev1.ProtocolTCP, "web")}, peerNS(&metav1.LabelSelector{})))}},
		{"ingress and egress", []*networkingv1.NetworkPolicy{npPolicy(y, "both", sel("pod", "b"), both,
			ingress(nil, peerNS(sel("ns", "x"))), egress([]networkingv1.NetworkPolicyPort{numPort(corev1.ProtocolTCP, 80, 0)}, peerPods(sel("pod", "a"))))}},
	}
	var all []*networkingv1.NetworkPolicy
	for _, c := range cases[1:] {
		for _, p := range c.policies {
			q := p.DeepCopy()
			q.Name = "all-" + q.Name
			all = append(all, q)
		}
	}
	cases = append(cases, struct {
		name     string
		policies []*networkingv1.NetworkPolicy
	}{"all of them together", all})
	for _, c := range cases {
		t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) {
			e.apply(t, c.policies)
			want := e.expected(c.policies)
			var got map[probe]bool
			took := Eventually(t, 15*time.Second, "matrix as expected", func() error {
				got = e.matrix()
				return diff(want, got)
			})
			// twice in a row: not a passing moment of a change in progress
			if err := diff(want, e.matrix()); err != nil {
				t.Error(err)
			}
			t.Logf("%d probes as expected (%d allowed) after %s", len(want), countTrue(want), took.Round(time.Millisecond))
		})
	}
}

// TestNetworkPolicyEstablished: a connection open when a policy starts to
// deny its pods keeps working, new ones are refused, except from the pod's
// own node; when the policy goes, new connections work again.
func TestNetworkPolicyEstablished(t *testing.T) {
	e := newNPEnv(t)
	from, to := e.pod("np-y", "a"), e.pod("np-x", "b") // n1 → n2
	conn := dialFrom(t, from, to, 80)
	defer conn.Close()
	echo(t, conn, "before")
	e.apply(t, []*networkingv1.NetworkPolicy{npPolicy("np-x", "deny", nil, ingressOnly)})
	Eventually(t, 10*time.Second, "new connection refused", func() error {
		if try(probe{from, to, corev1.ProtocolTCP, 80}) {
			return errors.New("still allowed")
		}
		return nil
	})
	echo(t, conn, "during") // established: kept
	// The review's bypass: c, isolated, answered a pod of its own node
	// over its IPv6 link-local address, which the IPv4 rules never saw.
	// The node itself still reaches that address (not forwarded).
	neighbour, isolated := e.pod("np-y", "a"), e.pod("np-x", "c") // both on n1
	ll := linkLocalOf(t, isolated)
	Eventually(t, 10*time.Second, "n1 pings "+isolated.id()+"'s link-local address", func() error {
		_, err := e.c.Nodes[0].NS.Run("ping", "-c", "1", "-W", "1", ll+"%cni0")
		return err
	})
	if _, err := neighbour.net.Run("ping", "-c", "1", "-W", "1", ll+"%eth0"); err == nil {
		t.Errorf("%s reached the isolated %s over its link-local address %s", neighbour.id(), isolated.id(), ll)
	}
	if try(probe{neighbour, isolated, corev1.ProtocolTCP, 80}) {
		t.Errorf("%s reached the isolated %s over IPv4", neighbour.id(), isolated.id())
	}
	// The node itself still reaches its pods (kubelet probes); another
	// node's host does not.
	for _, n := range e.c.Nodes {
		host := &npPod{ns: "host", name: n.Label, net: n.NS}
		if got, want := try(probe{host, to, corev1.ProtocolTCP, 80}), n.Label == to.node; got != want {
			t.Errorf("from %s's host to %s (on %s): allowed %v, want %v", n.Label, to.id(), to.node, got, want)
		}
	}
	e.apply(t, nil)
	Eventually(t, 10*time.Second, "new connection allowed", func() error {
		if !try(probe{from, to, corev1.ProtocolTCP, 80}) {
			return errors.New("still refused")
		}
		return nil
	})
	echo(t, conn, "after")
}

// linkLocalOf is the link-local address of the pod's eth0, once its
// duplicate address detection is over.
func linkLocalOf(t *testing.T, p *npPod) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, err := p.net.Run("ip", "-6", "-o", "addr", "show", "dev", "eth0", "scope", "link")
		if f := strings.Fields(out); err == nil && len(f) > 3 && !strings.Contains(out, "tentative") {
			a, _, _ := strings.Cut(f[3], "/")
			return a
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no link-local address on eth0: %q %v", p.id(), out, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestNetworkPolicySpoofedSource: np-x/a accepts only np-x/b (on n2).
// np-x/c, on a's node, takes b's address and sends UDP to a from it: the
// bridge's source checks drop it before the policy sees b's address. A
// counter in a's namespace counts what arrives; c's own datagrams from
// its own address (refused by the policy) are not counted either, and the
// real b's are.
func TestNetworkPolicySpoofedSource(t *testing.T) {
	e := newNPEnv(t)
	a, b, c := e.pod("np-x", "a"), e.pod("np-x", "b"), e.pod("np-x", "c")
	e.apply(t, []*networkingv1.NetworkPolicy{npPolicy("np-x", "from-b", sel("pod", "a"), ingressOnly, ingress(nil, peerPods(sel("pod", "b"))))})
	Eventually(t, 10*time.Second, "b allowed, c refused", func() error {
		if !try(probe{b, a, corev1.ProtocolUDP, 80}) || try(probe{c, a, corev1.ProtocolUDP, 80}) {
			return errors.New("not yet")
		}
		return nil
	})
	for _, argv := range [][]string{
		{"nft", "add", "table", "inet", "spoofcount"},
		{"nft", "add", "chain", "inet", "spoofcount", "in", "{ type filter hook input priority 0; }"},
		{"nft", "add", "rule", "inet", "spoofcount", "in", "ip", "saddr", b.ip.String(), "udp", "dport", "81", "counter"},
	} {
		nettest.MustRun(t, a.net, argv...)
	}
	nettest.MustRun(t, c.net, "ip", "addr", "add", b.ip.String()+"/32", "dev", "eth0")
	if err := c.net.Do(func() error {
		conn, err := net.DialUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(b.ip, 40000)), net.UDPAddrFromAddrPort(netip.AddrPortFrom(a.ip, 81)))
		if err != nil {
			return err
		}
		defer conn.Close()
		for range 5 {
			if _, err := conn.Write([]byte("forged")); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatalf("forging b's address from c: %v", err)
	}
	time.Sleep(500 * time.Millisecond)
	out := nettest.MustRun(t, a.net, "nft", "list", "table", "inet", "spoofcount")
	if !strings.Contains(out, "counter packets 0 ") {
		t.Errorf("datagrams with b's forged address reached a:\n%s", out)
	}
	if !try(probe{b, a, corev1.ProtocolUDP, 81}) {
		t.Error("the real b no longer reaches a")
	}
	if out := nettest.MustRun(t, a.net, "nft", "list", "table", "inet", "spoofcount"); strings.Contains(out, "counter packets 0 ") {
		t.Errorf("the counter did not see the real b either (a broken check):\n%s", out)
	}
}

func echo(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatalf("open connection, %s: %v", msg, err)
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != msg {
		t.Fatalf("open connection, %s: %q %v", msg, buf, err)
	}
}
