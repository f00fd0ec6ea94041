package benchreport

import (
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
)

// Spread is the median, lowest and highest of v, NaNs left out; ok is
// false when nothing is left.
func Spread(v []float64) (med, lo, hi float64, ok bool) {
	v = slices.DeleteFunc(slices.Clone(v), math.IsNaN)
	if len(v) == 0 {
		return 0, 0, 0, false
	}
	slices.Sort(v)
	m := v[len(v)/2]
	if len(v)%2 == 0 {
		m = (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return m, v[0], v[len(v)-1], true
}

// Cell is v's median with prec decimals and, when the rounds differ at
// that precision, their spread: "9.00 (8.51–9.70)"; "–" when v has no
// figure.
func Cell(v []float64, prec int) string {
	m, lo, hi, ok := Spread(v)
	if !ok {
		return "–"
	}
	if len(v) == 1 || fmt.Sprintf("%.*f", prec, lo) == fmt.Sprintf("%.*f", prec, hi) {
		return fmt.Sprintf("%.*f", prec, m)
	}
	return fmt.Sprintf("%.*f (%.*f–%.*f)", prec, m, prec, lo, prec, hi)
}

// LoadAvg is the machine's load averages over 1, 5 and 15 minutes joined
// by sep, to print with a figure; "?" when /proc/loadavg cannot be read.
func LoadAvg(sep string) string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], sep)
}
