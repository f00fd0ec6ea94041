package kernel

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/weft-net/weft/subnet"
)

// Dumps of the kernel's neighbour, FDB and route tables over the batch writer's
// socket. A full sync reads each table once or twice, and every resync
// (every 10 s) does it again: at 5,000 peers that is about 25,000 entries.
// netlink.Handle's lists build a netlink.Route or netlink.Neigh with its
// own slices for each, plus a copy of every message, and that garbage, made
// again every 10 s, kept about 200 ms of CPU per resync busy with
// collecting it and faulting in the heap pages it needed (2026-12-01).
// These read each answer into one buffer that is kept, and decode the few
// fields weft reads straight from it. They send the requests
// netlink.Handle sends and keep and skip what its lists keep and skip:
// TestDumpsMatchHandle holds them to the same results on a namespace
// with entries of every kind.

// dumpBuffer is the size of the buffer one answer of a dump is read into:
// the kernel fills an answer up to 32 KB (NLMSG_GOODSIZE on 4 KB pages).
const dumpBuffer = 64 << 10

// NeighInfo is one entry of a neighbour (or FDB) dump: the fields weft
// reads. MAC is set only for a 6-byte link-layer address.
type NeighInfo struct {
	LinkIndex int
	State     int
	IP        netip.Addr // unmapped
	MAC       subnet.MAC
	HasMAC    bool
}

// RouteInfo is one unicast or other route of a dump: the fields weft reads.
// A route without a destination attribute is the default route, as
// netlink.Handle reports it (0.0.0.0/0 or ::/0).
type RouteInfo struct {
	Route    // Dst, Gw (invalid when none), LinkIndex (0 when none), OnLink, Priority
	Table    int
	Protocol netlink.RouteProtocol
	Type     int
}

// DumpNeighbours returns the neighbours of family on the link with index
// link (AF_BRIDGE: the link's FDB entries) that keep takes, of those
// netlink.Handle.NeighList(link, family) lists.
func (p *BatchWriter) DumpNeighbours(link, family int, keep func(NeighInfo) bool) ([]NeighInfo, error) {
	req := nl.NewNetlinkRequest(unix.RTM_GETNEIGH, unix.NLM_F_DUMP)
	req.AddData(&netlink.Ndmsg{Family: uint8(family), Index: uint32(link)})
	out := make([]NeighInfo, 0, p.sizeHint)
	err := p.dump(req, unix.RTM_NEWNEIGH, func() { out = out[:0] }, func(m []byte) {
		if n, ok := decodeNeigh(m, link, family); ok && keep(n) {
			out = append(out, n)
		}
	})
	p.sizeHint = max(p.sizeHint, len(out))
	return out, err
}

// DumpRoutes returns the routes of family in the main table that keep
// takes, of those netlink.Handle.RouteListFiltered(family, &Route{Table:
// main}, RT_FILTER_TABLE) lists (cloned routes are left out).
func (p *BatchWriter) DumpRoutes(family int, keep func(RouteInfo) bool) ([]RouteInfo, error) {
	req := nl.NewNetlinkRequest(unix.RTM_GETROUTE, unix.NLM_F_DUMP)
	req.AddData(&nl.RtMsg{RtMsg: unix.RtMsg{Family: uint8(family)}})
	out := make([]RouteInfo, 0, p.sizeHint)
	err := p.dump(req, unix.RTM_NEWROUTE, func() { out = out[:0] }, func(m []byte) {
		if r, ok := decodeRoute(m, family); ok && r.Table == unix.RT_TABLE_MAIN && keep(r) {
			out = append(out, r)
		}
	})
	p.sizeHint = max(p.sizeHint, len(out))
	return out, err
}

// dump sends req and calls each with every answer of type typ, until the
// dump is done; an answer's bytes are valid only during the call. A dump
// the kernel interrupted (the table changed under it) is run again, up to
// dumpRetries times, after restart (which drops what each kept of it).
func (p *BatchWriter) dump(req *nl.NetlinkRequest, typ uint16, restart func(), each func([]byte)) error {
	if p.buf == nil {
		p.buf = make([]byte, dumpBuffer)
	}
	for range dumpRetries {
		restart()
		intr, err := p.dumpOnce(req, typ, each)
		if err != nil {
			return fmt.Errorf("netlink dump: %w", err)
		}
		if !intr {
			return nil
		}
	}
	return fmt.Errorf("netlink dump: %w", netlink.ErrDumpInterrupted)
}

func (p *BatchWriter) dumpOnce(req *nl.NetlinkRequest, typ uint16, each func([]byte)) (interrupted bool, err error) {
	p.seq++
	req.Seq = p.seq
	if err := unix.Sendto(p.s.GetFd(), req.Serialize(), 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return false, err
	}
	for {
		n, _, flags, _, err := unix.Recvmsg(p.s.GetFd(), p.buf, nil, 0)
		if err != nil {
			return false, err
		}
		if flags&unix.MSG_TRUNC != 0 {
			return false, fmt.Errorf("an answer of over %d bytes", len(p.buf))
		}
		done, intr, err := readAnswer(p.buf[:n], req.Seq, typ, each)
		interrupted = interrupted || intr
		if err != nil || done {
			return interrupted, err
		}
	}
}

