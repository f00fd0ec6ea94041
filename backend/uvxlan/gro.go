package uvxlan

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/maphash"
)

// l4Csum tells the coalescer the state of a frame's TCP or UDP checksum.
// The zero value means the checksum (if the frame has one) is complete and
// the caller has verified it. A non-zero start means the L4 checksum field
// at frame[start+offset:] holds only the pseudo-header sum, which is what a
// CHECKSUM_PARTIAL kernel sender leaves on a virtual link, and the receiver
// is to complete it: start is the offset of the L4 header from the start of
// the Ethernet frame, offset is 16 for TCP and 6 for UDP.
type l4Csum struct{ start, offset uint16 }

// Capacity of the coalescer per receive batch. When a batch brings more
// flows or segments than this, everything held is written early, which
// costs merging, never order.
const (
	groTableSize = 512  // flow table slots (a power of two, twice groMaxFlows)
	groMaxFlows  = 256  // flows that hold a run in one batch
	groMaxSegs   = 1024 // segments held in one batch
)

var errFrameTooLong = errors.New("frame too long for the tap")

// coalescer merges consecutive TCP segments of a flow, received from the
// underlay, into one large frame that is written to the TAP with a
// virtio-net GSO header: the kernel then handles one super-frame instead of
// dozens of small ones (software GRO). It is owned by one ingress loop
// (no locking) and does not allocate after construction.
//
// Order: frames of one flow (addresses and ports) reach the TAP in the
// order they were added, with one exception that repairs rather than
// causes reordering: a segment that ends exactly where a held run begins is
// put in front of it. Whatever cannot join the flow's run (FIN, RST, SYN,
// URG, a segment without payload, a gap or overlap in sequence numbers, a
// change of ACK, window, options or IP header, IP options, a fragment)
// first makes the run be written, then is written itself; a fragment or
// an IPv6 extension header, whose flow is unknown, writes every run first.
// A run ends after a PSH segment or one shorter than the run's first (its
// MSS), at 64 segments or 64 KB; a CWR segment may only start one; without
// DF, IPv4 IDs must count up by one (rules of the kernel's GRO). Frames of
// different flows may overtake each other.
//
// Runs hold references to the frames, not copies, and a run is written
// as a gather list: the virtio-net header and the run's headers from a
// small buffer, then each segment's payload where it lies. The caller must
// leave every frame it added unchanged until flush returns (the ingress
// loop reuses its receive buffers only after flush).
//
// Checksums are not verified here: every frame handed to add has a correct
// L4 checksum, or a partial one described by its l4Csum. A merged frame
// carries NEEDS_CSUM with the pseudo-header sum, as the kernel's GRO leaves
// it.
type coalescer struct {
	writev func(iov [][]byte) error // writes one frame gathered from iov
	iov    [][]byte                 // the gather list being written
	hdr    []byte                   // virtio-net header + the headers of the frame being written
	seed   maphash.Seed
	gen    uint64 // flow slots of an older generation are free
	flows  [groTableSize]groFlow
	nflows int
	open   []int32 // flow slots that started a run in this batch, in order
	segs   [groMaxSegs]groSeg
	nsegs  int
	last   int32 // slot of the last flow looked up: segments come in trains
}

// groSeg is one held segment: a reference to the caller's frame.
type groSeg struct {
	frame []byte
	next  int32 // next segment of the run in sequence order; -1: last
}

// groFlow is one flow's slot in the table.
type groFlow struct {
	gen    uint64
	key    [36]byte // addresses and ports
	klen   uint8
	slot   int32 // index in coalescer.flows
	listed bool  // in coalescer.open
	run    groRun
}

// groRun is the run a flow holds: segments in sequence order.
type groRun struct {
	head, tail int32 // segment indices; head < 0: no run
	count      int
	mss        int    // payload of the first segment: no later one may be longer
	last       int    // payload of the last segment
	bytes      int    // payload held
	hdr, tcp   int    // header length (Ethernet to TCP options); TCP header offset
	seq, next  uint32 // first and next sequence number
	id         uint16 // IPv4 ID of the first segment
	df, v6     bool
	cwr        bool   // the first segment has CWR: nothing may come before it
	cs         l4Csum // checksum state of the only segment while count == 1
}

