package tunpath

import (
	"bytes"
	"encoding/hex"
	"net/netip"
	"strings"
	"testing"

	"github.com/weft-net/weft/subnet"
)

var (
	ownMAC  = subnet.MAC{0x02, 0xaa, 0, 0, 0, 1}
	peerMAC = subnet.MAC{0x02, 0xbb, 0, 0, 0, 2}
	peers   = []peer{{subnet: netip.MustParsePrefix("10.244.2.0/24"), addr: netip.MustParseAddr("192.168.77.2"), mac: peerMAC}}
)

// frame is a datagram written out by hand: the VXLAN header (I flag, VNI
// 1), an inner Ethernet header for ownMAC from peerMAC, and a 20-byte IPv4
// header 10.244.2.2 → 10.244.1.2 with a total length of 24, then 4 bytes.
func frame() []byte {
	h := strings.Join([]string{
		"08000000", "00000100", // VXLAN
		"02aa00000001", "02bb00000002", "0800", // Ethernet
		"45000018000000004001000a0af40202", "0af40102", "00000000", // IPv4
	}, "")
	b, err := hex.DecodeString(h)
	if err != nil {
		panic(err)
	}
	return b
}

func TestCheck(t *testing.T) {
	from := netip.MustParseAddr("192.168.77.2")
	for _, tc := range []struct {
		name   string
		change func(d []byte) []byte
		from   netip.Addr
		drop   string
		n      int
	}{
		{"good", nil, from, "", 24},
		{"good, from a v4-mapped address", nil, netip.MustParseAddr("::ffff:192.168.77.2"), "", 24},
		{"trailing bytes cut", func(d []byte) []byte { return append(d, 0, 0) }, from, "", 24},
		{"not from a peer", nil, netip.MustParseAddr("192.168.77.3"), DropUnknownSource, 0},
		{"short", func(d []byte) []byte { return d[:headroom+19] }, from, DropShort, 0},
		{"too long", func(d []byte) []byte { return append(d, make([]byte, 1500)...) }, from, DropTooLong, 0},
		{"no I flag", func(d []byte) []byte { d[0] = 0; return d }, from, DropFlags, 0},
		{"reserved flag", func(d []byte) []byte { d[1] = 1; return d }, from, DropFlags, 0},
		{"other VNI", func(d []byte) []byte { d[6] = 2; return d }, from, DropVNI, 0},
		{"reserved byte after the VNI", func(d []byte) []byte { d[7] = 1; return d }, from, DropVNI, 0},
		{"other MAC", func(d []byte) []byte { d[13] = 9; return d }, from, DropDestMAC, 0},
		{"broadcast MAC", func(d []byte) []byte { copy(d[8:14], bytes.Repeat([]byte{0xff}, 6)); return d }, from, DropDestMAC, 0},
		{"ARP", func(d []byte) []byte { d[21] = 0x06; return d }, from, DropEtherType, 0},
		{"IPv6 EtherType on IPv4", func(d []byte) []byte { d[20], d[21] = 0x86, 0xdd; return d }, from, DropIPHeader, 0},
		{"IPv4 total length beyond the frame", func(d []byte) []byte { d[headroom+3] = 25; return d }, from, DropIPHeader, 0},
		{"IPv4 header length 4", func(d []byte) []byte { d[headroom] = 0x44; return d }, from, DropIPHeader, 0},
		{"foreign source", func(d []byte) []byte { d[headroom+14] = 3; return d }, from, DropForeignSource, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := frame()
			if tc.change != nil {
				d = tc.change(d)
			}
			n, drop := check(d, tc.from, peers, 1, ownMAC, 1450)
			if n != tc.n || drop != tc.drop {
				t.Errorf("check = %d, %q; want %d, %q", n, drop, tc.n, tc.drop)
			}
		})
	}
}

func TestPutHeaders(t *testing.T) {
	h := make([]byte, headroom)
	putHeaders(h, 1, peerMAC, ownMAC, etherTypeIPv6)
	want := "0800000000000100" + "02bb00000002" + "02aa00000001" + "86dd"
	if got := hex.EncodeToString(h); got != want {
		t.Errorf("headers %s, want %s", got, want)
	}
}

func TestInnerDst(t *testing.T) {
	d := frame()[headroom:]
	if dst, et, ok := innerDst(d); !ok || dst != netip.MustParseAddr("10.244.1.2") || et != etherTypeIPv4 {
		t.Errorf("innerDst = %v, %#x, %v", dst, et, ok)
	}
	v6 := make([]byte, 40)
	v6[0] = 0x60
	copy(v6[24:], netip.MustParseAddr("fd00::1").AsSlice())
	if dst, et, ok := innerDst(v6); !ok || dst != netip.MustParseAddr("fd00::1") || et != etherTypeIPv6 {
		t.Errorf("innerDst(IPv6) = %v, %#x, %v", dst, et, ok)
	}
	if _, _, ok := innerDst([]byte{0x45, 0}); ok {
		t.Error("a 2-byte packet passed")
	}
}
