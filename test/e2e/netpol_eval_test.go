package e2e

import (
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// The evaluator below is written from the NetworkPolicy API documentation
// (kubernetes.io/docs/concepts/services-networking/network-policies and
// the networking/v1 field docs), independently of weft's policy package:
// a connection is allowed when the destination's ingress and the source's
// egress both allow it; a pod no policy of a direction selects is open in
// that direction; policies add up.

// expected is whether each probe of the matrix should get through under ps.
func (e *npEnv) expected(ps []*networkingv1.NetworkPolicy) map[probe]bool {
	nsLabels := map[string]labels.Set{}
	list, err := e.k.Client.CoreV1().Namespaces().List(e.ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	for _, n := range list.Items {
		nsLabels[n.Name] = n.Labels
	}
	out := map[probe]bool{}
	for _, pr := range e.probes() {
		out[pr] = evalDirection(ps, nsLabels, pr, false) && evalDirection(ps, nsLabels, pr, true)
	}
	return out
}

// evalDirection: does the destination's ingress (egress false) or the
// source's egress allow pr?
func evalDirection(ps []*networkingv1.NetworkPolicy, nsLabels map[string]labels.Set, pr probe, egress bool) bool {
	self, other := pr.to, pr.from
	if egress {
		self, other = pr.from, pr.to
	}
	isolated := false
	for _, p := range ps {
		if p.Namespace != self.ns || !matches(&p.Spec.PodSelector, self.labels) || !hasType(p, egress) {
			continue
		}
		isolated = true
		if egress {
			for _, r := range p.Spec.Egress {
				if peersAllow(r.To, p.Namespace, nsLabels, other) && portsAllow(r.Ports, pr) {
					return true
				}
			}
		} else {
			for _, r := range p.Spec.Ingress {
				if peersAllow(r.From, p.Namespace, nsLabels, other) && portsAllow(r.Ports, pr) {
					return true
				}
			}
		}
	}
	return !isolated
}

// hasType: policyTypes lists the direction; left out, Ingress always and
// Egress when the policy has egress rules.
func hasType(p *networkingv1.NetworkPolicy, egress bool) bool {
	want := networkingv1.PolicyTypeIngress
	if egress {
		want = networkingv1.PolicyTypeEgress
	}
	if len(p.Spec.PolicyTypes) == 0 {
		return !egress || len(p.Spec.Egress) > 0
	}
	for _, t := range p.Spec.PolicyTypes {
		if t == want {
			return true
		}
	}
	return false
}

func matches(s *metav1.LabelSelector, l map[string]string) bool {
	sel, err := metav1.LabelSelectorAsSelector(s)
	if err != nil {
		panic(err)
	}
	return sel.Matches(labels.Set(l))
}

// peersAllow: an empty list allows every peer; otherwise one must match.
func peersAllow(peers []networkingv1.NetworkPolicyPeer, policyNS string, nsLabels map[string]labels.Set, p *npPod) bool {
	if len(peers) == 0 {
		return true
	}
	for _, peer := range peers {
		if b := peer.IPBlock; b != nil {
			if inCIDR(b.CIDR, p.ip) && !anyCIDR(b.Except, p.ip) {
				return true
			}
			continue
		}
		nsOK := p.ns == policyNS // a podSelector alone: the policy's namespace
		if peer.NamespaceSelector != nil {
			nsOK = matches(peer.NamespaceSelector, nsLabels[p.ns])
		}
		podOK := peer.PodSelector == nil || matches(peer.PodSelector, p.labels)
		if nsOK && podOK {
			return true
		}
	}
	return false
}

func inCIDR(cidr string, a netip.Addr) bool { return netip.MustParsePrefix(cidr).Contains(a) }
func anyCIDR(cidrs []string, a netip.Addr) bool {
	for _, c := range cidrs {
		if inCIDR(c, a) {
			return true
		}
	}
	return false
}

// portsAllow: an empty list allows every port and protocol; a port entry
// matches its protocol (TCP if unset) and its number, range (port to
// endPort) or name, which names a container port of the destination pod.
func portsAllow(ports []networkingv1.NetworkPolicyPort, pr probe) bool {
	if len(ports) == 0 {
		return true
	}
	for _, p := range ports {
		proto := corev1.ProtocolTCP
		if p.Protocol != nil {
			proto = *p.Protocol
		}
		if proto != pr.proto {
			continue
		}
		switch {
		case p.Port == nil:
			return true
		case p.Port.StrVal != "":
			for _, cp := range pr.to.ports {
				if cp.Name == p.Port.StrVal && cp.Protocol == proto && int(cp.ContainerPort) == pr.port {
					return true
				}
			}
		default:
			last := p.Port.IntVal
			if p.EndPort != nil {
				last = *p.EndPort
			}
			if int(p.Port.IntVal) <= pr.port && pr.port <= int(last) {
				return true
			}
		}
	}
	return false
}