// maxMergeHeader bounds the headers (Ethernet to TCP options) of a frame
// the coalescer merges: 14 + 60 + 60 for IPv4, 14 + 40 + 60 for IPv6.
const maxMergeHeader = ethHeaderLen + 60 + 60

// newGatherCoalescer returns a coalescer that writes each frame as a gather
// list (a writev).
func newGatherCoalescer(writev func(iov [][]byte) error) *coalescer {
	return &coalescer{
		writev: writev,
		iov:    make([][]byte, 0, 1+maxGSOSegments),
		hdr:    make([]byte, virtioNetHdrLen+maxMergeHeader),
		seed:   maphash.MakeSeed(),
		gen:    1,
		open:   make([]int32, 0, groMaxFlows),
	}
}

// newCoalescer returns a coalescer that writes each frame whole, from one
// buffer: write gets the virtio-net header and the frame.
func newCoalescer(write func([]byte) error) *coalescer {
	buf := make([]byte, 0, virtioNetHdrLen+ethHeaderLen+maxIPPacket)
	return newGatherCoalescer(func(iov [][]byte) error {
		b := buf[:0]
		for _, p := range iov {
			b = append(b, p...)
		}
		return write(b)
	})
}

// segKind is what add does with a frame.
type segKind uint8

const (
	segOther    segKind = iota // not TCP: written at once
	segFlushAll                // TCP whose flow is unknown: every run is written first
	segTCP                     // TCP of a known flow
)

// tcpSeg describes an inner TCP segment.
type tcpSeg struct {
	v6        bool
	tcp, hdr  int // TCP header offset, header length (all from frame start)
	seq       uint32
	flags     uint8
	payload   int
	id        uint16 // IPv4 ID
	df        bool   // IPv4 don't-fragment, or IPv6: IDs need not be consecutive
	mergeable bool
	key       [36]byte
	klen      uint8
}

// ipv6ExtHeader reports whether next-header value nh is an IPv6 extension
// header, behind which a TCP header may hide.
func ipv6ExtHeader(nh uint8) bool {
	switch nh {
	case 0, 43, 44, 50, 51, 60, 135, 139, 140, 253, 254:
		return true
	}
	return false
}

// parseSeg classifies frame and, for TCP, describes the segment in s,
// which must be zero.
func parseSeg(frame []byte, cs l4Csum, s *tcpSeg) segKind {
	if len(frame) < ethHeaderLen+ipv4HeaderLenMin {
		return segOther
	}
	ip := frame[ethHeaderLen:]
	var ipLen int
	switch binary.BigEndian.Uint16(frame[12:]) {
	case etherTypeIPv4:
		if ip[0]>>4 != 4 || ip[9] != 6 {
			return segOther
		}
		if binary.BigEndian.Uint16(ip[6:])&0x3fff != 0 {
			return segFlushAll // a fragment: its flow is unknown
		}
		s.tcp, ipLen = ethHeaderLen+int(ip[0]&0x0f)*4, int(binary.BigEndian.Uint16(ip[2:]))
		s.id, s.df = binary.BigEndian.Uint16(ip[4:]), ip[6]&0x40 != 0
		s.klen = 12
		copy(s.key[:8], ip[12:20])
		s.mergeable = s.tcp == ethHeaderLen+ipv4HeaderLenMin && ipv4HeaderSum(ip) == 0xffff
	case etherTypeIPv6:
		if len(ip) < ipv6HeaderLen || ip[0]>>4 != 6 {
			return segOther
		}
		if ipv6ExtHeader(ip[6]) {
			return segFlushAll
		}
		if ip[6] != 6 {
			return segOther
		}
		s.v6, s.tcp, ipLen = true, ethHeaderLen+ipv6HeaderLen, ipv6HeaderLen+int(binary.BigEndian.Uint16(ip[4:]))
		s.df = true // no ID to keep consecutive
		s.klen = 36
		copy(s.key[:32], ip[8:40])
		s.mergeable = true
	default:
		return segOther
	}
	if s.tcp < ethHeaderLen+ipv4HeaderLenMin || s.tcp+tcpHeaderLenMin > len(frame) {
		*s = tcpSeg{}
		return segFlushAll // malformed; the kernel drops it
	}
	th := frame[s.tcp:]
	copy(s.key[s.klen-4:s.klen], th[:4])
	s.hdr = s.tcp + int(th[12]>>4)*4
	s.seq, s.flags = binary.BigEndian.Uint32(th[4:]), th[13]
	s.payload = len(frame) - s.hdr
	s.mergeable = s.mergeable && ethHeaderLen+ipLen == len(frame) && s.hdr >= s.tcp+tcpHeaderLenMin &&
		s.payload > 0 && s.flags&tcpFlagACK != 0 &&
		s.flags&(tcpFlagFIN|tcpFlagSYN|tcpFlagRST|tcpFlagURG) == 0 &&
		(cs == l4Csum{} || cs == l4Csum{uint16(s.tcp), 16})
	return segTCP
}

