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
// oWrite is one TAP write, decoded by the oracle.
type oWrite struct {
	flags, gsoType                         uint8
	hdrLen, gsoSize, csumStart, csumOffset int
	frame                                  []byte
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

// TestCoalescerScenarioDoesNotAllocate: every path (merges, prepends,
// control frames, partial checksums, fragments, a table that overflows)
// runs without allocating once the coalescer exists.
func TestCoalescerScenarioDoesNotAllocate(t *testing.T) {
	r := newORand(3, nil)
	sc := newOScenario(r, 300, 3000, 0)
	c := newCoalescer(func([]byte) error { return nil })
	allocs := testing.AllocsPerRun(5, func() {
		for _, batch := range sc.batches {
			for _, s := range batch {
				c.add(s.frame, s.cs)
			}
			c.flush()
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per scenario", allocs)
	}
}
