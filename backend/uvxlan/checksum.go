package uvxlan

import (
	"encoding/binary"
	"math/bits"
)

// checksumAdd adds the Internet checksum (RFC 1071) of b to the running
// sum acc (not folded) and returns the new running sum. An odd last byte
// is summed as the high byte of a 16-bit word, as RFC 1071 pads it.
//
// The checksum is the sum of b's big-endian 16-bit words modulo 0xffff:
// adding back every carry computes that (a non-zero sum folds to 0xffff,
// never to 0). As 2^16 is 1 modulo 0xffff, a big-endian 64-bit word is,
// modulo 0xffff, the sum of its four 16-bit words, and a carry out of 64
// bits is 1. So b is summed 8 bytes at a time with add-with-carry, and the
// last carry is added as 1.
func checksumAdd(b []byte, acc uint64) uint64 {
	var s, c uint64
	for len(b) >= 64 {
		s, c = bits.Add64(s, binary.BigEndian.Uint64(b[0:8]), c)
		s, c = bits.Add64(s, binary.BigEndian.Uint64(b[8:16]), c)
		s, c = bits.Add64(s, binary.BigEndian.Uint64(b[16:24]), c)
		s, c = bits.Add64(s, binary.BigEndian.Uint64(b[24:32]), c)
		s, c = bits.Add64(s, binary.BigEndian.Uint64(b[32:40]), c)
		s, c = bits.Add64(s, binary.BigEndian.Uint64(b[40:48]), c)
		s, c = bits.Add64(s, binary.BigEndian.Uint64(b[48:56]), c)
		s, c = bits.Add64(s, binary.BigEndian.Uint64(b[56:64]), c)
		b = b[64:]
	}
	for len(b) >= 8 {
		s, c = bits.Add64(s, binary.BigEndian.Uint64(b), c)
		b = b[8:]
	}
	// The last 0 to 7 bytes, as a 64-bit word padded with zeros.
	var tail uint64
	for i, x := range b {
		tail |= uint64(x) << (56 - 8*i)
	}
	s, c = bits.Add64(s, tail, c)
	return acc + uint64(checksumFold(s)) + c
}

// checksumFold folds a running sum into 16 bits (not complemented).
func checksumFold(acc uint64) uint16 {
	acc = acc>>32 + acc&0xffffffff
	acc = acc>>32 + acc&0xffffffff
	acc = acc>>16 + acc&0xffff
	acc = acc>>16 + acc&0xffff
	acc = acc>>16 + acc&0xffff
	return uint16(acc)
}
