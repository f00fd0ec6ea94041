package uvxlan

import (
	"bytes"
	"testing"
	"unsafe"
)

// gathered is the datagram g would send: its pieces, concatenated.
func gathered(g *gatherSender) []byte {
	var b []byte
	for _, iov := range g.iovs[:g.n] {
		b = append(b, unsafe.Slice(iov.Base, iov.Len)...)
	}
	return b
}

// sends records what a segmenter sends: each run's bytes, key and
// segment count.
type sends struct {
	runs  [][]byte
	keys  []runKey
	nsegs []int
}

func (s *sends) attach(sg *segmenter) {
	sg.send = func(run runKey, nseg int) {
		s.runs = append(s.runs, gathered(sg.g))
		s.keys = append(s.keys, run)
		s.nsegs = append(s.nsegs, nseg)
	}
}

// copied is what segmentTCP makes of frame: the segments (each behind its
// VXLAN header) and their stride.
func copied(t *testing.T, frame []byte, h vnetHdr) ([]byte, int) {
	t.Helper()
	out := make([]byte, 2*65550)
	stride, used, err := segmentTCP(frame, h, out)
	if err != nil {
		t.Fatal(err)
	}
	for off := 0; off < used; off += stride {
		putVXLANHeader(out[off:], 42)
	}
	return out[:used], stride
}

// TestGatherMatchesSegmentTCP checks that the gathering egress path puts on
// the wire exactly the bytes of the copying path (segmentTCP, which
// TestSegmentTCP checks field by field), segment run by segment run.
func TestGatherMatchesSegmentTCP(t *testing.T) {
	for _, tc := range []struct {
		name  string
		frame []byte
		mss   int
	}{
		{"v4 two and a bit segments", ipv4TCPFrame(testMAC, otherMAC, 1000, 7, tcpFlagACK|tcpFlagPSH, 3000), 1386},
		{"v4 exact multiple, FIN", ipv4TCPFrame(testMAC, otherMAC, 1<<32-100, 65535, tcpFlagACK|tcpFlagFIN|tcpFlagCWR, 4*1398), 1398},
		{"v4 64 KB", ipv4TCPFrame(testMAC, otherMAC, 5, 1, tcpFlagACK, 65535-40), 1398},
		{"v4 odd payload", ipv4TCPFrame(testMAC, otherMAC, 5, 1, tcpFlagACK, 2799), 1398},
		{"v4 one byte", ipv4TCPFrame(testMAC, otherMAC, 5, 1, tcpFlagACK, 1), 1398},
		{"v4 small mss, more than one send", ipv4TCPFrame(testMAC, otherMAC, 5, 1, tcpFlagACK, 60000), 536},
		{"v6", ipv6TCPFrame(testMAC, otherMAC, 9, tcpFlagACK|tcpFlagPSH, 20000), 1378},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := tsoHeader(tc.frame, tc.mss)
			want, stride := copied(t, tc.frame, h)
			plan, err := planTSO(tc.frame, h)
			if err != nil {
				t.Fatal(err)
			}
			key := runKey{p: &peer{}, stride: vxlanHeaderLen + plan.hdrLen + plan.mss}
			if key.stride != stride {
				t.Fatalf("stride %d, segmentTCP's %d", key.stride, stride)
			}
			sg := newSegmenter()
			var got sends
			got.attach(sg)
			sg.pack(&plan, tc.frame, 42, key)
			sg.flush()
			per := min(maxUDPPayload/stride, maxGSOSegments)
			if wantRuns := (plan.nseg + per - 1) / per; len(got.runs) != wantRuns {
				t.Fatalf("%d sends, want %d", len(got.runs), wantRuns)
			}
			var all []byte
			for i, run := range got.runs {
				first := i * per
				if want := want[first*stride : min((first+got.nsegs[i])*stride, len(want))]; !bytes.Equal(run, want) {
					t.Fatalf("send %d (%d segments): gathered %d bytes differ from the copied %d", i, got.nsegs[i], len(run), len(want))
				}
				if got.keys[i] != key {
					t.Fatalf("send %d went to %+v, want %+v", i, got.keys[i], key)
				}
				all = append(all, run...)
			}
			if len(all) != len(want) {
				t.Fatalf("gathered %d bytes in all, copied %d", len(all), len(want))
			}
		})
	}
}

