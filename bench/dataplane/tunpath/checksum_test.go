package tunpath

import (
	"bytes"
	"encoding/hex"
	"testing"
)

// tcpPacket is an IPv4 TCP packet 10.244.2.2 → 10.244.1.2 written by hand:
// a 20-byte TCP header and 4 bytes of payload, its checksum field holding
// csum (hex). The pseudo-header sum of these addresses and length (24) is
// 0x190a.
func tcpPacket(t *testing.T, csum string) []byte {
	t.Helper()
	b, err := hex.DecodeString("4500002c00004000400600000af402020af40102" + // IPv4, DF
		"c35014510000000100000000501000ff" + csum + "0000" + // TCP
		"deadbeef")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// verify is the receiver's check, written apart from the code under test:
// the ones' complement sum of the pseudo header and the segment is 0xffff.
func verify(pkt []byte) bool {
	seg := pkt[20:]
	words := []uint32{0x0af4, 0x0202, 0x0af4, 0x0102, 6, uint32(len(seg))}
	for i := 0; i+1 < len(seg); i += 2 {
		words = append(words, uint32(seg[i])<<8|uint32(seg[i+1]))
	}
	var s uint32
	for _, w := range words {
		s += w
		s = s&0xffff + s>>16
	}
	return s == 0xffff
}

func TestCompletePartial(t *testing.T) {
	p := tcpPacket(t, "190a")
	if verify(p) {
		t.Fatal("the partial packet verifies already; the test is wrong")
	}
	if !completePartial(p) {
		t.Fatal("a partial checksum was not completed")
	}
	if !verify(p) {
		t.Errorf("completed checksum %x does not verify", p[36:38])
	}
	again := bytes.Clone(p)
	completePartial(again)
	if !bytes.Equal(again, p) {
		t.Error("a complete checksum was changed")
	}

	for name, p := range map[string][]byte{
		"other value": tcpPacket(t, "190b"),
		"fragment": func() []byte {
			p := tcpPacket(t, "190a")
			p[6] = 0x20 // MF
			return p
		}(),
	} {
		before := bytes.Clone(p)
		if completePartial(p) || !bytes.Equal(p, before) {
			t.Errorf("%s: changed", name)
		}
	}
}
