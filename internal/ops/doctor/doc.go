// Package doctor checks a weft node for what breaks an overlay before a
// user has to find it: weftd and its lease, the subnet file and the CNI
// config the runtime reads, the kernel settings weft depends on, the
// underlay and its MTU, other firewalls and VXLAN devices in the way (and
// the rules on the VXLAN port that a uvxlan fast path bypasses), a node that
// runs uvxlan because its kernel has no VXLAN driver, and, actively,
// whether every peer answers over the overlay.
//
// Each check yields a Check: a status (ok, warn, fail), the evidence it
// read, and the fix in one line. It reads the node's state and sends probe
// packets to the peers' overlay and underlay addresses, and echo requests
// with a borrowed source whose replies this node forwards between the
// overlay and its pods. The one thing it adds, for the length of the
// probes, is an nftables table of its own that marks the peers' datagrams
// and those replies for the kernel's trace, which names the rule that
// accepted or dropped them (firewall/input, firewall/forward); doctor
// deletes it when the probes end.
// It runs in the network namespace of a node (a real node, or a lab node
// through a netlink handle and a function that enters its namespace).
package doctor
