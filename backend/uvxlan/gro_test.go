package uvxlan

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// segmentsOf cuts a valid super-frame into MSS-sized frames with complete
// checksums, as a sender's TSO would.
func segmentsOf(t *testing.T, f []byte, mss int) [][]byte {
	t.Helper()
	h := tsoHeader(f, mss)
	out := make([]byte, 2*65550)
	stride, used, err := segmentTCP(f, h, out)
	if err != nil {
		t.Fatal(err)
	}
	var segs [][]byte
	for off := 0; off < used; off += stride {
		segs = append(segs, append([]byte(nil), out[off+vxlanHeaderLen:min(off+stride, used)]...))
	}
	return segs
}

// written is one TAP write seen by a test.
type written struct {
	h     vnetHdr
	frame []byte
}

func runCoalescer(t *testing.T, frames [][]byte) []written {
	t.Helper()
	var got []written
	c := newCoalescer(func(b []byte) error {
		got = append(got, written{decodeVnetHdr(b), append([]byte(nil), b[virtioNetHdrLen:]...)})
		return nil
	})
	for _, f := range frames {
		if err := c.add(f); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.flush(); err != nil {
		t.Fatal(err)
	}
	return got
}

func TestCoalescer(t *testing.T) {
	const mss = 1386
	flow := func(seq uint32, n int, flags uint8) [][]byte {
		return segmentsOf(t, ipv4TCPFrame(testMAC, otherMAC, seq, 10, flags, n), mss)
	}
	flow6 := func(seq uint32, n int) [][]byte {
		return segmentsOf(t, ipv6TCPFrame(testMAC, otherMAC, seq, tcpFlagACK, n), mss-20)
	}
	cat := func(l ...[][]byte) [][]byte {
		var out [][]byte
		for _, x := range l {
			out = append(out, x...)
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		frames [][]byte
		writes []int // segments per TAP write
	}{
		{"one flow in order", flow(1, 10*mss, tcpFlagACK), []int{10}},
		{"short last segment ends the run", cat(flow(1, 3*mss+5, tcpFlagACK), flow(3*mss+6, 2*mss, tcpFlagACK)), []int{4, 2}},
		{"psh ends the run", cat(flow(1, 3*mss, tcpFlagACK|tcpFlagPSH), flow(3*mss+1, 2*mss, tcpFlagACK)), []int{3, 2}},
		{"gap in sequence", cat(flow(1, 2*mss, tcpFlagACK), flow(5*mss, 2*mss, tcpFlagACK)), []int{2, 2}},
		{"ipv6", flow6(1, 5*(mss-20)), []int{5}},
		{"bad checksum passes unmerged", func() [][]byte {
			f := flow(1, 4*mss, tcpFlagACK)
			f[2][100] ^= 1
			return f
		}(), []int{2, 1, 1}},
		{"non-tcp", [][]byte{vxlanPacket(1, testMAC, 60)[vxlanHeaderLen:], vxlanPacket(1, testMAC, 60)[vxlanHeaderLen:]}, []int{1, 1}},
		{"syn is not merged", flow(1, 100, tcpFlagSYN), []int{1}},
		{"largest super-frame", flow(1, 47*mss, tcpFlagACK), []int{47}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := runCoalescer(t, tc.frames)
			if len(got) != len(tc.writes) {
				t.Fatalf("%d writes, want %d", len(got), len(tc.writes))
			}
			next := 0
			for i, w := range got {
				in := tc.frames[next : next+tc.writes[i]]
				next += tc.writes[i]
				if len(in) == 1 {
					if w.h != (vnetHdr{}) || !bytes.Equal(w.frame, in[0]) {
						t.Fatalf("write %d: a single frame was changed or got a header %+v", i, w.h)
					}
					continue
				}
				// What the kernel would make of the write must be exactly the segments.
				if w.h.flags != vnetFlagNeedsCsum || w.h.gsoSize == 0 {
					t.Fatalf("write %d: header %+v", i, w.h)
				}
				resegged := make([]byte, 2*65550)
				stride, used, err := segmentTCP(w.frame, w.h, resegged)
				if err != nil {
					t.Fatalf("write %d: %v", i, err)
				}
				j := 0
				for off := 0; off < used; off += stride {
					seg := resegged[off+vxlanHeaderLen : min(off+stride, used)]
					want := in[j]
					if !bytes.Equal(seg[:18], want[:18]) || !bytes.Equal(seg[20:], want[20:]) { // IP ID may differ
						t.Fatalf("write %d segment %d differs from what was received", i, j)
					}
					j++
				}
				if j != len(in) {
					t.Fatalf("write %d: %d segments, want %d", i, j, len(in))
				}
			}
		})
	}
}

func TestParseTCPSegRejects(t *testing.T) {
	good := ipv4TCPFrame(testMAC, otherMAC, 1, 1, tcpFlagACK, 100)
	mod := func(f func(b []byte)) []byte {
		b := append([]byte(nil), good...)
		f(b)
		return b
	}
	for _, tc := range []struct {
		name  string
		frame []byte
		ok    bool
	}{
		{"good", good, true},
		{"ip options", mod(func(b []byte) { b[14] = 0x46 }), false},
		{"fragment", mod(func(b []byte) { b[20] |= 0x20 }), false},
		{"udp", mod(func(b []byte) { b[23] = 17 }), false},
		{"padded", append(append([]byte(nil), good...), 0, 0), false},
		{"no payload", ipv4TCPFrame(testMAC, otherMAC, 1, 1, tcpFlagACK, 0), false},
		{"fin", ipv4TCPFrame(testMAC, otherMAC, 1, 1, tcpFlagACK|tcpFlagFIN, 10), false},
		{"rst", ipv4TCPFrame(testMAC, otherMAC, 1, 1, tcpFlagACK|tcpFlagRST, 10), false},
		{"urg", ipv4TCPFrame(testMAC, otherMAC, 1, 1, tcpFlagACK|tcpFlagURG, 10), false},
		{"data offset too small", mod(func(b []byte) { b[46] = 4 << 4 }), false},
		{"short", good[:40], false},
		{"arp", mod(func(b []byte) { binary.BigEndian.PutUint16(b[12:], 0x0806) }), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, ok := parseTCPSeg(tc.frame); ok != tc.ok {
				t.Fatalf("eligible %v, want %v", ok, tc.ok)
			}
		})
	}
}

