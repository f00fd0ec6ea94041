package uvxlan

import (
	"encoding/binary"
	"math/bits"
)

// checksumAdd adds the Internet checksum (RFC 1071) of b to the running
// sum acc (not folded) and returns the new running sum.
//
// The one's-complement sum does not depend on byte order as long as the
// result is swapped back at the end, so b is read as little-endian 64-bit
// words with the carries chained through bits.Add64, 32 bytes per step;
// this is several times faster than summing big-endian 16- or 32-bit words.
func checksumAdd(b []byte, acc uint64) uint64 {
	var s, c uint64
	for len(b) >= 32 {
		s, c = bits.Add64(s, binary.LittleEndian.Uint64(b[0:]), c)
		s, c = bits.Add64(s, binary.LittleEndian.Uint64(b[8:]), c)
		s, c = bits.Add64(s, binary.LittleEndian.Uint64(b[16:]), c)
		s, c = bits.Add64(s, binary.LittleEndian.Uint64(b[24:]), c)
		b = b[32:]
	}
	for len(b) >= 8 {
		s, c = bits.Add64(s, binary.LittleEndian.Uint64(b), c)
		b = b[8:]
	}
	var tail uint64
	switch n := len(b); {
	case n >= 4:
		tail = uint64(binary.LittleEndian.Uint32(b))
		if n >= 6 {
			tail += uint64(binary.LittleEndian.Uint16(b[4:])) << 32
			if n == 7 {
				tail += uint64(b[6]) << 48
			}
		} else if n == 5 {
			tail += uint64(b[4]) << 32
		}
	case n >= 2:
		tail = uint64(binary.LittleEndian.Uint16(b))
		if n == 3 {
			tail += uint64(b[2]) << 16
		}
	case n == 1:
		tail = uint64(b[0])
	}
	s, c = bits.Add64(s, tail, c)
	s, c = bits.Add64(s, 0, c) // c is now 0: s was at most 2^64-2 before
	// Fold to 16 bits in little-endian order, then swap into network order.
	s32 := uint64(uint32(s>>32)) + uint64(uint32(s))
	s32 = s32>>32 + s32&0xffffffff
	s32 = s32>>16 + s32&0xffff
	s32 = s32>>16 + s32&0xffff
	return acc + uint64(bits.ReverseBytes16(uint16(s32)))
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
