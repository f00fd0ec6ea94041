package flow

import (
	"math"
	"net/netip"
	"slices"
	"time"
)

// slot is a Flow as the ring keeps it: addresses as 16 bytes and a
// family, the time as Unix nanoseconds, the names as small codes. It takes
// 144 bytes against Flow's 272, so that a full ring of 4,096 closed
// connections holds 0.74 MB of live heap instead of 1.25
// (BenchmarkRingHeld). A flow that would not come back the same is kept
// whole beside it: a name the codes do not know, a zoned address, a time
// outside time.Local or Unix nanoseconds, a Node, more policies than an
// int32 counts.
type slot struct {
	seq                    uint64
	nanos                  int64 // math.MinInt64: the zero time
	src, dst, masqAs, svc  [16]byte
	srcPort, dstPort, svcP uint16
	proto                  uint16 // 0: none; else the IP protocol number + 1
	fams                   uint8  // 2 bits an address (src, dst, masqAs, svc): 0 none, 1 IPv4, 2 IPv6
	event, verdict, dir    uint8  // indexes in eventNames, verdictNames, dirNames
	masq                   bool
	more                   int32
	policies               []string
	counts                 *Counts
	whole                  *Flow
}

var (
	eventNames   = []string{"", EventDrop, EventNew, EventClose}
	verdictNames = []string{"", Dropped, Allowed}
	dirNames     = []string{"", DirIngress, DirEgress}
)

// pack returns f as a slot, kept whole when it does not unpack the same;
// protos are the protocols' names and numbers (newProtocols).
func pack(f Flow, protos *protocols) slot {
	s := slot{seq: f.Seq, nanos: math.MinInt64, srcPort: f.SrcPort, dstPort: f.DstPort, svcP: f.Service.Port(),
		masq: f.Masqueraded, more: int32(f.MorePolicies), policies: f.Policies, counts: f.Counts}
	if !f.Time.IsZero() {
		s.nanos = f.Time.UnixNano()
	}
	to := [4]*[16]byte{&s.src, &s.dst, &s.masqAs, &s.svc}
	for i, a := range [4]netip.Addr{f.Src, f.Dst, f.MasqueradedAs, f.Service.Addr()} {
		switch {
		case a.Is4():
			s.fams |= 1 << (2 * i)
		case a.Is6():
			s.fams |= 2 << (2 * i)
		}
		*to[i] = a.As16()
	}
	if n, ok := protos.numbers[f.Proto]; ok {
		s.proto = uint16(n) + 1
	}
	s.event = code(eventNames, f.Event)
	s.verdict = code(verdictNames, f.Verdict)
	s.dir = code(dirNames, f.Direction)
	if !same(s.unpack(protos), f) {
		whole := f
		s.whole = &whole
	}
	return s
}

// protocols are ProtoName's names of every protocol number and the
// numbers by name, made once so that packing and unpacking a flow
// allocates no name.
type protocols struct {
	names   [256]string
	numbers map[string]uint8
}

func newProtocols() *protocols {
	p := &protocols{numbers: make(map[string]uint8, 256)}
	for n := range 256 {
		p.names[n] = ProtoName(uint8(n))
		p.numbers[p.names[n]] = uint8(n)
	}
	return p
}

func code(names []string, name string) uint8 {
	return uint8(max(0, slices.Index(names, name))) // not found: unpack gives "", and pack keeps the flow whole
}

// unpack returns the flow s holds.
func (s *slot) unpack(protos *protocols) Flow {
	if s.whole != nil {
		return *s.whole
	}
	f := Flow{Seq: s.seq, SrcPort: s.srcPort, DstPort: s.dstPort, Masqueraded: s.masq, MorePolicies: int(s.more),
		Policies: s.policies, Counts: s.counts,
		Event: eventNames[s.event], Verdict: verdictNames[s.verdict], Direction: dirNames[s.dir]}
	if s.nanos != math.MinInt64 {
		f.Time = time.Unix(0, s.nanos)
	}
	if s.proto != 0 {
		f.Proto = protos.names[s.proto-1]
	}
	var addrs [4]netip.Addr
	for i, b := range [][16]byte{s.src, s.dst, s.masqAs, s.svc} {
		switch s.fams >> (2 * i) & 3 {
		case 1:
			addrs[i] = netip.AddrFrom16(b).Unmap()
		case 2:
			addrs[i] = netip.AddrFrom16(b)
		}
	}
	f.Src, f.Dst, f.MasqueradedAs = addrs[0], addrs[1], addrs[2]
	if addrs[3].IsValid() || s.svcP != 0 {
		f.Service = netip.AddrPortFrom(addrs[3], s.svcP)
	}
	return f
}

// same reports whether a and b are the same flow, field by field (the
// times by instant and location).
func same(a, b Flow) bool {
	return a.Seq == b.Seq && a.Time.Equal(b.Time) && a.Time.Location() == b.Time.Location() && a.Node == b.Node &&
		a.Event == b.Event && a.Verdict == b.Verdict && a.Proto == b.Proto && a.Src == b.Src && a.Dst == b.Dst &&
		a.SrcPort == b.SrcPort && a.DstPort == b.DstPort && a.Direction == b.Direction &&
		slices.Equal(a.Policies, b.Policies) && (a.Policies == nil) == (b.Policies == nil) && a.MorePolicies == b.MorePolicies &&
		a.Masqueraded == b.Masqueraded && a.MasqueradedAs == b.MasqueradedAs && a.Service == b.Service && a.Counts == b.Counts
}
