package policy

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Protocol numbers as the IP header carries them.
const (
	protoTCP  = 6
	protoUDP  = 17
	protoSCTP = 132
)

// Plan is what the node must enforce: the local pods isolated for ingress
// and for egress, and the rules that allow traffic to or from them.
type Plan struct {
	IngressIsolated, EgressIsolated []netip.Addr
	Rules                           []Rule
	// V6 says the plan is of IPv6 pod addresses (else IPv4).
	V6 bool
	// Ports are the node's pods' addresses of the family and their bridge
	// ports: a frame that enters the bridge from one of these ports with
	// a source address (IP, or ARP sender) not among its port's is dropped.
	// Compute leaves it empty (the controller reads the address store).
	Ports []PodPort
	// Bridge is the name of the node's pod bridge (empty: DefaultBridge),
	// whose bridged IPv6 link-local traffic is dropped; the plans of one
	// node name the same bridge.
	Bridge string
	// IngressBy and EgressBy group the isolated pods by the policies that
	// select them (for the verdict log: a drop names the policies that
	// isolate its pod). Compute fills them; a plan without them logs no
	// drops.
	IngressBy, EgressBy []Isolation
	// LogGroup is the NFLOG group the drops of isolated pods are logged
	// to (0: not logged). The controller sets it from Config.LogGroup.
	LogGroup uint16
	// Errors are the policies that could not be read (a selector or a
	// port the API should have refused). Their pods stay isolated as the
	// policy's types say, with none of its rules: closed, not open. When
	// the podSelector itself cannot be read, every pod of the policy's
	// namespace is isolated.
	Errors []error
}

// Isolation is a group of local pods isolated (for ingress or for
// egress) by the same policies, named "namespace/name" and sorted.
type Isolation struct {
	Policies []string
	Addrs    []netip.Addr
}

// Rule is one entry of a policy's ingress or egress list, for this node's
// pods. It allows traffic when the local pod is in Local and
//   - AllPorts: the peer is in Peers (AnyPeer: any address);
//   - otherwise: (address, protocol, port) is in Ports, where address is
//     the destination: the local pod for ingress, the peer for egress. For
//     ingress the peer must also be in Peers (or AnyPeer); for egress
//     NamedPorts allow too.
//
// The entries of Ports, and those of NamedPorts, never overlap.
type Rule struct {
	Name     string // namespace/policy ingress|egress index
	Egress   bool
	Local    []netip.Addr
	AnyPeer  bool
	Peers    []Range
	AllPorts bool
	Ports    []PortEntry
	// NamedPorts are the egress entries of named ports, one peer pod
	// each; they may overlap Ports, so they go in a set of their own.
	NamedPorts []PortEntry
}

// PortEntry is an address range, a protocol and a port range.
type PortEntry struct {
	Addr        Range
	Proto       uint8
	First, Last uint16
}

// pod is what the plan needs of a pod.
type pod struct {
	ns     string
	name   string
	labels labels.Set
	ip     netip.Addr
	ports  []corev1.ContainerPort
}

// Input is the cluster state the plan is computed from.
type Input struct {
	Policies   []*networkingv1.NetworkPolicy
	Pods       []*corev1.Pod
	Namespaces []*corev1.Namespace
	// Local is this node's pod subnet of one family (IPv4 or IPv6): the
	// pods with an address in it are enforced, and the plan is of that
	// family only (pods' addresses and ipBlocks of the other are left out).
	Local netip.Prefix
}

// Compute is the plan for in.
func Compute(in Input) Plan {
	pods := podsOf(in.Pods, in.Local.Addr().Is4())
	nsLabels := map[string]labels.Set{}
	for _, n := range in.Namespaces {
		nsLabels[n.Name] = labels.Set(n.Labels)
	}
	plan := Plan{V6: !in.Local.Addr().Is4()}
	ingress, egress := map[netip.Addr][]string{}, map[netip.Addr][]string{}
	for _, np := range in.Policies {
		name := np.Namespace + "/" + np.Name
		rules, ing, eg, err := policyRules(np, pods, nsLabels, in.Local)
		if err != nil {
			plan.Errors = append(plan.Errors, fmt.Errorf("networkpolicy %s/%s: %w", np.Namespace, np.Name, err))
		}
		plan.Rules = append(plan.Rules, rules...)
		for _, a := range ing {
			ingress[a] = append(ingress[a], name)
		}
		for _, a := range eg {
			egress[a] = append(egress[a], name)
		}
	}
	plan.IngressIsolated, plan.EgressIsolated = sortedKeys(ingress), sortedKeys(egress)
	plan.IngressBy, plan.EgressBy = groupBy(plan.IngressIsolated, ingress), groupBy(plan.EgressIsolated, egress)
	return plan
}

// groupBy groups addrs (sorted) by the policies byAddr lists for them, in
// the order of the groups' first addresses.
func groupBy(addrs []netip.Addr, byAddr map[netip.Addr][]string) []Isolation {
	var out []Isolation
	index := map[string]int{}
	for _, a := range addrs {
		ps := slices.Clone(byAddr[a])
		slices.Sort(ps)
		ps = slices.Compact(ps)
		key := strings.Join(ps, " ")
		i, ok := index[key]
		if !ok {
			i = len(out)
			index[key] = i
			out = append(out, Isolation{Policies: ps})
		}
		out[i].Addrs = append(out[i].Addrs, a)
	}
	return out
}

func sortedKeys[V any](m map[netip.Addr]V) []netip.Addr {
	out := make([]netip.Addr, 0, len(m))
	for a := range m {
		out = append(out, a)
	}
	slices.SortFunc(out, func(a, b netip.Addr) int { return a.Compare(b) })
	return out
}

