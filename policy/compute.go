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
