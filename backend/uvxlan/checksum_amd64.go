package uvxlan

import "golang.org/x/sys/cpu"

// sum32AVX2 returns the sum of the little-endian 32-bit words of b; len(b)
// must be a non-zero multiple of 128 (checksum_amd64.s).
//
//go:noescape
func sum32AVX2(b []byte) uint64

// haveSum32 reports whether sum32 may be used on this CPU.
var haveSum32 = cpu.X86.HasAVX2

// sum32 is sum32AVX2, for the parts of a checksum of 128 bytes and more.
func sum32(b []byte) uint64 { return sum32AVX2(b) }
