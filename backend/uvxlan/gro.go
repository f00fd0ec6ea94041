package uvxlan

import (
	"bytes"
	"encoding/binary"
)

// coalescer merges consecutive in-order TCP segments of one flow, received
// from the underlay, into one large frame that is written to the TAP with a
// virtio-net GSO header: the kernel then handles one super-frame instead of
// dozens of small ones (software GRO). Frames that cannot be merged are
// written as they are. Every merged segment's TCP checksum is verified
// first; a segment with a bad checksum is passed on unmerged so that the
// kernel drops it, and the merged frame carries NEEDS_CSUM with the
// pseudo-header sum, as GRO does.
//
// The UDP socket's own GRO already groups the datagrams of one outer flow,
// and one inner flow always uses one outer source port, so a single open
// run (no flow table) catches almost every merge.
type coalescer struct {
	buf   []byte // virtio-net header + frame under construction
	n     int    // bytes of frame in buf[virtioNetHdrLen:]; 0 = no run
	count int    // segments merged into the run
	mss   int    // payload size of the run's segments
	hdr   int    // Ethernet + IP + TCP header length of the run
	tcp   int    // offset of the TCP header
	v6    bool
	next  uint32 // sequence number the next segment must carry
	full  bool   // the run took a short or PSH segment: nothing may follow
	write func([]byte) error
}

func newCoalescer(write func([]byte) error) *coalescer {
	return &coalescer{buf: make([]byte, virtioNetHdrLen+ethHeaderLen+maxIPPacket), write: write}
}

// tcpSeg describes an inner TCP segment that may be merged.
type tcpSeg struct {
	v6       bool
	tcp, hdr int // TCP header offset, header length (all from frame start)
	seq      uint32
	flags    uint8
	payload  int
}

// parseTCPSeg reports whether frame is a plain TCP segment eligible for
// merging (IPv4 without options or fragments, IPv6 without extension
// headers; only ACK and PSH flags; some payload) and describes it.
func parseTCPSeg(frame []byte) (tcpSeg, bool) {
	var s tcpSeg
	if len(frame) < ethHeaderLen+ipv4HeaderLenMin+tcpHeaderLenMin {
		return s, false
	}
	ip := frame[ethHeaderLen:]
	var ipLen int
	switch binary.BigEndian.Uint16(frame[12:]) {
	case etherTypeIPv4:
		if ip[0] != 0x45 || ip[9] != 6 || binary.BigEndian.Uint16(ip[6:])&0x3fff != 0 {
			return s, false
		}
		ipLen = int(binary.BigEndian.Uint16(ip[2:]))
		s.tcp = ethHeaderLen + ipv4HeaderLenMin
	case etherTypeIPv6:
		if len(ip) < ipv6HeaderLen+tcpHeaderLenMin || ip[0]>>4 != 6 || ip[6] != 6 {
			return s, false
		}
		ipLen = ipv6HeaderLen + int(binary.BigEndian.Uint16(ip[4:]))
		s.tcp, s.v6 = ethHeaderLen+ipv6HeaderLen, true
	default:
		return s, false
	}
	if ethHeaderLen+ipLen != len(frame) {
		return s, false // padded or truncated: leave it to the kernel
	}
	th := frame[s.tcp:]
	s.hdr = s.tcp + int(th[12]>>4)*4
	s.flags = th[13]
	s.seq = binary.BigEndian.Uint32(th[4:])
	s.payload = len(frame) - s.hdr
	if s.hdr < s.tcp+tcpHeaderLenMin || s.payload <= 0 || s.flags&^tcpFlagPSH != tcpFlagACK {
		return s, false
	}
	return s, true
}

// tcpChecksumOK verifies a segment's TCP checksum.
func tcpChecksumOK(frame []byte, s tcpSeg) bool {
	addrOff, addrLen := ethHeaderLen+12, 4
	if s.v6 {
		addrOff, addrLen = ethHeaderLen+8, 16
	}
	sum := checksumAdd(frame[addrOff:addrOff+2*addrLen], 6+uint64(len(frame)-s.tcp))
	return checksumFold(checksumAdd(frame[s.tcp:], sum)) == 0xffff
}

