package uvxlan

import (
	"sync/atomic"

	"github.com/weft-net/weft/backend"
)

// DropReason says why a packet or frame was dropped.
type DropReason int

// The reasons a frame or datagram is dropped. Each has its own counter.
const (
	DropNone           DropReason = iota
	DropNotPeer                   // ingress: source address is not a peer's underlay address
	DropTruncated                 // ingress: shorter than VXLAN + Ethernet headers
	DropBadFlags                  // ingress: flags other than exactly I, or reserved bits set
	DropWrongVNI                  // ingress: VNI is not ours
	DropOversize                  // ingress: inner frame larger than the overlay MTU allows
	DropNotForUs                  // ingress: inner destination MAC is not our VTEP MAC
	DropUnknownMAC                // egress: destination MAC is no peer's (includes broadcast and multicast)
	DropMalformed                 // egress: frame from the TAP too short or with a bad offload header
	DropTAPWrite                  // ingress: writing to the TAP failed
	DropSend                      // egress: sending to the underlay failed
	DropEtherType                 // ingress: inner frame is neither IPv4 nor IPv6 (ARP included)
	DropInnerMalformed            // ingress: inner IP header short or inconsistent
	DropForeignSource             // ingress: inner source address outside the sending peer's subnets
	DropBadChecksum               // ingress: inner TCP/UDP checksum neither correct nor partial
	numDropReasons
)

func (r DropReason) String() string {
	switch r {
	case DropNone:
		return "none"
	case DropNotPeer:
		return "not_peer"
	case DropTruncated:
		return "truncated"
	case DropBadFlags:
		return "bad_flags"
	case DropWrongVNI:
		return "wrong_vni"
	case DropOversize:
		return "oversize"
	case DropNotForUs:
		return "not_for_us"
	case DropUnknownMAC:
		return "unknown_mac"
	case DropMalformed:
		return "malformed"
	case DropTAPWrite:
		return "tap_write"
	case DropSend:
		return "send"
	case DropEtherType:
		return "ethertype"
	case DropInnerMalformed:
		return "inner_malformed"
	case DropForeignSource:
		return "foreign_source"
	case DropBadChecksum:
		return "bad_checksum"
	}
	return "unknown"
}

// Repair kinds this backend counts.
const (
	repairDevice  = "device"  // the TAP was recreated
	repairLink    = "link"    // its MAC, MTU or up state was put back
	repairAddress = "address" // its address was put back
	repairNeigh   = "neigh"
	repairRoute   = "route"
	repairSocket  = "socket" // a UDP socket failed and was reopened
	// the fast path's programs were attached again (a device replaced, a
	// program detached by someone else)
	repairFastPath = "fastpath"
)

// counters are updated from the hot path with atomic adds only.
type counters struct {
	tx, rx       atomic.Uint64
	partialCsum  atomic.Uint64 // inner frames accepted with a partial checksum
	drops        [numDropReasons]atomic.Uint64
	device, link atomic.Uint64
	address      atomic.Uint64
	neigh, route atomic.Uint64
	socket       atomic.Uint64
	loops        loopCounters

	fastAttaches   atomic.Uint64 // the fast path's programs were attached (again)
	fastRepairs    atomic.Uint64 // attached again after a device was replaced or a program detached
	fastMapErrors  atomic.Uint64 // a sync whose peers did not all fit in the fast path's maps
	fastLoadErrors atomic.Uint64 // a sync whose programs could not be loaded (tried again at the next)
}

// loopCounters count what the packet loops do: how often the poller woke
// each kind of loop, and the system calls each made, by kind (failed ones
// and those that found nothing to read included). A full cache line of
// padding before, between and after the egress and the ingress loop's
// counters keeps them on lines of their own whatever the alignment.
type loopCounters struct {
	_                                 [64]byte
	egressWakes, tapReads, udpSends   atomic.Uint64
	_                                 [64]byte
	ingressWakes, udpRecvs, tapWrites atomic.Uint64
	_                                 [64]byte
}

func (c *counters) drop(r DropReason) { c.drops[r].Add(1) }

