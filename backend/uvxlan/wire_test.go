package uvxlan

import (
	"bytes"
	"encoding/binary"
	"hash/fnv"
	"testing"

	"github.com/weft-net/weft/subnet"
)

var (
	testMAC  = subnet.MAC{0x02, 0xaa, 0xbb, 0xcc, 0xdd, 0x01}
	otherMAC = subnet.MAC{0x02, 0xaa, 0xbb, 0xcc, 0xdd, 0x02}
)

// vxlanPacket builds a VXLAN datagram around an Ethernet frame to dst with
// payload bytes of IPv4 payload.
func vxlanPacket(vni uint32, dst subnet.MAC, payload int) []byte {
	b := make([]byte, vxlanHeaderLen+ethHeaderLen+payload)
	putVXLANHeader(b, vni)
	copy(b[8:14], dst[:])
	copy(b[14:20], otherMAC[:])
	binary.BigEndian.PutUint16(b[20:], etherTypeIPv4)
	return b
}

func TestPutVXLANHeader(t *testing.T) {
	for _, tc := range []struct {
		name string
		vni  uint32
		want []byte
	}{
		{"vni 1", 1, []byte{0x08, 0, 0, 0, 0, 0, 1, 0}},
		{"vni 0x123456", 0x123456, []byte{0x08, 0, 0, 0, 0x12, 0x34, 0x56, 0}},
		{"max vni", maxVNI, []byte{0x08, 0, 0, 0, 0xff, 0xff, 0xff, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := bytes.Repeat([]byte{0xee}, 8)
			putVXLANHeader(b, tc.vni)
			if !bytes.Equal(b, tc.want) {
				t.Fatalf("got % x, want % x", b, tc.want)
			}
		})
	}
}

func TestDecode(t *testing.T) {
	d := decoder{vni: 1, mac: testMAC, maxFrame: ethHeaderLen + 1450}
	mod := func(f func(b []byte)) []byte {
		b := vxlanPacket(1, testMAC, 100)
		f(b)
		return b
	}
	for _, tc := range []struct {
		name string
		pkt  []byte
		want DropReason
	}{
		{"valid", vxlanPacket(1, testMAC, 100), DropNone},
		{"valid at mtu", vxlanPacket(1, testMAC, 1450), DropNone},
		{"valid empty ethernet payload", vxlanPacket(1, testMAC, 0), DropNone},
		{"empty", nil, DropTruncated},
		{"header only", vxlanPacket(1, testMAC, 0)[:8], DropTruncated},
		{"truncated ethernet", vxlanPacket(1, testMAC, 0)[:21], DropTruncated},
		{"oversize", vxlanPacket(1, testMAC, 1451), DropOversize},
		{"no I flag", mod(func(b []byte) { b[0] = 0 }), DropBadFlags},
		{"GBP flag", mod(func(b []byte) { b[0] = 0x88 }), DropBadFlags},
		{"reserved flag bit", mod(func(b []byte) { b[0] = 0x09 }), DropBadFlags},
		{"reserved byte 1", mod(func(b []byte) { b[1] = 1 }), DropBadFlags},
		{"reserved byte 2", mod(func(b []byte) { b[2] = 0x80 }), DropBadFlags},
		{"reserved byte 3", mod(func(b []byte) { b[3] = 1 }), DropBadFlags},
		{"reserved last byte", mod(func(b []byte) { b[7] = 1 }), DropBadFlags},
		{"wrong vni", vxlanPacket(2, testMAC, 100), DropWrongVNI},
		{"vni in high byte", vxlanPacket(0x010001, testMAC, 100), DropWrongVNI},
		{"other mac", vxlanPacket(1, otherMAC, 100), DropNotForUs},
		{"broadcast", vxlanPacket(1, subnet.MAC{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, 100), DropNotForUs},
		{"multicast", vxlanPacket(1, subnet.MAC{0x01, 0, 0x5e, 0, 0, 1}, 100), DropNotForUs},
	} {
		t.Run(tc.name, func(t *testing.T) {
			frame, why := d.decode(tc.pkt)
			if why != tc.want {
				t.Fatalf("decode: %v, want %v", why, tc.want)
			}
			if why == DropNone && !bytes.Equal(frame, tc.pkt[vxlanHeaderLen:]) {
				t.Fatalf("frame is not the inner frame")
			}
			if why != DropNone && frame != nil {
				t.Fatalf("dropped packet returned a frame")
			}
		})
	}
}

func TestFlowHash(t *testing.T) {
	tcp := func(sport, dport uint16) []byte {
		f := ipv4TCPFrame(testMAC, otherMAC, 1000, 0, tcpFlagACK, 10)
		binary.BigEndian.PutUint16(f[34:], sport)
		binary.BigEndian.PutUint16(f[36:], dport)
		return f
	}
	for _, tc := range []struct {
		name string
		a, b []byte
		same bool
	}{
		{"same flow, other payload", tcp(1000, 80), func() []byte { f := tcp(1000, 80); f[60] ^= 0xff; return f }(), true},
		{"other source port", tcp(1000, 80), tcp(1001, 80), false},
		{"other destination port", tcp(1000, 80), tcp(1000, 81), false},
		{"short frames of other content", []byte{1, 2, 3}, []byte{3, 2, 1}, false},
		{"short frame and its prefix", []byte{1, 2, 3}, []byte{1, 2}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := flowHash(tc.a) == flowHash(tc.b); got != tc.same {
				t.Fatalf("hashes equal: %v, want %v", got, tc.same)
			}
		})
	}
	// A frame too short for an Ethernet header is hashed whole with FNV-1a,
	// checked against the standard library's independent implementation.
	for _, short := range [][]byte{{}, {1, 2, 3}, make([]byte, ethHeaderLen-1)} {
		ref := fnv.New32a()
		ref.Write(short)
		if got, want := flowHash(short), ref.Sum32(); got != want {
			t.Errorf("flowHash(% x) = %#x, want FNV-1a %#x", short, got, want)
		}
	}
}

func encap(vni uint32, frame []byte) []byte {
	b := make([]byte, vxlanHeaderLen+len(frame))
	putVXLANHeader(b, vni)
	copy(b[vxlanHeaderLen:], frame)
	return b
}

func TestDropReasonNames(t *testing.T) {
	seen := map[string]bool{}
	for r := DropNone; r < numDropReasons; r++ {
		n := r.String()
		if n == "unknown" || seen[n] {
			t.Fatalf("reason %d has name %q", r, n)
		}
		seen[n] = true
	}
}
