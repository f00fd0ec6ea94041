// Package policy enforces Kubernetes NetworkPolicy for the pods of one
// node, in an nftables table of weft's own (inet weft-policy).
//
// A Controller watches NetworkPolicies, Pods and Namespaces (informers on
// narrow REST clients). Once every informer has listed, it computes a Plan
// per address family the node has a pod subnet of (Compute: pure, from the
// API objects) and writes them with Program, which replaces the whole table
// in one nftables transaction (the kernel goes from the old rules to the new
// at once), retried with backoff (100 ms doubling, up to 30 s by default).
// Its Reporter hears each outcome and whether sources are checked.
//
// While a pod of the node is isolated, the table has a chain on the
// forward hook that accepts established and related traffic, drops IPv6
// link-local traffic other than neighbour discovery bridged between pods
// on Config.Bridge, and sends packets from pods isolated for egress and to
// pods isolated for ingress to per-family egress and ingress chains: one
// rule per policy rule that selects a local pod, then a counted drop (with
// no pod isolated, the packets the node forwards pass no chain of it). With
// Config.LogGroup, a rule before each drop jumps (within LogRate a second)
// to a chain that logs the packet to that NFLOG group, with a prefix naming
// the direction and the policies that isolate the pod (flow.LogPrefix). Pods
// and peers are set elements, so rules grow with policies, not pods. A pod's
// identity is the Pod that holds its address: host-network and finished
// Pods are left out; of two live Pods listing one address, the newer has it.
//
// The node enforces ingress and egress for the pods in its own subnets, so
// traffic between nodes is checked for egress on the sender and for ingress
// on the receiver. Traffic between two pods of one node reaches the forward
// hook only through br_netfilter, which EnsureBridgeNetfilter turns on (or
// says is not loaded). Traffic between the node and its pods is never
// filtered, as the API requires.
//
// A second table (family bridge, same name, same transaction; if the
// kernel refuses it, Program commits the inet table alone and returns
// ErrNoSourceChecks)
// drops frames on the pods' bridge ports (Plan.Ports, from PortsFromStore
// reading the CNI plugin's address store) whose sender address is not that
// port's pod's, and broadcasts and multicasts bridged to a pod isolated for
// ingress. docs/network-policy.md details the tables and what is not enforced.
package policy
