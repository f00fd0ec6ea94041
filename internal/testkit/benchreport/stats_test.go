package benchreport

import (
	"math"
	"strings"
	"testing"
)

// TestSpread: the median of an odd and an even count, NaNs left out, and
// no figure at all when only NaNs are left; the input is not reordered.
func TestSpread(t *testing.T) {
	nan := math.NaN()
	for _, c := range []struct {
		v           []float64
		med, lo, hi float64
		ok          bool
	}{
		{[]float64{3, 1, 2}, 2, 1, 3, true},
		{[]float64{4, nan, 1, 2, 3}, 2.5, 1, 4, true},
		{[]float64{nan, nan}, 0, 0, 0, false},
		{nil, 0, 0, 0, false},
	} {
		in := append([]float64(nil), c.v...)
		med, lo, hi, ok := Spread(c.v)
		if med != c.med || lo != c.lo || hi != c.hi || ok != c.ok {
			t.Errorf("Spread(%v) = %v %v %v %v, want %v %v %v %v", in, med, lo, hi, ok, c.med, c.lo, c.hi, c.ok)
		}
		if len(c.v) > 0 && c.v[0] != in[0] && !math.IsNaN(in[0]) {
			t.Errorf("Spread reordered its input: %v, was %v", c.v, in)
		}
	}
}

// TestLoadAvg: three fields joined by the separator.
func TestLoadAvg(t *testing.T) {
	if got := strings.Split(LoadAvg("/"), "/"); len(got) != 3 {
		t.Errorf("LoadAvg(\"/\") = %q, want three averages", strings.Join(got, "/"))
	}
}
