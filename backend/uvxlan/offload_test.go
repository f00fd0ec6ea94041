package uvxlan

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/weft-net/weft/subnet"
)

// ipv4TCPFrame builds an Ethernet/IPv4/TCP frame (TCP with a 12-byte
// timestamp option) with valid checksums and payload bytes derived from seq.
func ipv4TCPFrame(dst, src subnet.MAC, seq uint32, id uint16, flags uint8, payload int) []byte {
	const ipl, tcpl = 20, 32
	f := make([]byte, ethHeaderLen+ipl+tcpl+payload)
	copy(f[0:], dst[:])
	copy(f[6:], src[:])
	binary.BigEndian.PutUint16(f[12:], etherTypeIPv4)
	ip := f[ethHeaderLen:]
	ip[0], ip[6], ip[8], ip[9] = 0x45, 0x40, 64, 6
	binary.BigEndian.PutUint16(ip[2:], uint16(ipl+tcpl+payload))
	binary.BigEndian.PutUint16(ip[4:], id)
	copy(ip[12:], []byte{10, 244, 1, 2, 10, 244, 2, 2})
	binary.BigEndian.PutUint16(ip[10:], ^checksumFold(checksumAdd(ip[:ipl], 0)))
	fillTCP(f, ethHeaderLen+ipl, seq, flags, 12, 8)
	return f
}

// ipv6TCPFrame is ipv4TCPFrame for IPv6.
func ipv6TCPFrame(dst, src subnet.MAC, seq uint32, flags uint8, payload int) []byte {
	const ipl, tcpl = 40, 32
	f := make([]byte, ethHeaderLen+ipl+tcpl+payload)
	copy(f[0:], dst[:])
	copy(f[6:], src[:])
	binary.BigEndian.PutUint16(f[12:], etherTypeIPv6)
	ip := f[ethHeaderLen:]
	ip[0], ip[6], ip[7] = 0x60, 6, 64
	binary.BigEndian.PutUint16(ip[4:], uint16(tcpl+payload))
	ip[8], ip[9], ip[23] = 0xfd, 0x01, 2
	ip[24], ip[25], ip[39] = 0xfd, 0x01, 3
	fillTCP(f, ethHeaderLen+ipl, seq, flags, 8, 32)
	return f
}

func fillTCP(f []byte, off int, seq uint32, flags uint8, addrOff, addrLen int) {
	th := f[off:]
	binary.BigEndian.PutUint16(th[0:], 40000)
	binary.BigEndian.PutUint16(th[2:], 5201)
	binary.BigEndian.PutUint32(th[4:], seq)
	binary.BigEndian.PutUint32(th[8:], 777)
	th[12], th[13] = 8<<4, flags
	binary.BigEndian.PutUint16(th[14:], 500)
	copy(th[20:], []byte{1, 1, 8, 10, 0, 0, 0, 9, 0, 0, 0, 7})
	for i := 32; i < len(th); i++ {
		th[i] = byte(seq + uint32(i-32))
	}
	a := ethHeaderLen + addrOff
	sum := checksumAdd(f[a:a+addrLen], 6+uint64(len(th)))
	binary.BigEndian.PutUint16(th[16:], ^checksumFold(checksumAdd(th, sum)))
}

// tsoHeader is what a TAP puts in front of a TSO super-frame: NEEDS_CSUM with
// the pseudo-header sum in the checksum field.
func tsoHeader(f []byte, mss int) vnetHdr {
	v6 := binary.BigEndian.Uint16(f[12:]) == etherTypeIPv6
	h := vnetHdr{flags: vnetFlagNeedsCsum, gsoType: vnetGSOTCPv4, gsoSize: uint16(mss), csumStart: 34, csumOffset: 16, hdrLen: 66}
	addrOff, addrLen := ethHeaderLen+12, 4
	if v6 {
		h.gsoType, h.csumStart, h.hdrLen = vnetGSOTCPv6, 54, 86
		addrOff, addrLen = ethHeaderLen+8, 16
	}
	tcp := int(h.csumStart)
	binary.BigEndian.PutUint16(f[tcp+16:], checksumFold(checksumAdd(f[addrOff:addrOff+2*addrLen], 6+uint64(len(f)-tcp))))
	return h
}

// checkFrame verifies the IP and TCP checksums and lengths of one frame.
func checkFrame(t *testing.T, f []byte) tcpSeg {
	t.Helper()
	s := tcpSeg{tcp: ethHeaderLen + 20}
	if binary.BigEndian.Uint16(f[12:]) == etherTypeIPv6 {
		s.v6, s.tcp = true, ethHeaderLen+40
		if int(binary.BigEndian.Uint16(f[18:])) != len(f)-s.tcp {
			t.Fatalf("bad IPv6 payload length")
		}
	} else if int(binary.BigEndian.Uint16(f[16:])) != len(f)-ethHeaderLen {
		t.Fatalf("bad IPv4 total length")
	}
	s.hdr = s.tcp + int(f[s.tcp+12]>>4)*4
	s.seq = binary.BigEndian.Uint32(f[s.tcp+4:])
	s.flags = f[s.tcp+13]
	s.payload = len(f) - s.hdr
	if !s.v6 && ^checksumFold(checksumAdd(f[ethHeaderLen:ethHeaderLen+20], 0)) != 0 {
		t.Fatalf("bad IPv4 header checksum")
	}
	if !tcpChecksumOK(f, s) {
		t.Fatalf("bad TCP checksum")
	}
	return s
}

