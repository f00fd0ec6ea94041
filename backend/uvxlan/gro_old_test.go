package uvxlan

// TEMPORARY: the oldCoalescer before issue 10, for a benchmark comparison only.

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"
)

// oldGroFlows is how many TCP flows the oldCoalescer keeps open runs for.
// Flows that share an outer source port arrive interleaved in one UDP GRO
// batch; a few runs keep merging them.
const oldGroFlows = 4

// oldCoalescer merges in-order TCP segments of a flow, received from the
// underlay, into one large frame that is written to the TAP with a
// virtio-net GSO header: the kernel then handles one super-frame instead of
// dozens of small ones (software GRO). Frames that cannot be merged are
// written as they are. Every merged segment's TCP checksum is verified
// first; a segment with a bad checksum is passed on unmerged so that the
// kernel drops it, and the merged frame carries NEEDS_CSUM with the
// pseudo-header sum, as GRO does.
//
// It keeps an open run for each of up to oldGroFlows flows; when another flow
// comes, the oldest run is written. Frames of one flow never overtake each
// other; frames of different flows may.
type oldCoalescer struct {
	runs     [oldGroFlows]oldGroRun
	clock    uint64 // orders the runs by age
	one      []byte // virtio-net header + a frame written on its own
	write    func([]byte) error
	skipCsum bool
}

// oldGroRun is one flow's frame under construction.
type oldGroRun struct {
	buf   []byte // virtio-net header + frame
	n     int    // bytes of frame in buf[virtioNetHdrLen:]; 0 = no run
	count int    // segments merged into the run
	mss   int    // payload size of the run's segments
	hdr   int    // Ethernet + IP + TCP header length of the run
	tcp   int    // offset of the TCP header
	v6    bool
	next  uint32 // sequence number the next segment must carry
	full  bool   // the run took a short or PSH segment: nothing may follow
	born  uint64 // clock when the run started
}

func newOldCoalescer(write func([]byte) error) *oldCoalescer {
	c := &oldCoalescer{one: make([]byte, virtioNetHdrLen+ethHeaderLen+maxIPPacket), write: write}
	for i := range c.runs {
		c.runs[i].buf = make([]byte, virtioNetHdrLen+ethHeaderLen+maxIPPacket)
	}
	return c
}

// oldTcpSeg describes an inner TCP segment that may be merged.
type oldTcpSeg struct {
	v6       bool
	tcp, hdr int // TCP header offset, header length (all from frame start)
	seq      uint32
	flags    uint8
	payload  int
}

