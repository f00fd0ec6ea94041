package doctor

import (
	"fmt"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/weft-net/weft/subnet"
)

// kubeFacts is what the Kubernetes checks compare the node object with.
type kubeFacts struct {
	network  netip.Prefix // the cluster network; invalid when unknown
	publicIP netip.Addr   // what the node sends VXLAN from; invalid when unknown
	mac      subnet.MAC   // the overlay device's MAC; zero when unknown
}

// kubeChecks checks a node object: podCIDR assigned (and inside the
// network), the NetworkUnavailable condition cleared by weftd, and the
// lease annotations current with what the kernel shows.
func kubeChecks(n *corev1.Node, prefix string, f kubeFacts) []Check {
	if prefix == "" {
		prefix = "flannel.alpha.coreos.com"
	}
	r := &Report{}
	network := "the cluster network"
	if f.network.IsValid() {
		network = f.network.String()
	}
	switch cidr, err := netip.ParsePrefix(n.Spec.PodCIDR); {
	case n.Spec.PodCIDR == "":
		r.add("kube/podcidr", Fail, "run kube-controller-manager with --allocate-node-cidrs=true --cluster-cidr="+network+" (or set spec.podCIDR when creating the node)",
			"node %s has no spec.podCIDR: weftd waits for one and the node gets no pod network", n.Name)
	case err != nil:
		r.add("kube/podcidr", Fail, "", "node %s: spec.podCIDR %q: %v", n.Name, n.Spec.PodCIDR, err)
	case f.network.IsValid() && !(f.network.Contains(cidr.Addr()) && cidr.Bits() >= f.network.Bits()):
		r.add("kube/podcidr", Fail, "make kube-controller-manager's --cluster-cidr equal the Network of net-conf.json ("+network+")",
			"node %s: spec.podCIDR %s lies outside the network %s", n.Name, cidr, network)
	default:
		r.ok("kube/podcidr", "spec.podCIDR %s", cidr)
	}
	r.Checks = append(r.Checks, conditionCheck(n))
	r.Checks = append(r.Checks, annotationCheck(n, prefix, f))
	return r.Checks
}

func conditionCheck(n *corev1.Node) Check {
	for _, c := range n.Status.Conditions {
		if c.Type != corev1.NodeNetworkUnavailable {
			continue
		}
		if c.Status == corev1.ConditionFalse {
			return Check{Name: "kube/network-unavailable", Status: OK, Evidence: fmt.Sprintf("NetworkUnavailable=False (%s: %s)", c.Reason, c.Message)}
		}
		return Check{Name: "kube/network-unavailable", Status: Fail, Fix: "see weftd's log on this node: it clears the condition once its dataplane is programmed",
			Evidence: fmt.Sprintf("NetworkUnavailable=%s (%s: %s): the scheduler keeps pods off this node", c.Status, c.Reason, c.Message)}
	}
	return Check{Name: "kube/network-unavailable", Status: Warn, Fix: "see weftd's log on this node: it sets NetworkUnavailable=False once ready",
		Evidence: "the node has no NetworkUnavailable condition: weftd has not reported the network ready"}
}

func annotationCheck(n *corev1.Node, prefix string, f kubeFacts) Check {
	a := func(k string) string { return n.Annotations[prefix+"/"+k] }
	var bad []string
	if a("kube-subnet-manager") != "true" {
		bad = append(bad, fmt.Sprintf("%s/kube-subnet-manager is %q, not \"true\"", prefix, a("kube-subnet-manager")))
	}
	if a("backend-type") != "vxlan" {
		bad = append(bad, fmt.Sprintf("%s/backend-type is %q, not \"vxlan\"", prefix, a("backend-type")))
	}
	if f.publicIP.IsValid() && a("public-ip") != f.publicIP.String() {
		bad = append(bad, fmt.Sprintf("%s/public-ip is %q but this node sends VXLAN from %s", prefix, a("public-ip"), f.publicIP))
	}
	var zero subnet.MAC
	if f.mac != zero && !strings.Contains(strings.ToLower(a("backend-data")), f.mac.String()) {
		bad = append(bad, fmt.Sprintf("%s/backend-data %s does not carry the overlay device's MAC %s", prefix, a("backend-data"), f.mac))
	}
	if len(bad) > 0 {
		return Check{Name: "kube/annotations", Status: Fail, Fix: "restart weftd on this node: it rewrites its annotations from the live device",
			Evidence: strings.Join(bad, "; ") + ": peers program a stale VTEP"}
	}
	return Check{Name: "kube/annotations", Status: OK, Evidence: fmt.Sprintf("public-ip %s, backend-data %s", a("public-ip"), a("backend-data"))}
}
