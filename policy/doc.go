// Package policy enforces Kubernetes NetworkPolicy for the pods of one
// node, in an nftables table of weft's own (family inet, named
// weft-policy).
//
// A Controller watches NetworkPolicies, Pods and Namespaces (informers on
// narrow REST clients). Once every informer has listed, it computes a Plan
// per address family the node has a pod subnet of (Compute: pure, from the
// API objects) and writes them with Program, which replaces the whole table
// in one nftables transaction, so the kernel goes from the old rules to the
// new ones at once. It tells its Reporter the outcome of each transaction,
// and after each commit whether the pods' source addresses are checked; a
// failed one is retried with backoff (100ms doubling, up to 30s by
// default) until it commits. The table holds:
//
//   - a chain on the forward hook: established and related traffic is
//     accepted; IPv6 neighbour solicitations and advertisements are
//     accepted, then any other IPv6 packet with a link-local source or
//     destination that the pod bridge (Config.Bridge, cni0) forwards is
//     dropped (pods of one node bridging to each other over fe80::
//     addresses, which no policy names; other bridges are not touched);
//     per family,
//     packets from a pod isolated for egress jump to the egress chain,
//     then packets to a pod isolated for ingress to the ingress chain.
//     Pods no policy selects are not touched otherwise.
//   - per family, egress and ingress chains with one rule per rule of a
//     policy that selects a pod of this node (two for an egress rule with
//     named ports), then a counted drop. IPv6's chains and sets have names
//     starting "v6-".
//   - sets: the isolated pods, and per rule the local pods it applies to,
//     its peers (an interval set: pod addresses and ipBlocks without their
//     exceptions) and its ports (address . protocol . port ranges, with
//     named ports resolved against each destination pod).
//
// So the number of rules grows with the policies' rules, not with pods;
// pods only add set elements.
//
// A pod's identity is the Pod that holds its address: host-network and
// finished Pods (Succeeded, Failed) are left out, and of two live Pods
// listing one address the one created last has it.
//
// The node enforces ingress for the pods in its own subnets and egress for
// the same pods; traffic between two nodes is checked for egress on the
// sender's node and for ingress on the receiver's. Traffic between two pods
// of one node crosses the cni0 bridge, which reaches the forward hook only
// through br_netfilter (net.bridge.bridge-nf-call-iptables and
// -ip6tables, settings of each network namespace): EnsureBridgeNetfilter
// turns them on, or says that br_netfilter is not loaded. Traffic from the
// node itself to its pods (kubelet probes) and from its pods to the node
// goes through the input and output hooks and is never filtered, as the API
// requires. So is Service traffic that kube-proxy's IPVS mode forwards (it
// leaves from the node itself): not enforced yet.
//
// A second table (family bridge, same name, same transaction; if the
// kernel refuses it, Program commits the inet table alone and says so with
// ErrNoSourceChecks, and the controller tells its Reporter) checks the
// source addresses of the pods' frames on their bridge ports: the plans'
// Ports, which the controller reads from the CNI plugin's address store
// (PortsFromStore). A frame from a listed port whose IPv4, IPv6 (not
// link-local or ::) or ARP sender address is not that port's pod's is
// dropped, as are VLAN-tagged frames; so a pod cannot pass a policy by
// forging another pod's address. Unlisted ports are not checked. A chain
// of that table on the bridge's forward hook drops the IPv4 and IPv6
// frames bridged to the port of a pod isolated for ingress whose
// destination is not that pod's address (broadcasts, multicast), which
// the inet table's check by destination address cannot see; ARP and IPv6
// neighbour discovery pass.
package policy
