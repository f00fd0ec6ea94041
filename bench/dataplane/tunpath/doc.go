// Package tunpath is a measurement prototype of a TUN-based userspace VXLAN
// node for bench/dataplane (its mode uvxlan-tun-proc); it is built into no
// release binary. It answers one question: would a TUN device from
// golang.zx2c4.com/wireguard/tun carry pod traffic more cheaply than
// backend/uvxlan's TAP?
//
// A Node creates, in a host's network namespace, a TUN device (IFF_VNET_HDR
// with TSO/USO offloads: wireguard-go's tun cuts the kernel's super-packets
// into segments on Read and merges segments on Write, in userspace) with the
// overlay MTU and the address <Subnet>.0/32, and a route per peer subnet
// through it. It receives on the VXLAN port through wireguard-go's
// conn.StdNetBind (UDP GRO; the bind cuts what the kernel merged back into
// datagrams), and sends from a UDP socket of its own on an ephemeral port
// with UDP GSO, each datagram gathered from the buffer the TUN read put it
// in (the bind's Send would copy every datagram of a send into one
// buffer: bench/dataplane/README.md has the figures).
//
// Egress: each IP packet read from the TUN gets, in the headroom in front
// of it, the 8-byte VXLAN header (the I flag, the VNI) and an inner
// Ethernet header synthesised from the peer table (destination the VTEP MAC
// of the peer whose subnet holds the inner destination, source our own VTEP
// MAC, the EtherType of the IP version); a batch's packets for one peer go
// out in as few UDP GSO sends as their sizes allow. A packet for no peer's
// subnet is dropped and counted.
//
// Ingress: a datagram is taken only from a peer's underlay address, with
// exactly the I flag, our VNI, an inner frame for our VTEP MAC of IPv4 or
// IPv6 whose IP header matches its length, no longer than the MTU, and whose
// source lies in that peer's subnet; it is cut down to its IP packet and the
// batch is written to the TUN. Inner checksums are not checked here: the
// TUN's GRO checks them before it merges, and the kernel's stack checks what
// it did not merge. The inner TCP and UDP checksums that a kernel VXLAN
// sender on a virtual link leaves partial (see docs/uvxlan-design.md) are
// completed here, as the TUN's Write cannot ask the kernel to. The same
// sender hands its TCP super-packets (up to 64 KB) to a peer on a veth
// unsegmented; the TUN's Write takes no super-packet from its caller, and
// they are dropped as too long, so TCP from a kernel VXLAN node on a veth
// to this node stalls (uvxlan takes them).
//
// On the wire it is the kernel's VXLAN (VNI, port 8472, VTEP MACs from
// vtep.DeviceMAC), except that every datagram of a node leaves from one
// source port (its send socket's ephemeral port) rather than from one
// hashed from the inner flow.
package tunpath
