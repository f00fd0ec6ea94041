package uvxlan

import "encoding/binary"

// checksumAdd adds b to the running one's-complement sum acc (not folded).
// It reads 8 bytes per step; the carries are kept in the upper bits of the
// 64-bit accumulator and folded at the end.
func checksumAdd(b []byte, acc uint64) uint64 {
	for len(b) >= 32 {
		acc += uint64(binary.BigEndian.Uint32(b[0:])) + uint64(binary.BigEndian.Uint32(b[4:])) +
			uint64(binary.BigEndian.Uint32(b[8:])) + uint64(binary.BigEndian.Uint32(b[12:])) +
			uint64(binary.BigEndian.Uint32(b[16:])) + uint64(binary.BigEndian.Uint32(b[20:])) +
			uint64(binary.BigEndian.Uint32(b[24:])) + uint64(binary.BigEndian.Uint32(b[28:]))
		b = b[32:]
	}
	for len(b) >= 4 {
		acc += uint64(binary.BigEndian.Uint32(b))
		b = b[4:]
	}
	if len(b) >= 2 {
		acc += uint64(binary.BigEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		acc += uint64(b[0]) << 8
	}
	return acc
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

// pseudoHeaderSum is the running sum of the TCP/UDP pseudo-header.
func pseudoHeaderSum(proto byte, src, dst []byte, length int) uint64 {
	acc := checksumAdd(src, 0)
	acc = checksumAdd(dst, acc)
	return acc + uint64(proto) + uint64(length)
}
