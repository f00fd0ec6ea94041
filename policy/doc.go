// Package policy enforces Kubernetes NetworkPolicy for the pods of one
// node, in an nftables table of weft's own (family ip, named weft-policy).
//
// A Controller watches NetworkPolicies, Pods and Namespaces (informers on
// narrow REST clients), computes a Plan (Compute: pure, from the API
// objects) and writes it with Program, which replaces the whole table in
// one nftables transaction, so the kernel goes from the old rules to the
// new ones at once. The table holds:
//
//   - a chain on the forward hook: established and related traffic is
//     accepted; packets from a pod isolated for egress jump to the egress
//     chain, then packets to a pod isolated for ingress to the ingress
//     chain. Pods no policy selects are not touched.
//   - egress and ingress chains with one rule per rule of a policy that
//     selects a pod of this node (two for an egress rule with named ports),
//     then a counted drop.
//   - sets: the isolated pods, and per rule the local pods it applies to,
//     its peers (an interval set: pod addresses and ipBlocks without their
//     exceptions) and its ports (ip . protocol . port ranges, with named
//     ports resolved against each destination pod).
//
// So the number of rules grows with the policies' rules, not with pods;
// pods only add set elements.
//
// The node enforces ingress for the pods in its own subnet and egress for
// the same pods; traffic between two nodes is checked for egress on the
// sender's node and for ingress on the receiver's. Traffic between two pods
// of one node crosses the cni0 bridge, which reaches the forward hook only
// through br_netfilter (net.bridge.bridge-nf-call-iptables=1), as for
// kube-proxy; CheckBridgeNetfilter says when that is missing. Traffic from
// the node itself to its pods (kubelet probes) and from its pods to the node
// goes through the input and output hooks and is never filtered, as the API
// requires. So is Service traffic that kube-proxy's IPVS mode forwards (it
// leaves from the node itself): not enforced yet. Only IPv4 is enforced:
// the IPv6 traffic of a dual-stack pod is not filtered.
package policy
