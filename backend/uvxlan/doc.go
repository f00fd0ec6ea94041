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
// Set swaps in an immutable peer table (VTEP MAC to underlay address,
// underlay address to its subnets) through an atomic pointer: the packet
// loops take no lock. With the fast path, Run's sync does the swap, after
// writing the table into the programs' maps; Set never waits on the kernel. Egress sends a frame for a peer's VTEP MAC (others
// are dropped) behind the 8-byte VXLAN header, without DF, to the peer's
// address and Config.Port, from one of Config.SourcePorts sockets picked by
// the inner flow's hash. Ingress, on one socket per queue bound to
// Config.Port, takes a datagram only from a peer's underlay address, with
// exactly the I flag, no reserved bits and our VNI, holding a frame for our
// VTEP MAC of at most the Ethernet header and the MTU, of IPv4 or IPv6 with
// a consistent header, a source inside that peer's subnets (unless
// Config.AllowForeignSources) and a TCP or UDP checksum that is correct or
// exactly the pseudo-header sum a kernel VXLAN sender on a virtual link
// leaves (EventPartialChecksum). Every drop is counted by DropReason.
//
// Unless Config.Plain, the TAP carries a virtio-net header with checksum
// and TSO offloads: TCP super-frames from it are cut into segments in
// userspace and sent with UDP GSO, and received TCP segments are merged per
// flow, in order, into super-frames written to the TAP (the sockets use UDP
// GRO, except with the fast path).
//
// # Fast path
//
// With Config.FastPath (IPv4, tcx; weftd sets it unless the network config
// says "FastPath": false), Run attaches two tc programs, C in
// bpf/fastpath.c compiled by bpf2go into the committed fastpath_bpf*.o
// (bpf/README.md says how to regenerate them), with the node's values set
// at load. On the TAP's egress one
// encapsulates frames for known peers and sends them out of the underlay
// device through the neighbour table; on that device's ingress the other
// checks VXLAN packets from known peers as the userspace path does, but
// leaves inner TCP and UDP checksums to the receiving stack as the kernel's
// VXLAN does, and hands the inner frames to the TAP. These outer packets
// pass none of the host's netfilter hooks nor, coming in, its reverse path
// filter. What a program does not take goes on to the userspace path; once
// a peer sends a super-packet of several datagrams, its packets all do
// (EventFastDemoted), so while the programs may be attached this node's
// userspace path sends one datagram per send. Programs the kernel refuses
// to load are loaded again at the next sync (EventFastLoadErrors). A
// process that cannot create the maps (no CAP_BPF) logs why once and runs
// the userspace path (EventFastUnavailable); one that cannot attach the
// programs (no CAP_NET_ADMIN, no tcx) logs why once per reason and keeps
// trying at each sync.
//
// Config.Files keeps the TAP queues and receive sockets open across a
// restart, so that what arrives meanwhile waits in the kernel's queues for
// the next Run; a Run that ends forwards what its loops read before it
// closes them, if they finish within a second. GBP is not supported: it
// lives in the skb mark, which a TAP cannot see. docs/uvxlan-design.md has
// longer notes and the history.
package uvxlan
