// Package uvxlan is weft's userspace VXLAN dataplane: a TAP device and UDP
// sockets in the node's network namespace, with the encapsulation done in
// weftd itself. On the wire it is indistinguishable from the kernel VXLAN
// backend and from Flannel's vxlan backend, so nodes of all three kinds
// carry pod traffic between them; a uvxlan node's lease therefore still
// advertises BackendType "vxlan" (the daemon writes the lease, not this
// package).
//
// # What it programs
//
// A persistent TAP named weft-u.<VNI> with the node's VTEP MAC, the overlay
// MTU, the address <Subnet>.0/32 (or <IPv6Subnet>::/128) and no IPv6
// link-local address (it would only emit solicitations nobody can answer).
// As in Flannel, IPv4 subnets travel over an IPv4 underlay and IPv6 subnets
// over an IPv6 one; a dual-stack node runs one Backend per family, each with
// its own device name. Per peer, the same kernel state as the kernel
// backend except the FDB: a permanent neighbour <peer subnet>.0 lladdr
// <peer VtepMAC> and a route <peer subnet> via <peer subnet>.0 dev
// weft-u.<VNI> onlink (with kernel.TunnelMetric's metric). The kernel
// therefore routes pod traffic into the TAP as Ethernet frames addressed to
// the peer's VTEP MAC and never sends ARP for a peer. The device, neighbours and routes outlive
// Run, so a restarting daemon keeps routing; RemoveDevice removes them when
// a node goes back to the kernel backend. Forwarding itself stops with Run
// unless Config.Files keeps the TAP queues and receive sockets open in a
// service manager's store: then what arrives meanwhile waits in the
// kernel's queues (the TAP's ring, the socket's receive buffer) and the
// next Run takes the files over and forwards it once its first table is
// programmed.
//
// # Egress (TAP → underlay)
//
// The destination MAC of each frame is looked up in the peer map, an
// immutable snapshot swapped through an atomic pointer on Set: the packet
// loops never take a lock. Unknown, broadcast and multicast destinations
// are dropped and counted (no flooding: neighbours are permanent). The
// frame goes out behind the 8-byte header 08 00 00 00 | VNI | 00 to the
// peer's underlay address, UDP port 8472, without DF (IP_PMTUDISC_DONT, as
// the kernel sends), from one of Config.SourcePorts sockets bound to
// ephemeral ports of the local port range; the inner flow hash picks the
// socket, so one flow keeps one source port and flows spread over ECMP
// paths and receive queues.
//
// # Ingress (underlay → TAP)
//
// One socket on the VXLAN port per queue. A datagram is taken only if its
// source address is a peer's underlay address, its flags are exactly the I
// flag with every reserved bit zero, its VNI is ours, it holds at least an
// Ethernet header and at most Ethernet header + overlay MTU, and the inner
// destination MAC is our VTEP MAC (broadcast and multicast are refused: no
// weft or Flannel peer floods, its neighbours are permanent). Then the inner
// frame itself is checked:
//
//   - only IPv4 and IPv6 EtherTypes pass (no ARP: nobody needs to send it);
//   - the IP header must be consistent with the frame;
//   - the inner source address must lie inside a subnet of the peer the
//     datagram came from, so a peer (or anyone who can send UDP from a
//     peer's underlay address) cannot inject packets with another node's or
//     an outside source. Config.AllowForeignSources turns this off for
//     routed setups that forward other sources through a node; the check
//     is only as strong as the underlay's own protection of source
//     addresses, which VXLAN does not authenticate;
//   - a TCP or UDP checksum must be correct, or exactly the partial value
//     described below; anything else is dropped.
//
// Everything refused is counted per reason (DropReason, in Stats) and never
// stops the loops.
//
// # Partial checksums from kernel peers
//
// A kernel VXLAN sender whose underlay is a veth, or another virtual link
// that carries checksum offload through, leaves the inner TCP/UDP checksum
// field holding only the folded pseudo-header sum (source, destination,
// protocol, length; not complemented), for an offload that never runs. A
// kernel VXLAN receiver accepts such a frame because its skb says
// CHECKSUM_PARTIAL; a UDP socket only sees the bytes. uvxlan recognises that
// exact value: the frame is delivered to the TAP with a virtio-net header
// that marks the checksum as to be completed (NEEDS_CSUM), which hands it to
// the kernel just as a CHECKSUM_PARTIAL skb, and counted
// (EventPartialChecksum). Without offloads (Config.Plain) the checksum is
// completed in userspace instead. A corrupted frame passes this test only if
// its checksum field happens to hold that one value: odds of about 1 in
// 65,536, the same odds by which a corruption keeps a complete checksum
// valid. Such a sender also hands its TCP super-segments (up to 64 KB) to
// the receiving namespace unsegmented, and the UDP socket receives each as
// one datagram: a tunnel-GSO super-packet, recognised by an inner IP length
// that spans the whole datagram, checked like any inner frame, and written
// to the TAP as one GSO frame (or segmented in userspace without offloads).
//
// # Repair
//
// Run repairs drift as the kernel backend does, through the shared
// kernel.Reconciler: the kernel's notifications about the TAP, its
// address, neighbours and routes trigger a full sync at once (the
// backend's own writes match the table it programmed and are ignored), and
// a full sync also runs every Config.Reconcile. A deleted TAP is opened
// again with the same name and MAC; a receive socket that fails is closed
// and opened again. Each repair is counted by kind in Stats().Repairs; none
// ends Run.
//
// # Offloads
//
// By default the TAP is opened with a virtio-net header (IFF_VNET_HDR) and
// TSO/checksum offloads, so the kernel hands over TCP super-frames of up to
// 64 KB. These are cut in userspace into MTU-sized segments with complete
// checksums and sent with UDP GSO (UDP_SEGMENT), as few sends per 64 KB as
// the datagram limit allows: each segment's headers are built in a small
// buffer and its payload is gathered by the send from where the TAP read
// put it, so userspace copies no payload. Each wake-up of the egress loop
// reads every frame queued on the TAP; the segments of consecutive
// super-frames of a flow share sends (a send is cut when it is full, at a
// shorter last segment, at a segment for another peer, source port or
// segment size, before a plain frame, and at the end of the wake-up's
// frames), and the small frames (ACKs, UDP, ICMP) leave together in one
// sendmmsg per source socket. Both loops work inside the Go poller's read
// callback and ask it to wait as soon as a read found the queue empty, so
// a wake-up costs at most one read that finds nothing, not two. The receive socket uses
// UDP GRO (not with the fast path, below) and recvmmsg; consecutive TCP segments of a flow, once their
// checksums are checked, are merged into one super-frame written to the
// TAP with NEEDS_CSUM (software GRO), again as a gather list (one writev:
// the merged headers, then each segment's payload in the receive buffer).
// The coalescer keeps a run per flow and never reorders a flow: a segment
// that cannot join its flow's run (FIN, RST, a data-less ACK, a gap) first
// writes what the flow holds. Socket buffers are 4 MB. Each loop owns its
// buffers, allocated once: the hot path does not allocate. Config.Plain
// turns all this off: the TAP is then opened with songgao/water (which
// cannot set IFF_VNET_HDR) and each frame costs a syscall on the TAP side
// (the sockets still batch).
//
// The loops count their wake-ups and system calls by kind (Stats().Events:
// EventEgressWakeups and the others), which says how well they batch.
// Where the CPU goes, per 64 KB, is measured by bench/dataplane (its
// README has the latest report): most of it is in the system calls, that
// is the kernel's copies to and from userspace and the network stack work
// the kernel does inline for each send and TAP write; checksums are the
// largest userspace part.
//
// # Latency
//
// A round trip crosses four goroutine wake-ups (egress and ingress on both
// nodes), which the kernel's softirq path does not pay (nor does the fast
// path, below, which runs in it): with each node in a
// process of its own, as weftd runs, bench/dataplane measured a median
// round trip 3.0 (one core kept busy) to 5.1 (quiet) times the kernel's on
// a 2-core VM (2026-12-01 13:12), where waking a thread on the other, idle
// virtual CPU is slow: with the whole benchmark confined to one CPU the
// median fell by about a third and the dataplane moved about 40 % more
// per core (2026-12-01 14:25). One loop per queue for both directions,
// sleeping in ppoll after a bounded busy-poll (so that a reply is caught
// without a wake-up), was built and measured (2026-11-30): it was slower
// than Go's netpoller on every figure, round trip included, and is not
// used; so were one locked OS thread per loop sleeping in ppoll, a bounded
// busy-poll in the netpoller loops, and MSG_ZEROCOPY sends, which the
// kernel copies anyway on delivery to a local socket (2026-12-01). The
// ingress loop sending at once what a TAP write made the pod answer did
// not shorten the round trip (2026-12-01) and is not used either.
// bench/dataplane's README lists these and the other variants measured
// and not adopted.
//
// # Fast path
//
// With Config.FastPath, Run attaches two tc programs (tcx, Linux 6.6 or
// later) that weft generates at run time with cilium/ebpf's assembler, so
// building weft needs no C compiler and ships no object file. They carry
// the traffic to and from peers in the kernel, as the kernel's VXLAN does,
// and the userspace path only what they do not take:
//
//   - On the TAP's egress, an IPv4 frame whose destination MAC is a peer's
//     VTEP MAC is encapsulated in place, as the kernel's VXLAN sends it:
//     outer IPv4 without DF, with a random ID and TTL 64, the UDP source
//     port from the inner flow's hash (32768–60999), UDP checksum 0, the I
//     flag and the VNI. It leaves through the device that holds Local, which
//     must be an Ethernet device (not loopback or dummy), through the
//     kernel's neighbour table, as Flannel's kernel VXLAN leaves through its
//     --iface device. Peers whose route from Local leaves through another
//     device are left to the userspace path (EventFastOffDevice); a new
//     peer's route is checked at the next sync, all of them again on a full
//     sync at most once a minute, so a route that moves later is followed
//     within about a minute. A TSO super-frame
//     stays one skb marked as a UDP tunnel, which the kernel segments, or a
//     virtual link carries whole, as it does the kernel VXLAN's own.
//   - On that device's ingress, a packet is decapsulated and handed to the
//     TAP, as if the userspace path had written it, only if it is for this
//     host (not another host's or a VLAN's), IPv4 without options or
//     fragmentation and with a correct header checksum, UDP to Local and
//     Port, with exactly the I flag and our VNI, for our VTEP MAC, carrying
//     IPv4 from a source inside the sending peer's subnets (one LPM lookup
//     of the outer and the inner source; any inner source with
//     AllowForeignSources), within the MTU (for a super-packet: an MSS that
//     leaves 40 bytes for headers), and if its lengths agree (one datagram).
//
// Anything else goes on unchanged, to the next tcx program or to the TAP
// queue and the UDP socket, where the userspace path checks it and counts
// every drop as it does without the fast path. The fast path's own frames
// count in TxFrames and RxFrames (a super-frame once, where the userspace
// path counts its segments) and under EventFastTxFrames and the other fast
// path events. Differences from the userspace path, and from the kernel's
// VXLAN:
//
//   - The outer UDP checksum is not checked, and inner TCP and UDP
//     checksums are left to the receiving stack, as the kernel's VXLAN
//     leaves them: a packet that came from a NIC is checked there (the
//     pod's InCsumErrors), one from a local sender on a virtual link keeps
//     that sender's checksum offload state. DropBadChecksum only counts
//     what reaches the userspace path.
//   - Its packets do not pass the host's netfilter hooks or reverse path
//     filter on the way in (the ingress program runs before them) or out
//     (the egress program sends through the neighbour table), where the
//     kernel's VXLAN's pass the INPUT and OUTPUT ones: host firewall rules
//     on the VXLAN port do not see them. Outer packets are not fragmented:
//     the underlay's MTU must take the overlay MTU plus 50 bytes, as it is
//     configured by default.
//   - A super-packet of UDP datagrams (a peer without the fast path sends
//     with UDP GSO, which a virtual link carries whole) can only be taken
//     apart by the userspace path. Were that peer's single datagrams still
//     taken by the fast path, they would overtake the super-packets queued
//     there and reorder its flows, so the first such super-packet hands
//     that peer's packets (its entry for that subnet) to the userspace path
//     for good, until the entry is removed or the backend is made again
//     (EventFastDemoted). A single datagram whose lengths do not agree just
//     goes on to the userspace path. So that this does not happen to a
//     node with the fast path, its own userspace path sends one datagram
//     per send (no UDP GSO) from the start of Run, while it carries what
//     the TAP queued before the programs attach, until a sync finds that
//     they cannot be attached.
//   - The receive sockets do not ask for UDP GRO while the fast path is on
//     (its maps could be created), also while the programs are not
//     attached: on a device that does GRO, it would merge a peer's
//     datagrams before the ingress program sees them.
//   - When the programs attach while a flow runs (at start, or after a
//     repair), its frames already queued for the userspace path can arrive
//     after its first fast ones, once. A frame the egress program cannot
//     take (one over 65499 bytes, or one it cannot make room in) goes to
//     the userspace path, behind which later fast frames of its flow can
//     arrive first.
//   - Decapsulated super-packets keep the tunnel's GSO marks (the kernel's
//     own decapsulation clears them): forwarded on, they are segmented by
//     their TCP headers, in software where the device has no tunnel
//     offloads. Tested into a bridge and a veth.
//
// The programs are detached when Run returns (their tcx links are closed);
// Config.Files bridges a restart as before. A replaced TAP or underlay
// device, or a program detached by someone else, is found by the next sync
// and attached again (repair "fastpath"); a replaced underlay device at
// the latest by the next full sync (Config.Reconcile). Where the maps cannot be
// created (no CAP_BPF, or no BPF in the kernel) or the programs cannot be
// attached (no tcx: then not tried again), the backend logs why and runs
// on the userspace path alone; an IPv6 backend always does.
// bench/dataplane's mode uvxlan-fast measures it.
//
// GBP is not supported: it lives in the skb mark, which a TAP cannot see.
package uvxlan