// TestHotPathDoesNotAllocate covers the pure parts of both directions:
// segmentation, decoding and coalescing.
func TestHotPathDoesNotAllocate(t *testing.T) {
	super := ipv4TCPFrame(testMAC, otherMAC, 1, 1, tcpFlagACK, 20*1386)
	h := tsoHeader(super, 1386)
	out := make([]byte, 2*65550)
	segs := segmentsOf(t, ipv4TCPFrame(testMAC, otherMAC, 1, 1, tcpFlagACK, 20*1386), 1386)
	pkts := make([][]byte, len(segs))
	for i, s := range segs {
		pkts[i] = encap(1, s)
	}
	d := decoder{vni: 1, mac: testMAC, maxFrame: ethHeaderLen + 1450}
	c := newCoalescer(func([]byte) error { return nil })
	allocs := testing.AllocsPerRun(20, func() {
		segmentTCP(super, h, out)
		for _, p := range pkts {
			f, _ := d.decode(p)
			c.add(f)
		}
		c.flush()
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per run", allocs)
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
// data: decoding 45 VXLAN datagrams, verifying their checksums and merging
// them into one super-frame.
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
	c := newCoalescer(func([]byte) error { return nil })
	b.SetBytes(int64(len(super)))
	for b.Loop() {
		for _, p := range pkts {
			f, _ := d.decode(p)
			c.add(f)
		}
		c.flush()
	}
}

// TestCoalescerInterleaved interleaves the segments of several flows: each
// flow's data must come out whole and in order, merged as long as there are
// no more flows than runs.
func TestCoalescerInterleaved(t *testing.T) {
	const mss, perFlow = 1386, 6
	for _, tc := range []struct {
		name   string
		flows  int
		writes int // TAP writes expected; 0: do not check
	}{
		{"two flows", 2, 2},
		{"as many flows as runs", groFlows, groFlows},
		{"more flows than runs", groFlows + 1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			segs := make([][][]byte, tc.flows)
			for f := range segs {
				super := ipv4TCPFrame(testMAC, otherMAC, uint32(f)<<20, 1, tcpFlagACK, perFlow*mss)
				binary.BigEndian.PutUint16(super[34:], uint16(30000+f))
				segs[f] = segmentsOf(t, super, mss)
			}
			var in [][]byte
			for i := range perFlow {
				for f := range segs {
					in = append(in, segs[f][i])
				}
			}
			got := runCoalescer(t, in)
			if tc.writes != 0 && len(got) != tc.writes {
				t.Fatalf("%d writes, want %d", len(got), tc.writes)
			}
			out := make([][][]byte, tc.flows)
			for _, w := range got {
				frames := [][]byte{w.frame}
				if w.h.gsoType != vnetGSONone {
					buf := make([]byte, 2*65550)
					stride, used, err := segmentTCP(w.frame, w.h, buf)
					if err != nil {
						t.Fatal(err)
					}
					frames = nil
					for off := 0; off < used; off += stride {
						frames = append(frames, buf[off+vxlanHeaderLen:min(off+stride, used)])
					}
				}
				for _, fr := range frames {
					f := int(binary.BigEndian.Uint16(fr[34:])) - 30000
					out[f] = append(out[f], fr)
				}
			}
			for f := range segs {
				if len(out[f]) != perFlow {
					t.Fatalf("flow %d: %d segments out, want %d", f, len(out[f]), perFlow)
				}
				for i := range segs[f] {
					a, b := out[f][i], segs[f][i]
					if !bytes.Equal(a[:18], b[:18]) || !bytes.Equal(a[20:], b[20:]) {
						t.Fatalf("flow %d segment %d differs or is out of order", f, i)
					}
				}
			}
		})
	}
}
