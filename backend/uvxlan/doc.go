// Package uvxlan is weft's userspace VXLAN dataplane: weftd encapsulates
// the frames itself, between a TAP device and UDP sockets in the node's
// network namespace. On the wire it is the kernel's VXLAN, which nodes with
// the kernel VXLAN backend or Flannel's talk to. One Backend carries one
// address family.
//
// The TAP (by default weft-u.<VNI>, persistent) has the node's VTEP MAC,
// the overlay MTU and the address <Subnet>.0/32 or <IPv6Subnet>::/128. Per
// peer, Run programs a permanent neighbour <peer subnet>.0 with the peer's
// VTEP MAC and an onlink route through it, as the kernel backend does but
// with no FDB, and repairs drift. They outlive Run; RemoveDevice deletes
// them.
//
// Set swaps in an immutable peer table through an atomic pointer: the
// packet loops take no lock. Egress sends a frame for a peer's VTEP MAC
// behind the VXLAN header, without DF, to the peer's address and
// Config.Port, from one of Config.SourcePorts sockets picked by the inner
// flow's hash. Ingress takes a datagram only from a peer's underlay address,
// with our VNI and flags, holding a well-formed frame for our VTEP MAC from
// inside that peer's subnets (unless Config.AllowForeignSources); every
// drop is counted by DropReason. Unless Config.Plain, the TAP carries a
// virtio-net header: TCP super-frames are cut into segments in userspace
// and sent with UDP GSO, and received segments are merged per flow.
//
// With Config.FastPath (IPv4, tcx; weftd's default), Run attaches two tc
// programs (bpf/fastpath.c, built by bpf2go into the committed
// fastpath_bpf*.o): on the TAP's egress one encapsulates frames for known
// peers and sends them out of the underlay device; on that device's ingress
// the other checks VXLAN packets from known peers and hands the inner
// frames to the TAP. What they do not take goes on to the userspace path.
// A third, on the pod bridge's egress (Config.PodBridge), hands those
// frames on to a pod's port whole, which the bridge would cut into
// segments (bridge_linux.go).
// Without CAP_BPF, Run logs why once and runs the userspace path alone.
//
// Config.Files keeps the TAP queues and receive sockets open across a
// restart, so that what arrives meanwhile waits in the kernel's queues for
// the next Run. GBP is not supported. docs/uvxlan-design.md has each check,
// the offloads, the fast path in detail, and the history.
package uvxlan
