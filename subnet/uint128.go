package subnet

import (
	"encoding/binary"
	"math/bits"
	"net/netip"
)

// Small 128-bit helpers for subnet arithmetic over both address families.

func be128(b [16]byte) (hi, lo uint64) {
	return binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])
}

func put128(hi, lo uint64) [16]byte {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], hi)
	binary.BigEndian.PutUint64(b[8:], lo)
	return b
}

func shl128(n uint64, s uint) (hi, lo uint64) {
	switch {
	case s == 0:
		return 0, n
	case s >= 128:
		return 0, 0
	case s >= 64:
		return n << (s - 64), 0
	default:
		return n >> (64 - s), n << s
	}
}

// lowMask128 returns a 128-bit number with its n lowest bits set.
func lowMask128(n uint) (hi, lo uint64) {
	switch {
	case n >= 128:
		return ^uint64(0), ^uint64(0)
	case n >= 64:
		return 1<<(n-64) - 1, ^uint64(0)
	default:
		return 0, 1<<n - 1
	}
}

func add64(a, b uint64) (sum, carry uint64) { return bits.Add64(a, b, 0) }

// subnetIndex returns how many subnets of length l lie between base and a
// (a must not be before base). Results beyond 2^63 are capped.
func subnetIndex(base, a netip.Addr, l int) uint64 {
	bh, bl := be128(base.As16())
	ah, al := be128(a.As16())
	lo, borrow := bits.Sub64(al, bl, 0)
	hi, _ := bits.Sub64(ah, bh, borrow)
	s := uint(a.BitLen() - l)
	// shift right by s
	switch {
	case s == 0:
	case s >= 64:
		lo, hi = hi>>(s-64), 0
	default:
		lo = lo>>s | hi<<(64-s)
		hi >>= s
	}
	if hi != 0 || lo > 1<<63 {
		return 1 << 63
	}
	return lo
}
