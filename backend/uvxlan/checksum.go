package uvxlan

import (
	"encoding/binary"
	"math/bits"
)

// checksumAdd adds the Internet checksum (RFC 1071) of b to the running
// sum acc (not folded) and returns the new running sum.
//
// The one's-complement sum does not depend on byte order as long as the
// result is swapped back at the end, and a sum of 32-bit words folds to the
// same 16 bits as the sum of their halves. So b is read as little-endian
// 32-bit words added into four independent 64-bit accumulators, 64 bytes per
// step: no carries to chain, and the adds run in parallel. (Each accumulator
// would need 2^30 steps to overflow.) On CPUs with AVX2 the runs of 128
// bytes go through sum32: the same sum of 32-bit words, 32 bytes per
// instruction.
func checksumAdd(b []byte, acc uint64) uint64 {
	var a0, a1, a2, a3 uint64
	if haveSum32 && len(b) >= 256 {
		n := len(b) &^ 127
		s := sum32(b[:n])
		a0, b = s>>32+s&0xffffffff, b[n:]
	}
	for len(b) >= 64 {
		w := b[:64:64]
		a0 += uint64(binary.LittleEndian.Uint32(w[0:])) + uint64(binary.LittleEndian.Uint32(w[4:])) +
			uint64(binary.LittleEndian.Uint32(w[32:])) + uint64(binary.LittleEndian.Uint32(w[36:]))
		a1 += uint64(binary.LittleEndian.Uint32(w[8:])) + uint64(binary.LittleEndian.Uint32(w[12:])) +
			uint64(binary.LittleEndian.Uint32(w[40:])) + uint64(binary.LittleEndian.Uint32(w[44:]))
		a2 += uint64(binary.LittleEndian.Uint32(w[16:])) + uint64(binary.LittleEndian.Uint32(w[20:])) +
			uint64(binary.LittleEndian.Uint32(w[48:])) + uint64(binary.LittleEndian.Uint32(w[52:]))
		a3 += uint64(binary.LittleEndian.Uint32(w[24:])) + uint64(binary.LittleEndian.Uint32(w[28:])) +
			uint64(binary.LittleEndian.Uint32(w[56:])) + uint64(binary.LittleEndian.Uint32(w[60:]))
		b = b[64:]
	}
	for len(b) >= 4 {
		a0 += uint64(binary.LittleEndian.Uint32(b))
		b = b[4:]
	}
	if len(b) >= 2 {
		a1 += uint64(binary.LittleEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		a2 += uint64(b[0])
	}
	// Fold to 16 bits in little-endian order, then swap into network order.
	s := a0>>32 + a0&0xffffffff + a1>>32 + a1&0xffffffff + a2>>32 + a2&0xffffffff + a3>>32 + a3&0xffffffff
	s = s>>32 + s&0xffffffff
	s = s>>16 + s&0xffff
	s = s>>16 + s&0xffff
	s = s>>16 + s&0xffff
	return acc + uint64(bits.ReverseBytes16(uint16(s)))
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
