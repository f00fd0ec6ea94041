package uvxlan

// An oracle for the coalescer, independent of it: the frames are built, the
// TAP writes decoded, super-frames split and checksums computed here, with
// none of the package's helpers. For every flow, what reaches the TAP must
// be what was sent, segment by segment, in the order sent; the one freedom
// the coalescer has is to merge a segment in front of a held run that it
// precedes exactly (prepend).

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// oSum adds b to a one's-complement sum, 16 bits at a time (RFC 1071).
func oSum(b []byte, acc uint32) uint32 {
	for i := 0; i+1 < len(b); i += 2 {
		acc += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		acc += uint32(b[len(b)-1]) << 8
	}
	return acc
}

func oFold(acc uint32) uint16 {
	for acc > 0xffff {
		acc = acc>>16 + acc&0xffff
	}
	return uint16(acc)
}

// oRand is the randomness of a scenario: fuzz bytes first, then a PCG.
type oRand struct {
	data []byte
	pcg  *rand.Rand
}

func newORand(seed uint64, data []byte) *oRand {
	return &oRand{data: data, pcg: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

func (r *oRand) IntN(n int) int {
	if n <= 1 {
		return 0
	}
	if len(r.data) >= 2 {
		v := int(binary.BigEndian.Uint16(r.data))
		r.data = r.data[2:]
		return v % n
	}
	return r.pcg.IntN(n)
}

// oFlow is one TCP flow of a scenario, as its sender sees it.
type oFlow struct {
	id         int
	v6         bool
	mac        [6]byte
	src, dst   []byte
	sport      uint16
	dport      uint16
	seq, ack   uint32
	win        uint16
	ts         uint32 // timestamp option value; 0: no options
	tos, ttl   uint8
	df         bool
	ipid       uint16
	mss        int
	partialPct int // share of segments sent with a partial checksum
	sent       []oSent
	history    [][2]uint32 // seq, length of data segments sent
}

// oSent is one frame handed to the coalescer.
type oSent struct {
	frame []byte
	cs    l4Csum
}

// oSpec is one segment to build.
type oSpec struct {
	seq     uint32
	flags   uint8
	payload int
	partial bool
	ipOpts  bool // IPv4 options
	frag    bool // IPv4 more-fragments
	ext     bool // IPv6 hop-by-hop header
}

var oDstMAC = [6]byte{0x02, 0xaa, 0xbb, 0xcc, 0xdd, 0x01}

// oPayload is the byte at stream position seq of flow id.
func oPayload(id int, seq uint32) byte { return byte(seq*7 + uint32(id)*13 + seq>>9) }

// build makes the Ethernet frame of segment sp of flow f.
func (f *oFlow) build(sp oSpec) ([]byte, l4Csum) {
	tcpLen := 20
	if f.ts != 0 {
		tcpLen = 32
	}
	ipLen := 20
	switch {
	case f.v6 && sp.ext:
		ipLen = 48
	case f.v6:
		ipLen = 40
	case sp.ipOpts:
		ipLen = 24
	}
	b := make([]byte, 14+ipLen+tcpLen+sp.payload)
	copy(b, oDstMAC[:])
	copy(b[6:], f.mac[:])
	ip := b[14:]
	if f.v6 {
		binary.BigEndian.PutUint16(b[12:], 0x86dd)
		ip[0], ip[1], ip[2], ip[3] = 0x60|f.tos>>4, f.tos<<4, 0x01, byte(f.id)
		binary.BigEndian.PutUint16(ip[4:], uint16(ipLen-40+tcpLen+sp.payload))
		ip[6], ip[7] = 6, f.ttl
		copy(ip[8:], f.src)
		copy(ip[24:], f.dst)
		if sp.ext {
			ip[6] = 0
			copy(ip[40:], []byte{6, 0, 1, 4, 0, 0, 0, 0})
		}
	} else {
		binary.BigEndian.PutUint16(b[12:], 0x0800)
		ip[0], ip[1] = 0x40|byte(ipLen/4), f.tos
		binary.BigEndian.PutUint16(ip[2:], uint16(ipLen+tcpLen+sp.payload))
		binary.BigEndian.PutUint16(ip[4:], f.ipid)
		f.ipid++
		if f.df {
			ip[6] = 0x40
		}
		if sp.frag {
			ip[6] |= 0x20
		}
		ip[8], ip[9] = f.ttl, 6
		copy(ip[12:], f.src)
		copy(ip[16:], f.dst)
		if sp.ipOpts {
			copy(ip[20:], []byte{0x94, 4, 0, 0}) // router alert
		}
		binary.BigEndian.PutUint16(ip[10:], ^oFold(oSum(ip[:ipLen], 0)))
	}
	th := ip[ipLen:]
	binary.BigEndian.PutUint16(th, f.sport)
	binary.BigEndian.PutUint16(th[2:], f.dport)
	binary.BigEndian.PutUint32(th[4:], sp.seq)
	binary.BigEndian.PutUint32(th[8:], f.ack)
	th[12], th[13] = byte(tcpLen/4)<<4, sp.flags
	binary.BigEndian.PutUint16(th[14:], f.win)
	if f.ts != 0 {
		copy(th[20:], []byte{1, 1, 8, 10})
		binary.BigEndian.PutUint32(th[24:], f.ts)
		binary.BigEndian.PutUint32(th[28:], 77)
	}
	for i := range sp.payload {
		th[tcpLen+i] = oPayload(f.id, sp.seq+uint32(i))
	}
	pseudo := oSum(f.src, 0) + oSum(f.dst, 0) + 6 + uint32(tcpLen+sp.payload)
	if sp.partial {
		binary.BigEndian.PutUint16(th[16:], oFold(pseudo))
		return b, l4Csum{uint16(14 + ipLen), 16}
	}
	binary.BigEndian.PutUint16(th[16:], ^oFold(oSum(th, pseudo)))
	return b, l4Csum{}
}

// send builds sp and records it as the flow's next input.
func (f *oFlow) send(sp oSpec) oSent {
	fr, cs := f.build(sp)
	s := oSent{fr, cs}
	f.sent = append(f.sent, s)
	if sp.payload > 0 {
		f.history = append(f.history, [2]uint32{sp.seq, uint32(sp.payload)})
	}
	return s
}

func newOFlow(r *oRand, id int) *oFlow {
	f := &oFlow{
		id: id, v6: r.IntN(3) == 0, sport: uint16(20000 + id), dport: uint16(5201 + id%3),
		seq: uint32(r.IntN(1 << 16)), ack: 1000, win: 500, tos: 0, ttl: 64,
		df: r.IntN(4) != 0, ipid: uint16(r.IntN(1 << 16)), partialPct: []int{0, 0, 30, 100}[r.IntN(4)],
	}
	if r.IntN(4) == 0 {
		f.seq = 0 - uint32(1+r.IntN(50000)) // wraps around
	}
	f.mac = [6]byte{0x02, 0x11, 0, 0, byte(id >> 8), byte(id)}
	if r.IntN(2) == 0 {
		f.ts = 1 + uint32(r.IntN(1000))
	}
	f.mss = []int{1448, 1448, 1386, 1000, 536, 100, 1 + r.IntN(1448)}[r.IntN(7)]
	if f.v6 {
		f.src = []byte{0xfd, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, byte(id % 3), 2}
		f.dst = []byte{0xfd, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9, 3}
	} else {
		f.src = []byte{10, 244, byte(id % 3), 2}
		f.dst = []byte{10, 244, 9, 3}
	}
	return f
}

// data sends the flow's next n bytes.
func (f *oFlow) data(r *oRand, n int, flags uint8, out []oSent) []oSent {
	sp := oSpec{seq: f.seq, flags: tcpFlagACK | flags, payload: n, partial: r.IntN(100) < f.partialPct}
	f.seq += uint32(n)
	return append(out, f.send(sp))
}

// step sends what one random event of flow f puts on the wire.
func (f *oFlow) step(r *oRand, out []oSent) []oSent {
	ctl := func(flags uint8, n int) []oSent {
		sp := oSpec{seq: f.seq, flags: flags, payload: n}
		f.seq += uint32(n)
		return append(out, f.send(sp))
	}
	switch e := r.IntN(100); {
	case e < 55:
		return f.data(r, f.mss, 0, out)
	case e < 60:
		return f.data(r, f.mss, tcpFlagPSH, out)
	case e < 66:
		return f.data(r, 1+r.IntN(f.mss), []uint8{0, tcpFlagPSH}[r.IntN(2)], out)
	case e < 70:
		return ctl(tcpFlagACK, 0)
	case e < 72:
		return ctl(tcpFlagACK|tcpFlagFIN, r.IntN(2)*r.IntN(f.mss))
	case e < 73:
		return ctl(tcpFlagACK|tcpFlagRST, 0)
	case e < 74:
		return ctl(tcpFlagSYN, 0)
	case e < 75:
		return f.data(r, f.mss, tcpFlagURG, out)
	case e < 78 && len(f.history) > 0: // retransmission
		h := f.history[r.IntN(len(f.history))]
		return append(out, f.send(oSpec{seq: h[0], flags: tcpFlagACK, payload: int(h[1])}))
	case e < 80 && len(f.sent) > 0: // the network duplicates a frame
		last := f.sent[len(f.sent)-1]
		f.sent = append(f.sent, last)
		return append(out, last)
	case e < 82: // out of window
		return append(out, f.send(oSpec{seq: f.seq + 1<<31, flags: tcpFlagACK, payload: f.mss}))
	case e < 86:
		return f.reorder(r, out)
	case e < 88:
		f.win += uint16(1 + r.IntN(3))
	case e < 89:
		f.ack += uint32(1 + r.IntN(3000))
	case e < 91 && f.ts != 0:
		f.ts++
	case e < 92:
		return f.data(r, f.mss, tcpFlagCWR, out)
	case e < 93:
		return f.data(r, f.mss, tcpFlagECE, out)
	case e < 94:
		sp := oSpec{seq: f.seq, flags: tcpFlagACK, payload: f.mss, ipOpts: !f.v6, ext: f.v6}
		f.seq += uint32(f.mss)
		return append(out, f.send(sp))
	case e < 95 && !f.v6: // first fragment: MF set
		sp := oSpec{seq: f.seq, flags: tcpFlagACK, payload: f.mss, frag: true}
		f.seq += uint32(f.mss)
		return append(out, f.send(sp))
	case e < 96:
		f.ttl--
	case e < 97:
		f.ipid += uint16(1 + r.IntN(100))
	case e < 98:
		f.tos ^= 0x03 // ECN CE
	case e < 99:
		f.mac[5] ^= 0x80 // another sender MAC
	case !f.v6:
		f.df = !f.df
	}
	return f.data(r, f.mss, 0, out)
}

const tcpFlagECE = 0x40

// reorder sends the flow's next 2 to 4 segments in another order, as a
// network may.
func (f *oFlow) reorder(r *oRand, out []oSent) []oSent {
	k := 2 + r.IntN(3)
	batch := make([]oSent, k)
	for i := range batch {
		sp := oSpec{seq: f.seq, flags: tcpFlagACK, payload: f.mss, partial: r.IntN(100) < f.partialPct}
		switch r.IntN(12) {
		case 0:
			sp.flags |= tcpFlagPSH
		case 1:
			sp.flags |= tcpFlagCWR
		case 2:
			sp.payload = 1 + r.IntN(f.mss)
		case 3:
			sp.payload = f.mss + 1 + r.IntN(100)
		case 4:
			f.ipid += 5
		}
		f.seq += uint32(sp.payload)
		fr, cs := f.build(sp)
		batch[i] = oSent{fr, cs}
	}
	if r.IntN(3) == 0 {
		for i := range batch { // shuffle
			j := i + r.IntN(k-i)
			batch[i], batch[j] = batch[j], batch[i]
		}
	} else {
		slices.Reverse(batch)
	}
	f.sent = append(f.sent, batch...)
	return append(out, batch...)
}

// oOther builds a frame that is not TCP: UDP or ARP.
func oOther(r *oRand, n int) []byte {
	if r.IntN(2) == 0 {
		b := make([]byte, 42)
		copy(b, oDstMAC[:])
		binary.BigEndian.PutUint16(b[12:], 0x0806)
		b[41] = byte(n)
		return b
	}
	b := make([]byte, 14+20+8+1+r.IntN(200))
	copy(b, oDstMAC[:])
	binary.BigEndian.PutUint16(b[12:], 0x0800)
	ip := b[14:]
	ip[0], ip[8], ip[9] = 0x45, 64, 17
	binary.BigEndian.PutUint16(ip[2:], uint16(len(ip)))
	copy(ip[12:], []byte{10, 244, 1, 2, 10, 244, 9, 3})
	binary.BigEndian.PutUint16(ip[10:], ^oFold(oSum(ip[:20], 0)))
	binary.BigEndian.PutUint16(ip[20:], uint16(n))
	binary.BigEndian.PutUint16(ip[24:], uint16(len(ip)-20))
	return b
}

// oScenario is a random interleaving of many flows' segments in batches.
type oScenario struct {
	flows   []*oFlow
	batches [][]oSent // frames per receive batch, in arrival order
	other   []oSent   // the non-TCP frames, in order
}

func newOScenario(r *oRand, nflows, nframes, flushPct int) *oScenario {
	sc := &oScenario{}
	for i := range nflows {
		sc.flows = append(sc.flows, newOFlow(r, i))
	}
	var batch []oSent
	cur := sc.flows[0]
	for len(batch) > 0 || nframes > 0 {
		if nframes <= 0 || r.IntN(100) < flushPct {
			sc.batches = append(sc.batches, batch)
			batch = nil
			continue
		}
		if r.IntN(4) == 0 { // trains of one flow, as UDP GRO delivers them
			cur = sc.flows[r.IntN(len(sc.flows))]
		}
		n := len(batch)
		if r.IntN(50) == 0 {
			o := oSent{frame: oOther(r, len(sc.other))}
			sc.other = append(sc.other, o)
			batch = append(batch, o)
		} else {
			batch = cur.step(r, batch)
		}
		nframes -= len(batch) - n
	}
	return sc
}

// oWrite is one TAP write, decoded by the oracle.
type oWrite struct {
	flags, gsoType                           uint8
	hdrLen, gsoSize, csumStart, csumOffset int
	frame                                    []byte
}

// run feeds the scenario to a coalescer and returns its TAP writes.
func (sc *oScenario) run(t testing.TB) []oWrite {
	var got []oWrite
	c := newCoalescer(func(b []byte) error {
		le := binary.LittleEndian
		got = append(got, oWrite{
			flags: b[0], gsoType: b[1], hdrLen: int(le.Uint16(b[2:])), gsoSize: int(le.Uint16(b[4:])),
			csumStart: int(le.Uint16(b[6:])), csumOffset: int(le.Uint16(b[8:])), frame: slices.Clone(b[10:]),
		})
		return nil
	})
	for _, batch := range sc.batches {
		for _, s := range batch {
			if err := c.add(s.frame, s.cs); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.flush(); err != nil {
			t.Fatal(err)
		}
	}
	return got
}

// oTCP is what the oracle reads of a TCP frame.
type oTCP struct {
	v6             bool
	ip, tcp, hdr   int // offsets: IP header, TCP header, payload
	src, dst       []byte
	sport, dport   uint16
	seq            uint32
	flags          uint8
	df             bool
	nonTCP, broken bool
}

func oParse(b []byte) (p oTCP) {
	p.ip = 14
	if len(b) < 14+20 {
		p.nonTCP = true
		return p
	}
	switch binary.BigEndian.Uint16(b[12:]) {
	case 0x0800:
		if b[23] != 6 {
			p.nonTCP = true
			return p
		}
		p.tcp = 14 + int(b[14]&15)*4
		p.src, p.dst, p.df = b[26:30], b[30:34], b[20]&0x40 != 0
	case 0x86dd:
		p.v6, p.tcp = true, 54
		p.src, p.dst = b[22:38], b[38:54]
		if b[20] == 0 { // hop-by-hop
			p.tcp += 8 * (1 + int(b[55]))
		} else if b[20] != 6 {
			p.nonTCP = true
			return p
		}
	default:
		p.nonTCP = true
		return p
	}
	if p.tcp+20 > len(b) {
		p.broken = true
		return p
	}
	th := b[p.tcp:]
	p.sport, p.dport = binary.BigEndian.Uint16(th), binary.BigEndian.Uint16(th[2:])
	p.seq, p.flags = binary.BigEndian.Uint32(th[4:]), th[13]
	p.hdr = p.tcp + int(th[12]>>4)*4
	return p
}

// checkOracle verifies the TAP writes against the scenario.
func (sc *oScenario) checkOracle(got []oWrite) error {
	next := make([]int, len(sc.flows)) // per flow: index of the next input expected
	nextOther := 0
	for wi, w := range got {
		p := oParse(w.frame)
		if p.nonTCP {
			if nextOther >= len(sc.other) || !bytes.Equal(w.frame, sc.other[nextOther].frame) {
				return fmt.Errorf("write %d: a frame that is not TCP, out of order or changed", wi)
			}
			if w.flags|w.gsoType != 0 || w.hdrLen|w.gsoSize|w.csumStart|w.csumOffset != 0 {
				return fmt.Errorf("write %d: non-TCP frame with header %+v", wi, w)
			}
			nextOther++
			continue
		}
		if p.broken || p.sport < 20000 || int(p.sport-20000) >= len(sc.flows) {
			return fmt.Errorf("write %d: unknown frame", wi)
		}
		f := sc.flows[p.sport-20000]
		var n int
		var err error
		if w.gsoType == 0 {
			n, err = checkSingle(w, f.sent[next[f.id]:])
		} else {
			n, err = checkMerged(w, p, f.sent[next[f.id]:])
		}
		if err != nil {
			return fmt.Errorf("write %d (flow %d, input %d of %d): %w", wi, f.id, next[f.id], len(f.sent), err)
		}
		next[f.id] += n
	}
	for _, f := range sc.flows {
		if next[f.id] != len(f.sent) {
			return fmt.Errorf("flow %d: %d of %d frames reached the tap", f.id, next[f.id], len(f.sent))
		}
	}
	if nextOther != len(sc.other) {
		return fmt.Errorf("%d of %d non-TCP frames reached the tap", nextOther, len(sc.other))
	}
	return nil
}

// checkSingle: a frame written on its own is the next input, unchanged,
// behind a header that says how complete its checksum is.
func checkSingle(w oWrite, rest []oSent) (int, error) {
	if len(rest) == 0 {
		return 0, fmt.Errorf("a frame that was not sent (or sent fewer times)")
	}
	in := rest[0]
	if !bytes.Equal(w.frame, in.frame) {
		return 0, fmt.Errorf("single frame is not the next frame of its flow")
	}
	want := oWrite{}
	if in.cs != (l4Csum{}) {
		want = oWrite{flags: 1, csumStart: int(in.cs.start), csumOffset: int(in.cs.offset)}
	}
	want.frame = w.frame
	if w.flags != want.flags || w.hdrLen != 0 || w.gsoSize != 0 || w.csumStart != want.csumStart || w.csumOffset != want.csumOffset {
		return 0, fmt.Errorf("single frame header %+v, want flags %d start %d offset %d", w, want.flags, want.csumStart, want.csumOffset)
	}
	return 1, nil
}

// checkMerged: a super-frame has a layout the kernel accepts, and split at
// gso_size (as the kernel would) gives exactly the flow's next inputs, which
// arrived each at one end of what came before (append or prepend).
func checkMerged(w oWrite, p oTCP, rest []oSent) (int, error) {
	if err := checkLayout(w, p); err != nil {
		return 0, err
	}
	mss := w.gsoSize
	k := (len(w.frame) - p.hdr + mss - 1) / mss
	if k < 2 {
		return 0, fmt.Errorf("super-frame of %d segment(s)", k)
	}
	if k > len(rest) {
		return 0, fmt.Errorf("super-frame of %d segments, only %d inputs left", k, len(rest))
	}
	in := rest[:k]
	q := oParse(in[0].frame)
	lo := q.seq
	hi := lo + uint32(len(in[0].frame)-q.hdr)
	order := []int{0}
	for i := 1; i < k; i++ {
		q := oParse(in[i].frame)
		n := uint32(len(in[i].frame) - q.hdr)
		switch {
		case q.seq == hi:
			hi += n
			order = append(order, i)
		case q.seq+n == lo:
			lo = q.seq
			order = append([]int{i}, order...)
		default:
			return 0, fmt.Errorf("input %d (seq %d) does not continue [%d,%d) at either end", i, q.seq, lo, hi)
		}
	}
	if lo != p.seq {
		return 0, fmt.Errorf("super-frame starts at seq %d, inputs at %d", p.seq, lo)
	}
	for j, idx := range order {
		piece := oPiece(w.frame, p, mss, j, k)
		if !oSameSegment(piece, in[idx].frame, p) {
			return 0, fmt.Errorf("segment %d of %d (input %d) differs from what was sent", j, k, idx)
		}
	}
	return k, nil
}

// checkLayout checks the virtio-net header and the IP and TCP fields of a
// super-frame: NEEDS_CSUM with the pseudo-header sum in the checksum field.
func checkLayout(w oWrite, p oTCP) error {
	b := w.frame
	want := uint8(1)
	if p.v6 {
		want = 4
	}
	if p.flags&tcpFlagCWR != 0 {
		want |= 0x80
	}
	if w.flags != 1 || w.gsoType != want || w.hdrLen != p.hdr || w.csumStart != p.tcp || w.csumOffset != 16 || w.gsoSize == 0 {
		return fmt.Errorf("super-frame header %+v (tcp at %d, payload at %d)", w, p.tcp, p.hdr)
	}
	if p.v6 {
		if p.tcp != 54 || int(binary.BigEndian.Uint16(b[18:])) != len(b)-54 {
			return fmt.Errorf("bad IPv6 payload length or extension header")
		}
	} else if int(binary.BigEndian.Uint16(b[16:])) != len(b)-14 || oFold(oSum(b[14:p.tcp], 0)) != 0xffff {
		return fmt.Errorf("bad IPv4 total length or header checksum")
	}
	if len(b)-14 > 65535 {
		return fmt.Errorf("super-frame of %d bytes", len(b))
	}
	pseudo := oSum(p.src, 0) + oSum(p.dst, 0) + 6 + uint32(len(b)-p.tcp)
	if got := binary.BigEndian.Uint16(b[p.tcp+16:]); got != oFold(pseudo) {
		return fmt.Errorf("tcp checksum field %#04x, want the pseudo-header sum %#04x", got, oFold(pseudo))
	}
	return nil
}

// oPiece is segment j of k of super-frame b, cut as the kernel's GSO does:
// the IPv4 ID counts up from the first, FIN and PSH stay on the last
// segment, CWR on the first.
func oPiece(b []byte, p oTCP, mss, j, k int) []byte {
	payload := b[p.hdr:][j*mss : min((j+1)*mss, len(b)-p.hdr)]
	s := append(slices.Clone(b[:p.hdr]), payload...)
	if p.v6 {
		binary.BigEndian.PutUint16(s[18:], uint16(len(s)-54))
	} else {
		binary.BigEndian.PutUint16(s[16:], uint16(len(s)-14))
		binary.BigEndian.PutUint16(s[18:], binary.BigEndian.Uint16(b[18:])+uint16(j))
		s[24], s[25] = 0, 0
		binary.BigEndian.PutUint16(s[24:], ^oFold(oSum(s[14:p.tcp], 0)))
	}
	binary.BigEndian.PutUint32(s[p.tcp+4:], p.seq+uint32(j*mss))
	if j < k-1 {
		s[p.tcp+13] &^= tcpFlagFIN | tcpFlagPSH
	}
	if j > 0 {
		s[p.tcp+13] &^= tcpFlagCWR
	}
	return s
}

// oSameSegment compares a piece with the frame sent: every byte but the TCP
// checksum (complete or partial, the kernel computes it anew) and, with DF,
// the IPv4 ID and header checksum (IDs carry no meaning then).
func oSameSegment(piece, sent []byte, p oTCP) bool {
	if len(piece) != len(sent) {
		return false
	}
	a, b := slices.Clone(piece), slices.Clone(sent)
	for _, x := range [][]byte{a, b} {
		x[p.tcp+16], x[p.tcp+17] = 0, 0
		if !p.v6 && p.df {
			x[18], x[19], x[24], x[25] = 0, 0, 0, 0
		}
	}
	return bytes.Equal(a, b)
}

// oStats counts what reached the tap, so that the tests know merging
// happened at all (an oracle alone would accept a coalescer that never
// merges).
func oStats(got []oWrite) (merged, segs int) {
	for _, w := range got {
		if w.gsoType != 0 {
			merged++
			segs += (len(w.frame) - w.hdrLen + w.gsoSize - 1) / w.gsoSize
		}
	}
	return merged, segs
}

func TestCoalescerOracle(t *testing.T) {
	var merged, segs, frames int
	for i := range 120 {
		r := newORand(uint64(i), nil)
		nflows := []int{1, 2, 5, 16, 64, 100, 300}[i%7]
		nframes := 200 + r.IntN(1500)
		flushPct := []int{0, 1, 3, 10, 30}[i%5]
		sc := newOScenario(r, nflows, nframes, flushPct)
		got := sc.run(t)
		if err := sc.checkOracle(got); err != nil {
			t.Fatalf("seed %d (%d flows, %d frames, flush %d%%): %v", i, nflows, nframes, flushPct, err)
		}
		m, s := oStats(got)
		merged, segs, frames = merged+m, segs+s, frames+nframes
	}
	t.Logf("%d frames in, %d super-frames holding %d segments", frames, merged, segs)
	if merged == 0 || segs < frames/4 {
		t.Fatalf("too little merging: %d super-frames holding %d of %d frames", merged, segs, frames)
	}
}

// FuzzCoalescerOracle runs the oracle on scenarios drawn from the fuzz
// input: the flows' events and their interleaving come from data.
func FuzzCoalescerOracle(f *testing.F) {
	f.Add(uint64(1), uint8(3), uint8(5), []byte{})
	f.Add(uint64(7), uint8(64), uint8(0), []byte{0, 1, 0, 2, 0, 3, 0, 0x50, 0, 0x45})
	f.Add(uint64(99), uint8(1), uint8(2), bytes.Repeat([]byte{0, 0x51, 0, 3, 0, 0x4f}, 30))
	f.Fuzz(func(t *testing.T, seed uint64, nflows, flushPct uint8, data []byte) {
		r := newORand(seed, data)
		sc := newOScenario(r, 1+int(nflows)%80, 50+int(seed%400), int(flushPct)%40)
		if err := sc.checkOracle(sc.run(t)); err != nil {
			t.Fatal(err)
		}
	})
}
