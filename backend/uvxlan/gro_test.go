package uvxlan

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
)

// script is a hand-written scenario: the frames of one or more flows in
// arrival order, in one batch unless split by flushAt.
type script struct {
	flows   []*oFlow
	frames  []oSent
	flushAt []int // flush before these frame indices
}

func newScript(flows ...bool) *script {
	s := &script{}
	for i, v6 := range flows {
		f := newOFlow(newORand(1, nil), i)
		f.v6, f.mss, f.seq, f.df, f.partialPct, f.ts = v6, 1448, 1000, true, 0, 5
		if v6 {
			f.src = []byte{0xfd, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, byte(i), 2}
			f.dst = []byte{0xfd, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9, 3}
		} else {
			f.src, f.dst = []byte{10, 244, 1, 2}, []byte{10, 244, 9, 3}
		}
		s.flows = append(s.flows, f)
	}
	return s
}

// seg sends a segment of flow i with n bytes of payload at the flow's
// next sequence number and advances it.
func (s *script) seg(i int, flags uint8, n int) *script {
	f := s.flows[i]
	s.frames = append(s.frames, f.send(oSpec{seq: f.seq, flags: flags, payload: n}))
	f.seq += uint32(n)
	return s
}

func (s *script) spec(i int, sp oSpec) *script {
	s.frames = append(s.frames, s.flows[i].send(sp))
	return s
}

func (s *script) data(i, segs int) *script {
	for range segs {
		s.seg(i, tcpFlagACK, s.flows[i].mss)
	}
	return s
}

func (s *script) flushHere() *script {
	s.flushAt = append(s.flushAt, len(s.frames))
	return s
}

// run feeds the script, checks the oracle and returns the writes with the
// flow and the number of segments of each.
func (s *script) run(t *testing.T) [][2]int {
	t.Helper()
	sc := &oScenario{flows: s.flows}
	prev := 0
	for _, at := range append(slices.Clone(s.flushAt), len(s.frames)) {
		sc.batches = append(sc.batches, s.frames[prev:at])
		prev = at
	}
	got := sc.run(t)
	if err := sc.checkOracle(got); err != nil {
		t.Fatal(err)
	}
	var shape [][2]int
	for _, w := range got {
		p := oParse(w.frame)
		n := 1
		if w.gsoType != 0 {
			n = (len(w.frame) - w.hdrLen + w.gsoSize - 1) / w.gsoSize
		}
		shape = append(shape, [2]int{int(p.sport - 20000), n})
	}
	return shape
}