// readAnswer calls each with every message of type typ in b, one answer of
// a dump with sequence number seq (messages of other numbers, late answers
// to earlier requests, are skipped). It reports whether the dump is done,
// and whether the kernel marked a message as interrupted.
func readAnswer(b []byte, seq uint32, typ uint16, each func([]byte)) (done, interrupted bool, err error) {
	for len(b) >= unix.NLMSG_HDRLEN {
		l := int(binary.NativeEndian.Uint32(b[0:4]))
		if l < unix.NLMSG_HDRLEN || l > len(b) {
			return false, interrupted, fmt.Errorf("a message of %d bytes in an answer of %d", l, len(b))
		}
		mtyp := binary.NativeEndian.Uint16(b[4:6])
		mflags := binary.NativeEndian.Uint16(b[6:8])
		mseq := binary.NativeEndian.Uint32(b[8:12])
		m := b[unix.NLMSG_HDRLEN:l]
		b = b[min(nlmAlign(l), len(b)):]
		if mseq != seq {
			continue
		}
		if mflags&unix.NLM_F_DUMP_INTR != 0 {
			interrupted = true
		}
		switch mtyp {
		case unix.NLMSG_DONE, unix.NLMSG_ERROR: // a DONE's payload, if any, is the dump's own error
			if len(m) >= 4 {
				if e := ackErrno(m); e != 0 {
					return true, interrupted, e
				}
			}
			return true, interrupted, nil
		case typ:
			each(m)
		}
	}
	return false, interrupted, nil
}

func nlmAlign(n int) int { return (n + unix.NLMSG_ALIGNTO - 1) &^ (unix.NLMSG_ALIGNTO - 1) }

// attrs calls each with the type and value of every attribute in b, and
// reports false when b is not a well-formed list of them.
func attrs(b []byte, each func(typ uint16, v []byte)) bool {
	for len(b) >= unix.SizeofRtAttr {
		l := int(binary.NativeEndian.Uint16(b[0:2]))
		if l < unix.SizeofRtAttr || l > len(b) {
			return false
		}
		each(binary.NativeEndian.Uint16(b[2:4])&nl.NLA_TYPE_MASK, b[unix.SizeofRtAttr:l])
		b = b[min(nlaAlign(l), len(b)):]
	}
	return true
}

func nlaAlign(n int) int { return (n + unix.RTA_ALIGNTO - 1) &^ (unix.RTA_ALIGNTO - 1) }

// decodeNeigh reads one RTM_NEWNEIGH answer, keeping it only if it is of
// family and link (the kernel may answer for others), as NeighList does.
func decodeNeigh(m []byte, link, family int) (NeighInfo, bool) {
	if len(m) < unix.SizeofNdMsg {
		return NeighInfo{}, false
	}
	fam, idx := int(m[0]), int(int32(binary.NativeEndian.Uint32(m[4:8])))
	if link != 0 && idx != link || family != 0 && fam != family {
		return NeighInfo{}, false
	}
	n := NeighInfo{LinkIndex: idx, State: int(binary.NativeEndian.Uint16(m[8:10]))}
	ok := attrs(m[unix.SizeofNdMsg:], func(typ uint16, v []byte) {
		switch typ {
		case unix.NDA_DST:
			if ip, ok := netip.AddrFromSlice(v); ok {
				n.IP = ip.Unmap()
			}
		case unix.NDA_LLADDR:
			n.HasMAC = len(v) == 6
			if n.HasMAC {
				n.MAC = subnet.MAC(v)
			}
		}
	})
	return n, ok
}

// decodeRoute reads one RTM_NEWROUTE answer of family, leaving out cloned
// routes as RouteListFiltered does.
func decodeRoute(m []byte, family int) (RouteInfo, bool) {
	if len(m) < unix.SizeofRtMsg {
		return RouteInfo{}, false
	}
	fam, dstLen, table := int(m[0]), int(m[1]), int(m[4])
	rflags := binary.NativeEndian.Uint32(m[8:12])
	if family != netlink.FAMILY_ALL && fam != family || rflags&unix.RTM_F_CLONED != 0 {
		return RouteInfo{}, false
	}
	r := RouteInfo{Table: table, Protocol: netlink.RouteProtocol(m[5]), Type: int(m[7])}
	r.OnLink = rflags&unix.RTNH_F_ONLINK != 0
	var dst netip.Addr
	ok := attrs(m[unix.SizeofRtMsg:], func(typ uint16, v []byte) {
		switch typ {
		case unix.RTA_DST:
			dst, _ = netip.AddrFromSlice(v)
		case unix.RTA_GATEWAY:
			if ip, ok := netip.AddrFromSlice(v); ok {
				r.Gw = ip.Unmap()
			}
		case unix.RTA_OIF:
			r.LinkIndex = int(u32(v))
		case unix.RTA_PRIORITY:
			r.Priority = int(u32(v))
		case unix.RTA_TABLE:
			r.Table = int(u32(v))
		}
	})
	if !dst.IsValid() { // the default route, as netlink.Handle reports it
		switch fam {
		case unix.AF_INET:
			dst = netip.IPv4Unspecified()
		case unix.AF_INET6:
			dst = netip.IPv6Unspecified()
		}
	}
	if dst.IsValid() {
		r.Dst = netip.PrefixFrom(dst.Unmap(), dstLen)
	}
	return r, ok
}

// u32 is a native-endian 32-bit attribute (0 when too short).
func u32(v []byte) uint32 {
	if len(v) < 4 {
		return 0
	}
	return binary.NativeEndian.Uint32(v)
}