func TestSegmentTCP(t *testing.T) {
	for _, tc := range []struct {
		name    string
		frame   func() []byte
		mss     int
		segs    int
		mangle  func(*vnetHdr)
		wantErr bool
	}{
		{"ipv4 with remainder", func() []byte { return ipv4TCPFrame(testMAC, otherMAC, 1, 100, tcpFlagACK|tcpFlagPSH|tcpFlagFIN, 10000) }, 1386, 8, nil, false},
		{"ipv4 exact multiple", func() []byte { return ipv4TCPFrame(testMAC, otherMAC, 1<<32-100, 65535, tcpFlagACK|tcpFlagCWR, 4*1386) }, 1386, 4, nil, false},
		{"ipv4 largest", func() []byte { return ipv4TCPFrame(testMAC, otherMAC, 5, 0, tcpFlagACK, 65535-52) }, 1386, 48, nil, false},
		{"ipv4 one segment", func() []byte { return ipv4TCPFrame(testMAC, otherMAC, 5, 0, tcpFlagACK, 100) }, 1386, 1, nil, false},
		{"ipv6", func() []byte { return ipv6TCPFrame(testMAC, otherMAC, 9, tcpFlagACK|tcpFlagPSH, 5000) }, 1366, 4, nil, false},
		{"hdr_len is only a hint", func() []byte { return ipv4TCPFrame(testMAC, otherMAC, 1, 1, tcpFlagACK, 3000) }, 1386, 3, func(h *vnetHdr) { h.hdrLen = 9 }, false},
		{"zero mss", func() []byte { return ipv4TCPFrame(testMAC, otherMAC, 1, 1, tcpFlagACK, 3000) }, 0, 0, nil, true},
		{"csum start off", func() []byte { return ipv4TCPFrame(testMAC, otherMAC, 1, 1, tcpFlagACK, 3000) }, 1386, 0, func(h *vnetHdr) { h.csumStart = 30 }, true},
		{"csum offset not tcp", func() []byte { return ipv4TCPFrame(testMAC, otherMAC, 1, 1, tcpFlagACK, 3000) }, 1386, 0, func(h *vnetHdr) { h.csumOffset = 6 }, true},
		{"v6 gso type on v4 frame", func() []byte { return ipv4TCPFrame(testMAC, otherMAC, 1, 1, tcpFlagACK, 3000) }, 1386, 0, func(h *vnetHdr) { h.gsoType = vnetGSOTCPv6 }, true},
		{"truncated", func() []byte { return ipv4TCPFrame(testMAC, otherMAC, 1, 1, tcpFlagACK, 3000)[:40] }, 1386, 0, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := tc.frame()
			orig := append([]byte(nil), f...)
			var h vnetHdr
			if len(f) > 60 {
				h = tsoHeader(f, tc.mss)
			} else {
				h = vnetHdr{gsoType: vnetGSOTCPv4, gsoSize: uint16(tc.mss), csumStart: 34, csumOffset: 16}
			}
			if tc.mangle != nil {
				tc.mangle(&h)
			}
			out := make([]byte, 2*65550)
			stride, used, err := segmentTCP(f, h, out)
			if tc.wantErr {
				if !errors.Is(err, errBadOffload) {
					t.Fatalf("err %v, want errBadOffload", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			s0 := checkFrame(t, orig)
			var payload []byte
			n := 0
			for off := 0; off < used; off += stride {
				seg := out[off+vxlanHeaderLen : min(off+stride, used)]
				s := checkFrame(t, seg)
				if s.payload > tc.mss || (off+stride < used && s.payload != tc.mss) {
					t.Fatalf("segment %d: payload %d with mss %d", n, s.payload, tc.mss)
				}
				if want := s0.seq + uint32(len(payload)); s.seq != want {
					t.Fatalf("segment %d: seq %d, want %d", n, s.seq, want)
				}
				last := off+stride >= used
				if wantF := flagsOf(s0.flags, n == 0, last); s.flags != wantF {
					t.Fatalf("segment %d: flags %#x, want %#x", n, s.flags, wantF)
				}
				if !s.v6 {
					if id := binary.BigEndian.Uint16(seg[18:]); id != binary.BigEndian.Uint16(orig[18:])+uint16(n) {
						t.Fatalf("segment %d: ip id %d", n, id)
					}
				}
				payload = append(payload, seg[s.hdr:]...)
				n++
			}
			if n != tc.segs {
				t.Fatalf("%d segments, want %d", n, tc.segs)
			}
			if !bytes.Equal(payload, orig[s0.hdr:]) {
				t.Fatalf("payload differs after segmentation")
			}
		})
	}
}

func flagsOf(f uint8, first, last bool) uint8 {
	if !last {
		f &^= tcpFlagFIN | tcpFlagPSH
	}
	if !first {
		f &^= tcpFlagCWR
	}
	return f
}

func TestCompleteChecksum(t *testing.T) {
	f := ipv4TCPFrame(testMAC, otherMAC, 7, 1, tcpFlagACK, 999)
	h := tsoHeader(f, 1386) // leaves the pseudo-header sum in the field
	if err := completeChecksum(f, int(h.csumStart), int(h.csumOffset)); err != nil {
		t.Fatal(err)
	}
	checkFrame(t, f)
	for _, bad := range [][2]int{{len(f), 0}, {34, len(f)}, {len(f) - 1, 1}} {
		if err := completeChecksum(f, bad[0], bad[1]); err == nil {
			t.Fatalf("start %d offset %d accepted", bad[0], bad[1])
		}
	}
}