func TestCoalescer(t *testing.T) {
	const mss = 1448
	type w = [2]int // flow, segments
	for _, tc := range []struct {
		name   string
		s      *script
		writes [][2]int
	}{
		{"one flow in order", newScript(false).data(0, 10), []w{{0, 10}}},
		{"ipv6", newScript(true).data(0, 7), []w{{0, 7}}},
		// The regression of issue 10: FIN came out before the run it follows.
		{"fin behind a run", newScript(false).data(0, 3).seg(0, tcpFlagACK|tcpFlagFIN, 0), []w{{0, 3}, {0, 1}}},
		{"ack behind a run", newScript(false).data(0, 3).seg(0, tcpFlagACK, 0).data(0, 2), []w{{0, 3}, {0, 1}, {0, 2}}},
		{"rst behind a run", newScript(true).data(0, 3).seg(0, tcpFlagRST, 0), []w{{0, 3}, {0, 1}}},
		{"fin with data behind a run", newScript(false).data(0, 2).seg(0, tcpFlagACK|tcpFlagFIN, 10), []w{{0, 2}, {0, 1}}},
		{"short segment ends the run", newScript(false).data(0, 3).seg(0, tcpFlagACK, 5).data(0, 2), []w{{0, 4}, {0, 2}}},
		{"psh ends the run", newScript(false).data(0, 2).seg(0, tcpFlagACK|tcpFlagPSH, mss).data(0, 2), []w{{0, 3}, {0, 2}}},
		{"psh alone", newScript(false).seg(0, tcpFlagACK|tcpFlagPSH, mss).data(0, 2), []w{{0, 1}, {0, 2}}},
		{"longer segment after a run", newScript(false).seg(0, tcpFlagACK, 1000).seg(0, tcpFlagACK, 1000).seg(0, tcpFlagACK, mss), []w{{0, 2}, {0, 1}}},
		{"gap in sequence", func() *script {
			s := newScript(false).data(0, 2)
			s.flows[0].seq += 5 * mss
			return s.data(0, 2)
		}(), []w{{0, 2}, {0, 2}}},
		{"retransmission", newScript(false).data(0, 3).spec(0, oSpec{seq: 1000, flags: tcpFlagACK, payload: mss}).data(0, 1), []w{{0, 3}, {0, 1}, {0, 1}}},
		{"prepend", newScript(false).
			spec(0, oSpec{seq: 1000 + mss, flags: tcpFlagACK, payload: mss}).
			spec(0, oSpec{seq: 1000, flags: tcpFlagACK, payload: mss}).
			spec(0, oSpec{seq: 1000 + 2*mss, flags: tcpFlagACK, payload: mss}), []w{{0, 3}}},
		{"prepend before a shorter segment", newScript(false).
			spec(0, oSpec{seq: 1000 + mss, flags: tcpFlagACK, payload: 100}).
			spec(0, oSpec{seq: 1000, flags: tcpFlagACK, payload: mss}), []w{{0, 2}}},
		{"no prepend of a shorter segment", newScript(false).
			spec(0, oSpec{seq: 1100, flags: tcpFlagACK, payload: mss}).
			spec(0, oSpec{seq: 1000, flags: tcpFlagACK, payload: 100}), []w{{0, 1}, {0, 1}}},
		{"no prepend of psh", newScript(false).
			spec(0, oSpec{seq: 1000 + mss, flags: tcpFlagACK, payload: mss}).
			spec(0, oSpec{seq: 1000, flags: tcpFlagACK | tcpFlagPSH, payload: mss}), []w{{0, 1}, {0, 1}}},
		{"cwr starts a run", newScript(false).data(0, 2).seg(0, tcpFlagACK|tcpFlagCWR, mss).data(0, 2), []w{{0, 2}, {0, 3}}},
		{"urg is not merged", newScript(false).data(0, 2).seg(0, tcpFlagACK|tcpFlagURG, mss).data(0, 2), []w{{0, 2}, {0, 1}, {0, 2}}},
		{"ack number change", func() *script {
			s := newScript(false).data(0, 2)
			s.flows[0].ack++
			return s.data(0, 2)
		}(), []w{{0, 2}, {0, 2}}},
		{"window change", func() *script {
			s := newScript(false).data(0, 2)
			s.flows[0].win++
			return s.data(0, 2)
		}(), []w{{0, 2}, {0, 2}}},
		{"ip options", newScript(false).data(0, 2).spec(0, oSpec{seq: 1000 + 2*mss, flags: tcpFlagACK, payload: mss, ipOpts: true}), []w{{0, 2}, {0, 1}}},
		{"fragment writes every run first", newScript(false, false).data(0, 2).data(1, 2).
			spec(0, oSpec{seq: 1000 + 2*mss, flags: tcpFlagACK, payload: mss, frag: true}).data(1, 1), []w{{0, 2}, {1, 2}, {0, 1}, {1, 1}}},
		{"ipv6 extension header writes every run first", newScript(true, false).data(0, 2).data(1, 2).
			spec(0, oSpec{seq: 1000 + 2*mss, flags: tcpFlagACK, payload: mss, ext: true}), []w{{0, 2}, {1, 2}, {0, 1}}},
		{"two flows interleaved", func() *script {
			s := newScript(false, true)
			for range 5 {
				s.data(0, 1).data(1, 1)
			}
			return s.seg(1, tcpFlagACK|tcpFlagFIN, 0)
		}(), []w{{1, 5}, {1, 1}, {0, 5}}},
		{"flush ends a run", newScript(false).data(0, 2).flushHere().data(0, 2), []w{{0, 2}, {0, 2}}},
		{"64 segments at most", func() *script {
			s := newScript(false)
			s.flows[0].mss = 100
			return s.data(0, 70)
		}(), []w{{0, 64}, {0, 6}}},
		{"largest super-frame", newScript(false).data(0, 46), []w{{0, 45}, {0, 1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.s.run(t); !slices.Equal(got, tc.writes) {
				t.Fatalf("writes (flow, segments) %v, want %v", got, tc.writes)
			}
		})
	}
}

func TestParseSeg(t *testing.T) {
	f := newScript(false).flows[0]
	good, _ := f.build(oSpec{seq: 1, flags: tcpFlagACK, payload: 100})
	mod := func(fn func(b []byte)) []byte {
		b := slices.Clone(good)
		fn(b)
		return b
	}
	for _, tc := range []struct {
		name      string
		frame     []byte
		cs        l4Csum
		kind      segKind
		mergeable bool
	}{
		{"good", good, l4Csum{}, segTCP, true},
		{"partial checksum", good, l4Csum{34, 16}, segTCP, true},
		{"partial checksum elsewhere", good, l4Csum{34, 6}, segTCP, false},
		{"ip options", func() []byte { b, _ := f.build(oSpec{seq: 1, flags: tcpFlagACK, payload: 100, ipOpts: true}); return b }(), l4Csum{}, segTCP, false},
		{"bad ip header checksum", mod(func(b []byte) { b[24] ^= 1 }), l4Csum{}, segTCP, false},
		{"fragment", mod(func(b []byte) { b[20] |= 0x20 }), l4Csum{}, segFlushAll, false},
		{"later fragment", mod(func(b []byte) { b[21] = 1 }), l4Csum{}, segFlushAll, false},
		{"ipv6 extension header", func() []byte {
			f6 := newScript(true).flows[0]
			b, _ := f6.build(oSpec{seq: 1, flags: tcpFlagACK, payload: 100, ext: true})
			return b
		}(), l4Csum{}, segFlushAll, false},
		{"udp", mod(func(b []byte) { b[23] = 17 }), l4Csum{}, segOther, false},
		{"arp", mod(func(b []byte) { b[12], b[13] = 0x08, 0x06 }), l4Csum{}, segOther, false},
		{"padded", append(slices.Clone(good), 0, 0), l4Csum{}, segTCP, false},
		{"no payload", good[:14+20+32], l4Csum{}, segTCP, false},
		{"fin", mod(func(b []byte) { b[47] |= tcpFlagFIN }), l4Csum{}, segTCP, false},
		{"syn", mod(func(b []byte) { b[47] |= tcpFlagSYN }), l4Csum{}, segTCP, false},
		{"rst", mod(func(b []byte) { b[47] |= tcpFlagRST }), l4Csum{}, segTCP, false},
		{"urg", mod(func(b []byte) { b[47] |= tcpFlagURG }), l4Csum{}, segTCP, false},
		{"no ack", mod(func(b []byte) { b[47] &^= tcpFlagACK }), l4Csum{}, segTCP, false},
		{"data offset too small", mod(func(b []byte) { b[46] = 4 << 4 }), l4Csum{}, segTCP, false},
		{"short", good[:40], l4Csum{}, segFlushAll, false},
		{"tiny", good[:20], l4Csum{}, segOther, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s tcpSeg
			kind := parseSeg(tc.frame, tc.cs, &s)
			if kind != tc.kind || s.mergeable != tc.mergeable {
				t.Fatalf("kind %d mergeable %v, want %d %v", kind, s.mergeable, tc.kind, tc.mergeable)
			}
		})
	}
}