// ipv4HeaderSum is the folded sum of a 20-byte IPv4 header: 0xffff when
// its checksum is right.
func ipv4HeaderSum(ip []byte) uint16 {
	_ = ip[19]
	be := binary.BigEndian
	s := uint64(be.Uint32(ip)) + uint64(be.Uint32(ip[4:])) + uint64(be.Uint32(ip[8:])) +
		uint64(be.Uint32(ip[12:])) + uint64(be.Uint32(ip[16:]))
	return checksumFold(s)
}

// tcpChecksumOK verifies a segment's TCP checksum. The coalescer does not
// call it (its caller verifies checksums); tests do.
func tcpChecksumOK(frame []byte, s tcpSeg) bool {
	addrOff, addrLen := ethHeaderLen+12, 4
	if s.v6 {
		addrOff, addrLen = ethHeaderLen+8, 16
	}
	sum := checksumAdd(frame[addrOff:addrOff+2*addrLen], 6+uint64(len(frame)-s.tcp))
	return checksumFold(checksumAdd(frame[s.tcp:], sum)) == 0xffff
}

// add takes one decapsulated frame, with the state of its L4 checksum. A
// frame may be held until flush: the caller must leave its bytes unchanged
// until flush returns. add returns the first write error; the frame and
// everything held are handled regardless.
func (c *coalescer) add(frame []byte, cs l4Csum) error {
	var s tcpSeg
	kind := parseSeg(frame, cs, &s)
	switch {
	case kind == segOther:
		return c.single(frame, cs)
	case kind == segFlushAll:
		return errors.Join(c.flush(), c.single(frame, cs))
	case !s.mergeable:
		var err error
		if f := c.lookup(&s, false); f != nil {
			err = c.emit(f)
		}
		return errors.Join(err, c.single(frame, cs))
	}
	var err error
	if c.nflows == groMaxFlows || c.nsegs == groMaxSegs {
		err = c.flush()
	}
	f := c.lookup(&s, true)
	r := &f.run
	if r.head >= 0 {
		if c.merge(r, frame, &s) {
			if r.closed() {
				err = errors.Join(err, c.emit(f))
			}
			return err
		}
		err = errors.Join(err, c.emit(f))
	}
	if s.flags&tcpFlagPSH != 0 {
		return errors.Join(err, c.single(frame, cs)) // a run of one, ended at once
	}
	c.start(f, frame, &s, cs)
	return err
}

// lookup finds the slot of s's flow; with insert, it claims a free slot
// if there is none (the caller ensures there is room).
func (c *coalescer) lookup(s *tcpSeg, insert bool) *groFlow {
	key := s.key[:s.klen]
	if f := &c.flows[c.last]; f.gen == c.gen && f.key == s.key && f.klen == s.klen {
		return f
	}
	mask := uint64(groTableSize - 1)
	for i := maphash.Bytes(c.seed, key) & mask; ; i = (i + 1) & mask {
		f := &c.flows[i]
		if f.gen != c.gen {
			if !insert {
				return nil
			}
			*f = groFlow{gen: c.gen, key: s.key, klen: s.klen, slot: int32(i), run: groRun{head: -1}}
			c.nflows++
			c.last = int32(i)
			return f
		}
		if f.key == s.key && f.klen == s.klen {
			c.last = int32(i)
			return f
		}
	}
}