// podsOf keeps the pods that have an address of their own in the family
// (IPv4 when v4): not on the host network, not finished (phase Succeeded
// or Failed: their address may be another pod's already). When two pods
// list the same address, the one created last has it: the older one is a
// pod whose status was not updated since its address was freed and given
// again, and its labels must not decide who the address is.
func podsOf(ps []*corev1.Pod, v4 bool) []pod {
	byIP := map[netip.Addr]int{}
	var out []pod
	var born []metav1.Time
	for _, p := range ps {
		if p.Spec.HostNetwork || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		ip, ok := podIP(p, v4)
		if !ok {
			continue
		}
		var ports []corev1.ContainerPort
		for _, c := range p.Spec.Containers {
			ports = append(ports, c.Ports...)
		}
		np := pod{ns: p.Namespace, name: p.Name, labels: labels.Set(p.Labels), ip: ip, ports: ports}
		if i, seen := byIP[ip]; seen {
			if newer(p.CreationTimestamp, np, born[i], out[i]) {
				out[i], born[i] = np, p.CreationTimestamp
			}
			continue
		}
		byIP[ip] = len(out)
		out = append(out, np)
		born = append(born, p.CreationTimestamp)
	}
	slices.SortFunc(out, func(a, b pod) int { return a.ip.Compare(b.ip) })
	return out
}

// newer reports whether pod a, created at ta, is newer than b, created at
// tb; pods created in the same second are ordered by namespace and name,
// so that the choice does not depend on the order of the list.
func newer(ta metav1.Time, a pod, tb metav1.Time, b pod) bool {
	if !ta.Equal(&tb) {
		return tb.Before(&ta)
	}
	return cmp.Or(cmp.Compare(a.ns, b.ns), cmp.Compare(a.name, b.name)) > 0
}

// podIP is the pod's address of the family (IPv4 when v4): from
// status.podIPs, or status.podIP when that list is empty.
func podIP(p *corev1.Pod, v4 bool) (netip.Addr, bool) {
	ips := p.Status.PodIPs
	if len(ips) == 0 && p.Status.PodIP != "" {
		ips = []corev1.PodIP{{IP: p.Status.PodIP}}
	}
	for _, s := range ips {
		a, err := netip.ParseAddr(s.IP)
		if err == nil && !a.Is4In6() && a.Is4() == v4 && !a.IsUnspecified() {
			return a, true
		}
	}
	return netip.Addr{}, false
}

// policyTypes is the policy's types, defaulted as the API defaults them.
func policyTypes(np *networkingv1.NetworkPolicy) (ingress, egress bool) {
	if len(np.Spec.PolicyTypes) == 0 {
		return true, len(np.Spec.Egress) > 0
	}
	for _, t := range np.Spec.PolicyTypes {
		ingress = ingress || t == networkingv1.PolicyTypeIngress
		egress = egress || t == networkingv1.PolicyTypeEgress
	}
	return ingress, egress
}

func selector(ls *metav1.LabelSelector) (labels.Selector, error) {
	s, err := metav1.LabelSelectorAsSelector(ls)
	if err != nil {
		return nil, fmt.Errorf("selector: %w", err)
	}
	return s, nil
}

// policyRules is the rules of one policy and the local pods it isolates for
// ingress and for egress. A policy that cannot be read has no rules; one
// whose podSelector cannot be read isolates every pod of its namespace,
// as the pods it meant are not known.
func policyRules(np *networkingv1.NetworkPolicy, pods []pod, nsLabels map[string]labels.Set, local netip.Prefix) (rules []Rule, ing, eg []netip.Addr, err error) {
	sel, err := selector(&np.Spec.PodSelector)
	if err != nil {
		sel, err = labels.Everything(), fmt.Errorf("podSelector: %w", err)
	}
	var targets []pod
	for _, p := range pods {
		if p.ns == np.Namespace && local.Contains(p.ip) && sel.Matches(p.labels) {
			targets = append(targets, p)
		}
	}
	wantIn, wantEg := policyTypes(np)
	name := np.Namespace + "/" + np.Name
	if wantIn && err == nil {
		for i, r := range np.Spec.Ingress {
			rule, rerr := makeRule(fmt.Sprintf("%s ingress %d", name, i), false, targets, r.From, r.Ports, np.Namespace, pods, nsLabels, allOf(local.Addr()))
			if rerr != nil {
				err = fmt.Errorf("ingress %d: %w", i, rerr)
				break
			}
			rules = append(rules, rule)
		}
	}
	if wantEg && err == nil {
		for i, r := range np.Spec.Egress {
			rule, rerr := makeRule(fmt.Sprintf("%s egress %d", name, i), true, targets, r.To, r.Ports, np.Namespace, pods, nsLabels, allOf(local.Addr()))
			if rerr != nil {
				err = fmt.Errorf("egress %d: %w", i, rerr)
				break
			}
			rules = append(rules, rule)
		}
	}
	if err != nil {
		rules = nil // isolate the pods, allow nothing
	}
	if len(targets) == 0 {
		return nil, nil, nil, err
	}
	var addrs []netip.Addr
	for _, p := range targets {
		addrs = append(addrs, p.ip)
	}
	if wantIn {
		ing = addrs
	}
	if wantEg {
		eg = addrs
	}
	var keep []Rule
	for _, r := range rules {
		if r.AnyPeer || len(r.Peers) > 0 || (r.Egress && len(r.Ports)+len(r.NamedPorts) > 0) {
			keep = append(keep, r)
		}
	}
	return keep, ing, eg, err
}

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