// TestPackAcrossFrames checks that the segments of consecutive super-frames
// for one peer through one socket share sends: full sends of as many
// segments as fit, in order, byte for byte the copying path's segments;
// and that a short segment, another socket, peer or stride, or a flush
// ends a send.
func TestPackAcrossFrames(t *testing.T) {
	const mss = 1398
	p1, p2 := &peer{}, &peer{}
	s1, s2 := &udpSocket{}, &udpSocket{}
	type frame struct {
		payload int
		mss     int
		sock    *udpSocket
		p       *peer
	}
	full := 46 * mss // a 64 KB super-frame of full segments
	for _, tc := range []struct {
		name   string
		frames []frame
		nsegs  []int // the segments of each send, in order
	}{
		{"two full frames", []frame{{full, mss, s1, p1}, {full, mss, s1, p1}}, []int{44, 44, 4}},
		{"three full frames", []frame{{full, mss, s1, p1}, {full, mss, s1, p1}, {full, mss, s1, p1}}, []int{44, 44, 44, 6}},
		{"a short last segment ends the send", []frame{{full - 10, mss, s1, p1}, {full, mss, s1, p1}}, []int{44, 2, 44, 2}},
		{"another socket", []frame{{full, mss, s1, p1}, {full, mss, s2, p1}}, []int{44, 2, 44, 2}},
		{"another peer", []frame{{full, mss, s1, p1}, {full, mss, s1, p2}}, []int{44, 2, 44, 2}},
		{"another stride", []frame{{4 * mss, mss, s1, p1}, {4 * 1000, 1000, s1, p1}}, []int{4, 4}},
		{"small frames fill one send", []frame{{10 * mss, mss, s1, p1}, {10 * mss, mss, s1, p1}, {10 * mss, mss, s1, p1}}, []int{30}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sg := newSegmenter()
			var got sends
			got.attach(sg)
			var want [][]byte // the copying path's segments, in order
			var keys []runKey
			seq := uint32(1)
			for _, f := range tc.frames {
				b := ipv4TCPFrame(testMAC, otherMAC, seq, uint16(seq), tcpFlagACK, f.payload)
				seq += uint32(f.payload)
				h := tsoHeader(b, f.mss)
				segs, stride := copied(t, b, h)
				for off := 0; off < len(segs); off += stride {
					want = append(want, segs[off:min(off+stride, len(segs))])
				}
				plan, err := planTSO(b, h)
				if err != nil {
					t.Fatal(err)
				}
				key := runKey{sock: f.sock, p: f.p, stride: stride}
				for range plan.nseg {
					keys = append(keys, key)
				}
				sg.pack(&plan, b, 42, key)
			}
			sg.flush()
			if len(got.nsegs) != len(tc.nsegs) {
				t.Fatalf("sends of %v segments, want %v", got.nsegs, tc.nsegs)
			}
			at := 0
			for i, n := range tc.nsegs {
				if got.nsegs[i] != n {
					t.Fatalf("sends of %v segments, want %v", got.nsegs, tc.nsegs)
				}
				if got.keys[i] != keys[at] {
					t.Fatalf("send %d went to %+v, want %+v", i, got.keys[i], keys[at])
				}
				if w := bytes.Join(want[at:at+n], nil); !bytes.Equal(got.runs[i], w) {
					t.Fatalf("send %d: %d bytes differ from the copied segments %d-%d (%d bytes)", i, len(got.runs[i]), at, at+n, len(w))
				}
				for _, seg := range want[at : at+n-1] {
					if len(seg) != got.keys[i].stride {
						t.Fatalf("send %d: a segment of %d bytes before the last, stride %d", i, len(seg), got.keys[i].stride)
					}
				}
				at += n
			}
			if at != len(want) {
				t.Fatalf("%d segments sent, want %d", at, len(want))
			}
		})
	}
}

// BenchmarkEgressGather is BenchmarkEgressSegment for the gathering path:
// the userspace work of sending a 64 KB super-frame.
func BenchmarkEgressGather(b *testing.B) {
	frame := ipv4TCPFrame(testMAC, otherMAC, 1, 1, tcpFlagACK, 65535-40)
	h := tsoHeader(frame, 1398)
	sg := newSegmenter()
	sg.send = func(runKey, int) {}
	p := &peer{}
	b.SetBytes(int64(len(frame)))
	for b.Loop() {
		plan, err := planTSO(frame, h)
		if err != nil {
			b.Fatal(err)
		}
		sg.pack(&plan, frame, 1, runKey{p: p, stride: vxlanHeaderLen + plan.hdrLen + plan.mss})
		sg.flush()
	}
}