// oldParseTCPSeg reports whether frame is a plain TCP segment eligible for
// merging (IPv4 without options or fragments, IPv6 without extension
// headers; only ACK and PSH flags; some payload) and describes it.
func oldParseTCPSeg(frame []byte) (oldTcpSeg, bool) {
	var s oldTcpSeg
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

// oldTcpChecksumOK verifies a segment's TCP checksum.
func oldTcpChecksumOK(frame []byte, s oldTcpSeg) bool {
	addrOff, addrLen := ethHeaderLen+12, 4
	if s.v6 {
		addrOff, addrLen = ethHeaderLen+8, 16
	}
	sum := checksumAdd(frame[addrOff:addrOff+2*addrLen], 6+uint64(len(frame)-s.tcp))
	return checksumFold(checksumAdd(frame[s.tcp:], sum)) == 0xffff
}

// add takes one decapsulated frame. It returns the first write error.
func (c *oldCoalescer) add(frame []byte) error {
	s, ok := oldParseTCPSeg(frame)
	if !ok {
		return c.single(frame)
	}
	r := c.runFor(frame, s)
	if r.n > 0 && r.fits(frame, s) {
		if !(c.skipCsum || oldTcpChecksumOK(frame, s)) {
			if err := c.flushRun(r); err != nil {
				return err
			}
			return c.single(frame)
		}
		r.append(frame, s)
		return nil
	}
	if err := c.flushRun(r); err != nil {
		return err
	}
	if s.flags&tcpFlagPSH != 0 || !(c.skipCsum || oldTcpChecksumOK(frame, s)) {
		return c.single(frame)
	}
	copy(r.buf[virtioNetHdrLen:], frame)
	r.n, r.count, r.mss, r.hdr, r.tcp, r.v6 = len(frame), 1, s.payload, s.hdr, s.tcp, s.v6
	r.next = s.seq + uint32(s.payload)
	r.full = false
	c.clock++
	r.born = c.clock
	return nil
}

// runFor returns the run of frame's flow, else an empty run, else the
// oldest run (which the caller writes out before reusing it).
func (c *oldCoalescer) runFor(frame []byte, s oldTcpSeg) *oldGroRun {
	var empty, oldest *oldGroRun
	for i := range c.runs {
		r := &c.runs[i]
		switch {
		case r.n == 0:
			if empty == nil {
				empty = r
			}
		case r.sameFlow(frame, s):
			return r
		case oldest == nil || r.born < oldest.born:
			oldest = r
		}
	}
	if empty != nil {
		return empty
	}
	return oldest
}

// sameFlow reports whether frame belongs to the run's flow: same MACs,
// addresses and ports.
func (r *oldGroRun) sameFlow(frame []byte, s oldTcpSeg) bool {
	if s.v6 != r.v6 || s.tcp != r.tcp {
		return false
	}
	head := r.buf[virtioNetHdrLen:]
	addr, n := ethHeaderLen+12, 8
	if r.v6 {
		addr, n = ethHeaderLen+8, 32
	}
	return bytes.Equal(head[:12], frame[:12]) && bytes.Equal(head[addr:addr+n], frame[addr:addr+n]) &&
		bytes.Equal(head[r.tcp:r.tcp+4], frame[s.tcp:s.tcp+4])
}

// append adds the payload of segment s (frame) to the run.
func (r *oldGroRun) append(frame []byte, s oldTcpSeg) {
	copy(r.buf[virtioNetHdrLen+r.n:], frame[s.hdr:])
	r.n += s.payload
	r.count++
	r.next += uint32(s.payload)
	// The newest window and PSH win, as in the kernel's GRO.
	head := r.buf[virtioNetHdrLen:]
	copy(head[r.tcp+14:r.tcp+16], frame[s.tcp+14:s.tcp+16])
	head[r.tcp+13] |= s.flags & tcpFlagPSH
	r.full = s.payload < r.mss || s.flags&tcpFlagPSH != 0 || r.count == maxGSOSegments
}

// fits reports whether segment s (frame) of the run's flow continues it.
func (r *oldGroRun) fits(frame []byte, s oldTcpSeg) bool {
	if r.full || s.hdr != r.hdr || s.seq != r.next || s.payload > r.mss ||
		r.n+s.payload > ethHeaderLen+maxIPPacket {
		return false
	}
	head := r.buf[virtioNetHdrLen : virtioNetHdrLen+r.hdr]
	// Ethernet header; the IP header but for length, ID and checksum
	// (IPv4) or payload length (IPv6); ports, ack, data offset, flags and
	// options of TCP. Window, sequence number and checksum may differ.
	if !bytes.Equal(head[:ethHeaderLen], frame[:ethHeaderLen]) {
		return false
	}
	ip, hip := frame[ethHeaderLen:s.tcp], head[ethHeaderLen:r.tcp]
	if r.v6 {
		if !bytes.Equal(ip[:4], hip[:4]) || !bytes.Equal(ip[6:], hip[6:]) {
			return false
		}
	} else if ip[1] != hip[1] || !bytes.Equal(ip[6:10], hip[6:10]) || !bytes.Equal(ip[12:], hip[12:]) {
		return false
	}
	th, hth := frame[s.tcp:s.hdr], head[r.tcp:r.hdr]
	return bytes.Equal(th[:4], hth[:4]) && bytes.Equal(th[8:13], hth[8:13]) &&
		th[13]&^tcpFlagPSH == hth[13] && bytes.Equal(th[20:], hth[20:])
}

// single writes frame to the TAP on its own, with an empty virtio-net header.
func (c *oldCoalescer) single(frame []byte) error {
	clear(c.one[:virtioNetHdrLen])
	copy(c.one[virtioNetHdrLen:], frame)
	return c.write(c.one[:virtioNetHdrLen+len(frame)])
}

// flush writes every open run.
func (c *oldCoalescer) flush() error {
	var first error
	for i := range c.runs {
		if err := c.flushRun(&c.runs[i]); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// flushRun writes the run, if open, and empties it.
func (c *oldCoalescer) flushRun(r *oldGroRun) error {
	if r.n == 0 {
		return nil
	}
	n := r.n
	r.n = 0
	frame := r.buf[virtioNetHdrLen : virtioNetHdrLen+n]
	if r.count == 1 {
		clear(r.buf[:virtioNetHdrLen])
		return c.write(r.buf[:virtioNetHdrLen+n])
	}
	ip := frame[ethHeaderLen:]
	h := vnetHdr{
		flags: vnetFlagNeedsCsum, gsoType: vnetGSOTCPv4, hdrLen: uint16(r.hdr), gsoSize: uint16(r.mss),
		csumStart: uint16(r.tcp), csumOffset: 16,
	}
	addrOff, addrLen := ethHeaderLen+12, 4
	if r.v6 {
		h.gsoType = vnetGSOTCPv6
		addrOff, addrLen = ethHeaderLen+8, 16
		binary.BigEndian.PutUint16(ip[4:], uint16(n-ethHeaderLen-ipv6HeaderLen))
	} else {
		binary.BigEndian.PutUint16(ip[2:], uint16(n-ethHeaderLen))
		ip[10], ip[11] = 0, 0
		binary.BigEndian.PutUint16(ip[10:], ^checksumFold(checksumAdd(ip[:ipv4HeaderLenMin], 0)))
	}
	// NEEDS_CSUM: the checksum field holds the pseudo-header sum, not complemented.
	pseudo := checksumAdd(frame[addrOff:addrOff+2*addrLen], 6+uint64(n-r.tcp))
	binary.BigEndian.PutUint16(frame[r.tcp+16:], checksumFold(pseudo))
	h.encode(r.buf[:virtioNetHdrLen])
	return c.write(r.buf[:virtioNetHdrLen+n])
}

func BenchmarkCoalesceOld(b *testing.B) {
	for _, skip := range []bool{false, true} {
		for _, flows := range []int{1, 16} {
			b.Run(fmt.Sprintf("skipCsum=%v/flows=%d", skip, flows), func(b *testing.B) {
				frames := coalesceBatch(flows)
				writes := 0
				c := newOldCoalescer(func([]byte) error { writes++; return nil })
				c.skipCsum = skip
				b.SetBytes(int64(len(frames) * 1448))
				for b.Loop() {
					for _, f := range frames {
						c.add(f)
					}
					c.flush()
				}
				b.ReportMetric(float64(writes)/float64(b.N), "writes/op")
			})
		}
	}
}