// add takes one decapsulated frame. It returns the first write error.
func (c *coalescer) add(frame []byte) error {
	s, ok := parseTCPSeg(frame)
	if ok && c.n > 0 && c.fits(frame, s) {
		if !tcpChecksumOK(frame, s) {
			return c.single(frame)
		}
		copy(c.buf[virtioNetHdrLen+c.n:], frame[s.hdr:])
		c.n += s.payload
		c.count++
		c.next += uint32(s.payload)
		// The newest window and PSH win, as in the kernel's GRO.
		head := c.buf[virtioNetHdrLen:]
		copy(head[c.tcp+14:c.tcp+16], frame[s.tcp+14:s.tcp+16])
		head[c.tcp+13] |= s.flags & tcpFlagPSH
		c.full = s.payload < c.mss || s.flags&tcpFlagPSH != 0 || c.count == maxGSOSegments
		return nil
	}
	if err := c.flush(); err != nil {
		return err
	}
	if !ok || s.flags&tcpFlagPSH != 0 || !tcpChecksumOK(frame, s) {
		return c.single(frame)
	}
	copy(c.buf[virtioNetHdrLen:], frame)
	c.n, c.count, c.mss, c.hdr, c.tcp, c.v6 = len(frame), 1, s.payload, s.hdr, s.tcp, s.v6
	c.next = s.seq + uint32(s.payload)
	c.full = false
	return nil
}

// fits reports whether segment s (frame) continues the open run.
func (c *coalescer) fits(frame []byte, s tcpSeg) bool {
	if c.full || s.v6 != c.v6 || s.hdr != c.hdr || s.seq != c.next || s.payload > c.mss ||
		c.n+s.payload > ethHeaderLen+maxIPPacket {
		return false
	}
	head := c.buf[virtioNetHdrLen : virtioNetHdrLen+c.hdr]
	// Ethernet header; the IP header but for length, ID and checksum
	// (IPv4) or payload length (IPv6); ports, ack, data offset, flags and
	// options of TCP. Window, sequence number and checksum may differ.
	if !bytes.Equal(head[:ethHeaderLen], frame[:ethHeaderLen]) {
		return false
	}
	ip, hip := frame[ethHeaderLen:s.tcp], head[ethHeaderLen:c.tcp]
	if c.v6 {
		if !bytes.Equal(ip[:4], hip[:4]) || !bytes.Equal(ip[6:], hip[6:]) {
			return false
		}
	} else if ip[1] != hip[1] || !bytes.Equal(ip[6:10], hip[6:10]) || !bytes.Equal(ip[12:], hip[12:]) {
		return false
	}
	th, hth := frame[s.tcp:s.hdr], head[c.tcp:c.hdr]
	return bytes.Equal(th[:4], hth[:4]) && bytes.Equal(th[8:13], hth[8:13]) &&
		th[13]&^tcpFlagPSH == hth[13] && bytes.Equal(th[20:], hth[20:])
}

// single writes frame to the TAP on its own, with an empty virtio-net header.
func (c *coalescer) single(frame []byte) error {
	if err := c.flush(); err != nil {
		return err
	}
	clear(c.buf[:virtioNetHdrLen])
	copy(c.buf[virtioNetHdrLen:], frame)
	return c.write(c.buf[:virtioNetHdrLen+len(frame)])
}

// flush writes the open run, if any.
func (c *coalescer) flush() error {
	if c.n == 0 {
		return nil
	}
	n := c.n
	c.n = 0
	frame := c.buf[virtioNetHdrLen : virtioNetHdrLen+n]
	if c.count == 1 {
		clear(c.buf[:virtioNetHdrLen])
		return c.write(c.buf[:virtioNetHdrLen+n])
	}
	ip := frame[ethHeaderLen:]
	h := vnetHdr{
		flags: vnetFlagNeedsCsum, gsoType: vnetGSOTCPv4, hdrLen: uint16(c.hdr), gsoSize: uint16(c.mss),
		csumStart: uint16(c.tcp), csumOffset: 16,
	}
	addrOff, addrLen := ethHeaderLen+12, 4
	if c.v6 {
		h.gsoType = vnetGSOTCPv6
		addrOff, addrLen = ethHeaderLen+8, 16
		binary.BigEndian.PutUint16(ip[4:], uint16(n-ethHeaderLen-ipv6HeaderLen))
	} else {
		binary.BigEndian.PutUint16(ip[2:], uint16(n-ethHeaderLen))
		ip[10], ip[11] = 0, 0
		binary.BigEndian.PutUint16(ip[10:], ^checksumFold(checksumAdd(ip[:ipv4HeaderLenMin], 0)))
	}
	// NEEDS_CSUM: the checksum field holds the pseudo-header sum, not complemented.
	pseudo := checksumAdd(frame[addrOff:addrOff+2*addrLen], 6+uint64(n-c.tcp))
	binary.BigEndian.PutUint16(frame[c.tcp+16:], checksumFold(pseudo))
	h.encode(c.buf[:virtioNetHdrLen])
	return c.write(c.buf[:virtioNetHdrLen+n])
}
