package policy

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// makeRule builds one ingress (egress false) or egress rule for targets.
func makeRule(name string, egress bool, targets []pod, peers []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort,
	policyNS string, pods []pod, nsLabels map[string]labels.Set, everyAddr Range) (Rule, error) {
	r := Rule{Name: name, Egress: egress, AnyPeer: len(peers) == 0, AllPorts: len(ports) == 0}
	for _, t := range targets {
		r.Local = append(r.Local, t.ip)
	}
	var peerPods []pod
	var ranges []Range
	for j, peer := range peers {
		pp, rs, err := peerOf(peer, policyNS, pods, nsLabels, everyAddr.First.Is4())
		if err != nil {
			return Rule{}, fmt.Errorf("peer %d: %w", j, err)
		}
		peerPods = append(peerPods, pp...)
		ranges = append(ranges, rs...)
	}
	for _, p := range peerPods {
		ranges = append(ranges, Range{p.ip, p.ip})
	}
	r.Peers = merge(ranges)
	if r.AnyPeer {
		peerPods, r.Peers = pods, nil
	}
	for j, port := range ports {
		proto, err := protocol(port.Protocol)
		if err != nil {
			return Rule{}, fmt.Errorf("port %d: %w", j, err)
		}
		entries, err := portEntries(port, proto, egress, targets, r.AnyPeer, r.Peers, peerPods, everyAddr)
		if err != nil {
			return Rule{}, fmt.Errorf("port %d: %w", j, err)
		}
		if egress && port.Port != nil && port.Port.Type != 0 {
			r.NamedPorts = append(r.NamedPorts, entries...)
		} else {
			r.Ports = append(r.Ports, entries...)
		}
	}
	r.Ports, r.NamedPorts = normalize(r.Ports), normalize(r.NamedPorts)
	return r, nil
}

// portEntries is the (address, protocol, ports) entries of one port of a
// rule. A named port is resolved against the destination pod: the local
// pod for ingress, each peer pod for egress (a pod without that port name
// adds nothing).
func portEntries(port networkingv1.NetworkPolicyPort, proto uint8, egress bool, targets []pod, anyPeer bool, peers []Range, peerPods []pod, everything Range) ([]PortEntry, error) {
	dests := func(first, last uint16) []PortEntry {
		var out []PortEntry
		switch {
		case !egress:
			for _, t := range targets {
				out = append(out, PortEntry{Range{t.ip, t.ip}, proto, first, last})
			}
		case anyPeer:
			out = append(out, PortEntry{everything, proto, first, last})
		default:
			for _, p := range peers {
				out = append(out, PortEntry{p, proto, first, last})
			}
		}
		return out
	}
	switch {
	case port.Port == nil:
		if port.EndPort != nil {
			return nil, fmt.Errorf("endPort %d without port", *port.EndPort)
		}
		return dests(0, 65535), nil
	case port.Port.Type == 0: // number
		first, last := port.Port.IntVal, port.Port.IntVal
		if port.EndPort != nil {
			last = *port.EndPort
		}
		if first < 1 || first > 65535 || last < first || last > 65535 {
			return nil, fmt.Errorf("port %d, endPort %d: not a port range", first, last)
		}
		return dests(uint16(first), uint16(last)), nil
	}
	if port.EndPort != nil {
		return nil, fmt.Errorf("endPort with the named port %q", port.Port.StrVal)
	}
	candidates := targets
	if egress {
		candidates = nil
		for _, p := range peerPods {
			if anyPeer || contains(peers, p.ip) {
				candidates = append(candidates, p)
			}
		}
	}
	var out []PortEntry
	for _, p := range candidates {
		for _, cp := range p.ports {
			if cp.Name == port.Port.StrVal && protoOrTCP(cp.Protocol) == proto {
				out = append(out, PortEntry{Range{p.ip, p.ip}, proto, uint16(cp.ContainerPort), uint16(cp.ContainerPort)})
			}
		}
	}
	return out, nil
}

func protoOrTCP(p corev1.Protocol) uint8 {
	n, err := protocol(&p)
	if err != nil {
		return 0
	}
	return n
}