func (c *counters) stats() backend.Stats {
	s := backend.Stats{
		TxFrames: c.tx.Load(), RxFrames: c.rx.Load(),
		Repairs: map[string]uint64{
			repairDevice: c.device.Load(), repairLink: c.link.Load(), repairAddress: c.address.Load(),
			repairNeigh: c.neigh.Load(), repairRoute: c.route.Load(), repairSocket: c.socket.Load(),
			repairFastPath: c.fastRepairs.Load(),
		},
		Drops: make(map[string]uint64, numDropReasons),
		Events: map[string]uint64{
			EventPartialChecksum: c.partialCsum.Load(),
			EventEgressWakeups:   c.loops.egressWakes.Load(),
			EventIngressWakeups:  c.loops.ingressWakes.Load(),
			EventTAPReads:        c.loops.tapReads.Load(),
			EventUDPSends:        c.loops.udpSends.Load(),
			EventUDPRecvs:        c.loops.udpRecvs.Load(),
			EventTAPWrites:       c.loops.tapWrites.Load(),
		},
	}
	for r := DropNone + 1; r < numDropReasons; r++ {
		s.Drops[r.String()] = c.drops[r].Load()
	}
	return s
}

// EventPartialChecksum counts inner TCP/UDP frames whose checksum field held
// only the pseudo-header sum, as a kernel VXLAN sender on a virtual link
// leaves it, and that were delivered with the checksum marked as to be
// completed (see the package documentation).
const EventPartialChecksum = "partial_checksum"

// The packet loops' activity, in Stats().Events: wake-ups of the egress
// (TAP to underlay) and ingress loops by the Go poller, and their system
// calls by kind: TAP reads, UDP sends (sendmsg with or without UDP GSO,
// sendmmsg), UDP receives (recvmmsg) and TAP writes. Calls that failed or
// found nothing to read count too: these say how well the loops batch.
const (
	EventEgressWakeups  = "egress_wakeups"
	EventIngressWakeups = "ingress_wakeups"
	EventTAPReads       = "syscalls_tap_read"
	EventUDPSends       = "syscalls_udp_send"
	EventUDPRecvs       = "syscalls_udp_recv"
	EventTAPWrites      = "syscalls_tap_write"
)

// The fast path's counters (Config.FastPath), in Stats().Events: frames and
// bytes (inner frames, Ethernet header included; a TSO super-frame or a
// super-packet counts once) it encapsulated and decapsulated, frames it
// dropped because its headers were already changed when a helper failed,
// how often its programs were attached, Sets whose peers did not all fit
// in its maps, peers it leaves to the userspace path because the route to
// them does not leave through the underlay device, and peer entries (a
// peer and one of its subnets) whose packets its ingress program handed to
// the userspace path for good (the peer sent a super-packet of several
// datagrams; see the package documentation). Its frames count in TxFrames and RxFrames too.
const (
	EventFastTxFrames  = "fastpath_tx_frames"
	EventFastTxBytes   = "fastpath_tx_bytes"
	EventFastRxFrames  = "fastpath_rx_frames"
	EventFastRxBytes   = "fastpath_rx_bytes"
	EventFastErrors    = "fastpath_errors"
	EventFastAttaches  = "fastpath_attaches"
	EventFastMapErrors = "fastpath_map_errors"
	// EventFastLoadErrors counts the syncs whose programs the kernel
	// refused to load; each is tried again at the next sync.
	EventFastLoadErrors = "fastpath_load_errors"
	EventFastDemoted    = "fastpath_demoted_entries"
	EventFastOffDevice  = "fastpath_peers_off_device"
	// EventFastBridgePassed counts the super-packets for pods that the
	// bridge program sent to the pod's port past the pod bridge, which
	// would have cut them into segments (see the package documentation).
	EventFastBridgePassed = "fastpath_bridge_passed_frames"
	// EventFastUnavailable is 1 when Config.FastPath asks for the fast path
	// but an IPv4 backend runs without it: its maps could not be created
	// (no CAP_BPF, a kernel without BPF). It is the only fast path counter
	// such a backend reports. An IPv6 backend, which the fast path does
	// not carry, reports none (the fast path is on by default, so the IPv6
	// half of every dual-stack node would report it).
	EventFastUnavailable = "fastpath_unavailable"
)
