package uvxlan

import (
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
