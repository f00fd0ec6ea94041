package uvxlan

import "sync/atomic"

// DropReason says why a packet or frame was dropped.
type DropReason int

// The reasons a frame or datagram is dropped. Each has its own counter.
const (
	DropNone       DropReason = iota
	DropNotPeer               // ingress: source address is not a peer's underlay address
	DropTruncated             // ingress: shorter than VXLAN + Ethernet headers
	DropBadFlags              // ingress: flags other than exactly I, or reserved bits set
	DropWrongVNI              // ingress: VNI is not ours
	DropOversize              // ingress: inner frame larger than the overlay MTU allows
	DropNotForUs              // ingress: inner destination MAC is not our VTEP MAC
	DropUnknownMAC            // egress: destination MAC is no peer's (includes broadcast and multicast)
	DropMalformed             // egress: frame from the TAP too short or with a bad offload header
	DropTAPWrite              // ingress: writing to the TAP failed
	DropSend                  // egress: sending to the underlay failed
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
	}
	return "unknown"
}

// Stats is a snapshot of the dataplane counters.
type Stats struct {
	TxFrames uint64 // inner frames encapsulated and sent
	RxFrames uint64 // inner frames decapsulated and written to the TAP
	Drops    map[DropReason]uint64
}

// counters are updated from the hot path with atomic adds only.
type counters struct {
	tx, rx atomic.Uint64
	drops  [numDropReasons]atomic.Uint64
}

func (c *counters) drop(r DropReason) { c.drops[r].Add(1) }

func (c *counters) snapshot() Stats {
	s := Stats{TxFrames: c.tx.Load(), RxFrames: c.rx.Load(), Drops: make(map[DropReason]uint64)}
	for r := DropNone + 1; r < numDropReasons; r++ {
		if n := c.drops[r].Load(); n > 0 {
			s.Drops[r] = n
		}
	}
	return s
}