// TestHotPathDoesNotAllocate covers the pure parts of both directions:
// segmentation, decoding and coalescing (16 flows with control frames
// between their runs, in a table that forgets them at every flush).
func TestHotPathDoesNotAllocate(t *testing.T) {
	super := ipv4TCPFrame(testMAC, otherMAC, 1, 1, tcpFlagACK, 20*1386)
	h := tsoHeader(super, 1386)
	out := make([]byte, 2*65550)
	s := newScript(false, true, false, true, false, true, false, true, false, true, false, true, false, true, false, true)
	for i := range 10 {
		for f := range s.flows {
			s.data(f, 1)
			if i == 5 {
				s.seg(f, tcpFlagACK, 0)
			}
		}
	}
	pkts := make([][]byte, len(s.frames))
	for i, f := range s.frames {
		pkts[i] = encap(1, f.frame)
	}
	d := decoder{vni: 1, mac: testMAC, maxFrame: ethHeaderLen + 1600}
	writes := 0
	c := newCoalescer(func([]byte) error { writes++; return nil })
	allocs := testing.AllocsPerRun(20, func() {
		segmentTCP(super, h, out)
		for _, p := range pkts {
			f, why := d.decode(p)
			if why != DropNone {
				panic(why)
			}
			c.add(f, l4Csum{})
		}
		c.flush()
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per run", allocs)
	}
	if writes != 21*3*16 { // per flow and run: 5 segments, an ACK, 4 segments
		t.Fatalf("%d writes", writes)
	}
}

// BenchmarkEgressSegment measures userspace TSO: cutting a 64 KB super-frame
// into MTU-sized frames with complete checksums.
func BenchmarkEgressSegment(b *testing.B) {
	super := ipv4TCPFrame(testMAC, otherMAC, 1, 1, tcpFlagACK, 45*1386)
	h := tsoHeader(super, 1386)
	out := make([]byte, 2*65550)
	b.SetBytes(int64(len(super)))
	for b.Loop() {
		segmentTCP(super, h, out)
	}
}

// BenchmarkIngressDecodeCoalesce measures the receive side for the same
// data as the ingress loop does it: decoding 45 VXLAN datagrams, checking
// each inner frame (source and TCP checksum) and merging them into one
// super-frame gathered for a writev.
func BenchmarkIngressDecodeCoalesce(b *testing.B) {
	super := ipv4TCPFrame(testMAC, otherMAC, 1, 1, tcpFlagACK, 45*1386)
	h := tsoHeader(super, 1386)
	out := make([]byte, 2*65550)
	stride, used, err := segmentTCP(super, h, out)
	if err != nil {
		b.Fatal(err)
	}
	var pkts [][]byte
	for off := 0; off < used; off += stride {
		p := out[off:min(off+stride, used)]
		putVXLANHeader(p, 1)
		pkts = append(pkts, p)
	}
	d := decoder{vni: 1, mac: testMAC, maxFrame: ethHeaderLen + 1450}
	c := newGatherCoalescer(func([][]byte) error { return nil })
	subnets := []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}
	b.SetBytes(int64(len(super)))
	for b.Loop() {
		for _, p := range pkts {
			f, why := d.decode(p)
			var cs l4Csum
			if why == DropNone {
				_, _, cs, why = checkInnerFrame(f, subnets, false)
			}
			if why != DropNone {
				b.Fatal(why)
			}
			c.add(f, cs)
		}
		c.flush()
	}
}