// protocol is the protocol number of p (TCP when unset).
func protocol(p *corev1.Protocol) (uint8, error) {
	if p == nil || *p == "" {
		return protoTCP, nil
	}
	switch *p {
	case corev1.ProtocolTCP:
		return protoTCP, nil
	case corev1.ProtocolUDP:
		return protoUDP, nil
	case corev1.ProtocolSCTP:
		return protoSCTP, nil
	}
	return 0, fmt.Errorf("protocol %q: not TCP, UDP or SCTP", *p)
}

// peerOf is the pods a peer selects and the address ranges of its ipBlock.
func peerOf(peer networkingv1.NetworkPolicyPeer, policyNS string, pods []pod, nsLabels map[string]labels.Set, v4 bool) ([]pod, []Range, error) {
	if peer.IPBlock != nil {
		if peer.PodSelector != nil || peer.NamespaceSelector != nil {
			return nil, nil, fmt.Errorf("ipBlock with a selector")
		}
		rs, err := ipBlock(peer.IPBlock, v4)
		return nil, rs, err
	}
	if peer.PodSelector == nil && peer.NamespaceSelector == nil {
		return nil, nil, fmt.Errorf("peer with neither selector nor ipBlock")
	}
	podSel, nsSel := labels.Everything(), labels.Nothing()
	var err error
	if peer.PodSelector != nil {
		if podSel, err = selector(peer.PodSelector); err != nil {
			return nil, nil, fmt.Errorf("podSelector: %w", err)
		}
	}
	if peer.NamespaceSelector != nil {
		if nsSel, err = selector(peer.NamespaceSelector); err != nil {
			return nil, nil, fmt.Errorf("namespaceSelector: %w", err)
		}
	}
	var out []pod
	for _, p := range pods {
		inNS := p.ns == policyNS
		if peer.NamespaceSelector != nil {
			l, known := nsLabels[p.ns]
			inNS = known && nsSel.Matches(l)
		}
		if inNS && podSel.Matches(p.labels) {
			out = append(out, p)
		}
	}
	return out, nil, nil
}

// ipBlock is the ranges of b of the family (IPv4 when v4): its CIDR
// without its exceptions. A block of the other family matches no address
// of this one: no range.
func ipBlock(b *networkingv1.IPBlock, v4 bool) ([]Range, error) {
	cidr, err := netip.ParsePrefix(b.CIDR)
	if err != nil {
		return nil, fmt.Errorf("ipBlock cidr %q: %w", b.CIDR, err)
	}
	var cut []Range
	for _, e := range b.Except {
		p, err := netip.ParsePrefix(e)
		if err != nil {
			return nil, fmt.Errorf("ipBlock except %q: %w", e, err)
		}
		if p.Addr().Is4() != cidr.Addr().Is4() {
			return nil, fmt.Errorf("ipBlock except %s: not the family of %s", p, cidr)
		}
		cut = append(cut, prefixRange(p))
	}
	if cidr.Addr().Is4() != v4 {
		return nil, nil
	}
	return subtract(prefixRange(cidr), cut), nil
}

// normalize sorts es and merges the port ranges of entries with the same
// addresses and protocol, so that no two overlap: the addresses of the
// entries given are either equal or disjoint.
func normalize(es []PortEntry) []PortEntry {
	slices.SortFunc(es, func(a, b PortEntry) int {
		return cmp.Or(a.Addr.First.Compare(b.Addr.First), a.Addr.Last.Compare(b.Addr.Last),
			cmp.Compare(a.Proto, b.Proto), cmp.Compare(a.First, b.First), cmp.Compare(a.Last, b.Last))
	})
	var out []PortEntry
	for _, e := range es {
		if n := len(out); n > 0 {
			o := &out[n-1]
			if o.Addr == e.Addr && o.Proto == e.Proto && uint32(e.First) <= uint32(o.Last)+1 {
				o.Last = max(o.Last, e.Last)
				continue
			}
		}
		out = append(out, e)
	}
	return out
}