// start begins a run of one segment in flow f.
func (c *coalescer) start(f *groFlow, frame []byte, s *tcpSeg, cs l4Csum) {
	i := c.hold(frame)
	f.run = groRun{
		head: i, tail: i, count: 1, mss: s.payload, last: s.payload, bytes: s.payload,
		hdr: s.hdr, tcp: s.tcp, seq: s.seq, next: s.seq + uint32(s.payload),
		id: s.id, df: s.df, v6: s.v6, cwr: s.flags&tcpFlagCWR != 0, cs: cs,
	}
	if !f.listed {
		f.listed = true
		c.open = append(c.open, f.slot)
	}
}

// hold stores a reference to frame and returns its index.
func (c *coalescer) hold(frame []byte) int32 {
	i := int32(c.nsegs)
	c.segs[i] = groSeg{frame: frame, next: -1}
	c.nsegs++
	return i
}

// closed reports whether nothing more may be appended to the run.
func (r *groRun) closed() bool {
	return r.last < r.mss || r.count == maxGSOSegments ||
		r.hdr-ethHeaderLen+r.bytes+r.mss > maxIPPacket
}

// merge appends or prepends segment s (frame) to the run if it continues
// it exactly, and reports whether it did.
func (c *coalescer) merge(r *groRun, frame []byte, s *tcpSeg) bool {
	head := c.segs[r.head].frame
	if s.hdr != r.hdr || s.tcp != r.tcp || s.v6 != r.v6 || !sameHeaders(head, frame, r.tcp, r.hdr, r.v6) ||
		r.count == maxGSOSegments || r.hdr-ethHeaderLen+r.bytes+s.payload > maxIPPacket {
		return false
	}
	switch {
	case s.seq == r.next && !r.closed() && s.payload <= r.mss && s.flags&tcpFlagCWR == 0 &&
		(r.df || s.id == r.id+uint16(r.count)):
		i := c.hold(frame)
		c.segs[r.tail].next, r.tail = i, i
		r.next += uint32(s.payload)
		r.last = s.payload
		if s.flags&tcpFlagPSH != 0 {
			r.last = -1 // a PSH segment ends the run
		}
	case s.seq+uint32(s.payload) == r.seq && s.flags&(tcpFlagPSH|tcpFlagCWR) == 0 && !r.cwr &&
		(s.payload == r.mss || r.count == 1 && s.payload > r.mss) && (r.df || s.id+1 == r.id):
		i := c.hold(frame)
		c.segs[i].next, r.head = r.head, i
		r.seq, r.id, r.mss = s.seq, s.id, s.payload
	default:
		return false
	}
	r.count++
	r.bytes += s.payload
	return true
}

// sameHeaders reports whether frames a and b, with the same header layout,
// may be merged: the same Ethernet header; the same IP header but for
// length, ID and checksum (IPv4) or payload length (IPv6); the same TCP
// ports, ACK, data offset, flags (but PSH and CWR), window, urgent pointer
// and options. Sequence numbers and checksums may differ.
func sameHeaders(a, b []byte, tcp, hdr int, v6 bool) bool {
	if !bytes.Equal(a[:ethHeaderLen], b[:ethHeaderLen]) {
		return false
	}
	ia, ib := a[ethHeaderLen:tcp], b[ethHeaderLen:tcp]
	if v6 {
		if !bytes.Equal(ia[:4], ib[:4]) || !bytes.Equal(ia[6:], ib[6:]) {
			return false
		}
	} else if ia[1] != ib[1] || ia[6] != ib[6] || !bytes.Equal(ia[8:10], ib[8:10]) || !bytes.Equal(ia[12:], ib[12:]) {
		return false
	}
	ta, tb := a[tcp:hdr], b[tcp:hdr]
	return bytes.Equal(ta[:4], tb[:4]) && bytes.Equal(ta[8:13], tb[8:13]) &&
		(ta[13]^tb[13])&^(tcpFlagPSH|tcpFlagCWR) == 0 &&
		bytes.Equal(ta[14:16], tb[14:16]) && bytes.Equal(ta[18:], tb[18:])
}

