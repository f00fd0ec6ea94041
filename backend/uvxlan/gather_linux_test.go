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
			out := make([]byte, 2*65550)
			stride, used, err := segmentTCP(tc.frame, h, out)
			if err != nil {
				t.Fatal(err)
			}
			for off := 0; off < used; off += stride {
				putVXLANHeader(out[off:], 42)
			}
			plan, err := planTSO(tc.frame, h)
			if err != nil {
				t.Fatal(err)
			}
			if got := vxlanHeaderLen + plan.hdrLen + plan.mss; got != stride {
				t.Fatalf("stride %d, segmentTCP's %d", got, stride)
			}
			sg := newSegmenter()
			per := min(maxUDPPayload/stride, maxGSOSegments)
			var all []byte
			for first := 0; first < plan.nseg; first += per {
				last := min(first+per, plan.nseg)
				sg.g.reset(&peer{})
				sg.gather(&plan, tc.frame, 42, first, last)
				run := gathered(sg.g)
				if want := out[first*stride : min(last*stride, used)]; !bytes.Equal(run, want) {
					t.Fatalf("segments %d-%d: gathered %d bytes differ from the copied %d", first, last, len(run), len(want))
				}
				all = append(all, run...)
			}
			if len(all) != used {
				t.Fatalf("gathered %d bytes in all, copied %d", len(all), used)
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
	b.SetBytes(int64(len(frame)))
	for b.Loop() {
		plan, err := planTSO(frame, h)
		if err != nil {
			b.Fatal(err)
		}
		stride := vxlanHeaderLen + plan.hdrLen + plan.mss
		per := min(maxUDPPayload/stride, maxGSOSegments)
		for first := 0; first < plan.nseg; first += per {
			sg.g.reset(&peer{})
			sg.gather(&plan, frame, 1, first, min(first+per, plan.nseg))
		}
	}
}
