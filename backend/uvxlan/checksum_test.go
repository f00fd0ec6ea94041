package uvxlan

import (
	"math/rand/v2"
	"testing"
)

// slowChecksum is RFC 1071 word by word (refSum, the tests' own sum),
// plus acc, folded.
func slowChecksum(b []byte, acc uint64) uint16 {
	s := uint64(refSum(b)) + acc
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return uint16(s)
}

// TestChecksumLong checks checksumAdd against the word-by-word sum on
// lengths and alignments that take the vector path (on CPUs that have it)
// and its edges, with random data and with all-ones data (every add
// carries).
func TestChecksumLong(t *testing.T) {
	t.Logf("vector sum used: %v", haveSum32)
	r := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 70000)
	for _, fill := range []string{"random", "ones"} {
		for i := range buf {
			if fill == "ones" {
				buf[i] = 0xff
			} else {
				buf[i] = byte(r.Uint32())
			}
		}
		for _, n := range []int{127, 128, 255, 256, 257, 383, 384, 385, 1448, 1500, 4095, 9000, 65535, 65536, 69990} {
			for off := range 4 {
				b := buf[off : off+n]
				acc := uint64(r.Uint32())
				if got, want := checksumFold(checksumAdd(b, acc)), slowChecksum(b, acc); got != want {
					t.Fatalf("%s, len %d at offset %d: %#04x, want %#04x", fill, n, off, got, want)
				}
			}
		}
	}
}

// FuzzChecksum compares checksumAdd with the word-by-word sum on any input,
// repeated to reach the vector path.
func FuzzChecksum(f *testing.F) {
	f.Add([]byte{0xff, 0xff, 0, 1}, uint16(300), uint8(1))
	f.Add([]byte{1, 2, 3}, uint16(1000), uint8(0))
	f.Fuzz(func(t *testing.T, seed []byte, reps uint16, off uint8) {
		if len(seed) == 0 {
			return
		}
		b := make([]byte, 0, int(reps)*len(seed)%70000+len(seed))
		for len(b) < cap(b)-len(seed) {
			b = append(b, seed...)
		}
		b = b[min(int(off%4), len(b)):]
		if got, want := checksumFold(checksumAdd(b, 0)), slowChecksum(b, 0); got != want {
			t.Fatalf("len %d: %#04x, want %#04x", len(b), got, want)
		}
	})
}