// single writes frame to the TAP on its own: with an all-zero virtio-net
// header if its checksum is complete, else with NEEDS_CSUM and where the
// kernel is to complete the checksum.
func (c *coalescer) single(frame []byte, cs l4Csum) error {
	if len(frame) > ethHeaderLen+maxIPPacket {
		return errFrameTooLong
	}
	h := vnetHdr{}
	if cs.start != 0 {
		h = vnetHdr{flags: vnetFlagNeedsCsum, csumStart: cs.start, csumOffset: cs.offset}
	}
	h.encode(c.hdr)
	c.iov = append(c.iov[:0], c.hdr[:virtioNetHdrLen])
	if len(frame) > 0 {
		c.iov = append(c.iov, frame)
	}
	return c.writev(c.iov)
}

// flush writes every held run; the ingress loop calls it at the end of
// each receive batch, before the frames' memory is reused.
func (c *coalescer) flush() error {
	var first error
	for _, i := range c.open {
		if err := c.emit(&c.flows[i]); err != nil && first == nil {
			first = err
		}
	}
	c.open = c.open[:0]
	c.gen++
	c.nflows, c.nsegs = 0, 0
	return first
}

// emit writes flow f's run, if any, and empties it.
func (c *coalescer) emit(f *groFlow) error {
	r := &f.run
	if r.head < 0 {
		return nil
	}
	head := c.segs[r.head].frame
	if r.count == 1 {
		r.head = -1
		return c.single(head, r.cs)
	}
	b := c.hdr[:virtioNetHdrLen+r.hdr] // parseSeg's layouts keep r.hdr within maxMergeHeader
	frame := b[virtioNetHdrLen:]       // the headers of the merged frame
	copy(frame, head[:r.hdr])
	n := r.hdr + r.bytes // the merged frame's length
	c.iov = append(c.iov[:0], b)
	for i := r.head; i >= 0; i = c.segs[i].next {
		c.iov = append(c.iov, c.segs[i].frame[r.hdr:]) // merge takes segments with payload only
	}
	if r.last < 0 {
		frame[r.tcp+13] |= tcpFlagPSH
	}
	h := vnetHdr{
		flags: vnetFlagNeedsCsum, gsoType: vnetGSOTCPv4, hdrLen: uint16(r.hdr), gsoSize: uint16(r.mss),
		csumStart: uint16(r.tcp), csumOffset: 16,
	}
	ip := frame[ethHeaderLen:]
	addrOff, addrLen := ethHeaderLen+12, 4
	if r.v6 {
		h.gsoType = vnetGSOTCPv6
		addrOff, addrLen = ethHeaderLen+8, 16
		binary.BigEndian.PutUint16(ip[4:], uint16(n-ethHeaderLen-ipv6HeaderLen))
	} else {
		binary.BigEndian.PutUint16(ip[2:], uint16(n-ethHeaderLen))
		ip[10], ip[11] = 0, 0
		binary.BigEndian.PutUint16(ip[10:], ^ipv4HeaderSum(ip))
	}
	if r.cwr {
		h.gsoType |= vnetGSOECN // CWR stays on the first segment only
	}
	// NEEDS_CSUM: the checksum field holds the pseudo-header sum, not complemented.
	pseudo := checksumAdd(frame[addrOff:addrOff+2*addrLen], 6+uint64(n-r.tcp))
	binary.BigEndian.PutUint16(frame[r.tcp+16:], checksumFold(pseudo))
	h.encode(b)
	r.head = -1
	return c.writev(c.iov)
}