// coalesceBatch is 64 KB worth of 1448-byte segments per flow, the flows'
// segments interleaved one by one.
func coalesceBatch(flows int) [][]byte {
	v6 := make([]bool, flows)
	s := newScript(v6...)
	per := 65536 / 1448 / flows
	if per == 0 {
		per = 1
	}
	for range per {
		for f := range flows {
			s.data(f, 1)
		}
	}
	frames := make([][]byte, len(s.frames))
	for i, f := range s.frames {
		frames[i] = f.frame
	}
	return frames
}

// BenchmarkCoalesce measures add+flush for 64 KB of segments of 1 or 16
// interleaved flows.
func BenchmarkCoalesce(b *testing.B) {
	for _, flows := range []int{1, 16} {
		b.Run(fmt.Sprintf("flows=%d", flows), func(b *testing.B) {
			frames := coalesceBatch(flows)
			writes := 0
			c := newCoalescer(func([]byte) error { writes++; return nil })
			b.SetBytes(int64(len(frames) * 1448))
			for b.Loop() {
				for _, f := range frames {
					c.add(f, l4Csum{})
				}
				c.flush()
			}
			b.ReportMetric(float64(writes)/float64(b.N), "writes/op")
		})
	}
}

// TestCoalescerSingleHeaders: a frame written on its own carries an
// all-zero header when its checksum is complete, and NEEDS_CSUM with the
// caller's csum_start and csum_offset (gso_type none) when it is partial.
func TestCoalescerSingleHeaders(t *testing.T) {
	udp := oOther(newORand(2, []byte{0, 1}), 7) // an IPv4 UDP datagram
	syn, synCS := newScript(true).flows[0].build(oSpec{seq: 1, flags: tcpFlagSYN, partial: true})
	for _, tc := range []struct {
		name  string
		frame []byte
		cs    l4Csum
		want  [10]byte
	}{
		{"udp complete", udp, l4Csum{}, [10]byte{}},
		{"udp partial", udp, l4Csum{34, 6}, [10]byte{1, 0, 0, 0, 0, 0, 34, 0, 6, 0}},
		{"tcp syn partial ipv6", syn, synCS, [10]byte{1, 0, 0, 0, 0, 0, 54, 0, 16, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got [][]byte
			c := newCoalescer(func(b []byte) error { got = append(got, slices.Clone(b)); return nil })
			if err := c.add(tc.frame, tc.cs); err != nil {
				t.Fatal(err)
			}
			if err := c.flush(); err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 {
				t.Fatalf("%d writes, want 1", len(got))
			}
			if [10]byte(got[0][:10]) != tc.want || !slices.Equal(got[0][10:], tc.frame) {
				t.Fatalf("header % x, want the frame unchanged behind % x", got[0][:10], tc.want)
			}
		})
	}
}
