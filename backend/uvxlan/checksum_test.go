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

// TestChecksumRFC1071Example: the IPv4 header example usually used to
// illustrate RFC 1071.
func TestChecksumRFC1071Example(t *testing.T) {
	hdr := []byte{0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8, 0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7}
	if got := ^checksumFold(checksumAdd(hdr, 0)); got != 0xb861 {
		t.Fatalf("checksum %#04x, want 0xb861", got)
	}
}

// TestChecksum checks checksumAdd against the word-by-word sum on every
// length up to 300 bytes and on random lengths up to 70,000, odd and even,
// at every alignment within 8 bytes, with random data and with all-ones
// data (every add carries), and on a running sum split at random points.
func TestChecksum(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 70008)
	lengths := []int{0, 1, 2, 3, 1448, 1500, 9000, 65535, 65536, 70000}
	for n := range 300 {
		lengths = append(lengths, n)
	}
	for range 300 {
		lengths = append(lengths, r.IntN(70001))
	}
	for _, fill := range []string{"random", "ones", "zeros"} {
		for i := range buf {
			switch fill {
			case "random":
				buf[i] = byte(r.Uint32())
			case "ones":
				buf[i] = 0xff
			default:
				buf[i] = 0
			}
		}
		for _, n := range lengths {
			for off := range 8 {
				b := buf[off : off+n]
				acc := uint64(r.Uint32())
				if got, want := checksumFold(checksumAdd(b, acc)), slowChecksum(b, acc); got != want {
					t.Fatalf("%s, len %d at offset %d: %#04x, want %#04x", fill, n, off, got, want)
				}
			}
		}
	}
	// A sum in parts, as the callers make it (a pseudo-header, then the
	// segment), is the sum of the whole when every part but the last has an
	// even length.
	for range 1000 {
		n := r.IntN(3000)
		b := buf[:n]
		cut := r.IntN(n+1) &^ 1
		if got, want := checksumFold(checksumAdd(b[cut:], checksumAdd(b[:cut], 0))), slowChecksum(b, 0); got != want {
			t.Fatalf("len %d cut at %d: %#04x, want %#04x", n, cut, got, want)
		}
	}
}

// FuzzChecksum compares checksumAdd with the word-by-word sum on any input,
// repeated to reach long lengths.
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
		b = b[min(int(off%8), len(b)):]
		if got, want := checksumFold(checksumAdd(b, 0)), slowChecksum(b, 0); got != want {
			t.Fatalf("len %d: %#04x, want %#04x", len(b), got, want)
		}
	})
}

func BenchmarkChecksum(b *testing.B) {
	buf := make([]byte, 1448)
	for i := range buf {
		buf[i] = byte(i)
	}
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		checksumFold(checksumAdd(buf, 0))
	}
}
