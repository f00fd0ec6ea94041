package flows

import (
	"bytes"
	"fmt"
	"os"
	"testing"

	"github.com/weft-net/weft/internal/testkit/benchreport"
)

// round is one round: each condition measured once, in order.
type round struct {
	n     int
	order []condition
	load  [2]string // at its start and end
	s     [nConditions]sample
}

// figure is one row of the report: how to read it from a sample.
type figure struct {
	name   string
	prec   int
	reader bool // only the conditions with a reader have it
	get    func(s sample) float64
}

var figures = []figure{
	{"connections a second", 0, false, func(s sample) float64 { return s.conns }},
	{"reader's CPU, % of a core", 1, true, func(s sample) float64 { return 100 * s.res.CPU / s.seconds }},
	{"events read a second", 0, true, func(s sample) float64 { return float64(s.res.Events) / s.seconds }},
	{"flows kept a second (ring of 4,096, 1,000 a second)", 0, true, func(s sample) float64 { return float64(s.res.Kept) / s.seconds }},
	{"pauses a second", 2, true, func(s sample) float64 { return float64(s.res.Pauses) / s.seconds }},
	{"socket overflows a second (events the kernel dropped; the reader reads on)", 2, true, func(s sample) float64 { return float64(s.res.Lost) / s.seconds }},
	{"reader's peak RSS (MiB)", 1, true, func(s sample) float64 { return float64(s.res.MaxRSS) / 1024 }},
}

// report prints the figures and, with WEFT_BENCH_REPORT, writes them into
// the report's section "flood".
func report(b *testing.B, rounds []round, secs float64) {
	var out bytes.Buffer
	root, err := benchreport.Root()
	if err != nil {
		b.Fatal(err)
	}
	st := benchreport.NewStamp(root, "flood", benchreport.Command("./bench/flows"), "flow", "internal/daemon/flows_linux.go")
	stamp, err := st.Markdown(root)
	if err != nil {
		b.Fatal(err)
	}
	out.WriteString(stamp)
	fmt.Fprintf(&out, "\n%d interleaved rounds of a %g s flood per condition; median (lowest–highest).\n", len(rounds), secs)
	out.WriteString("Load average (1, 5, 15 min) at each round's start and end:")
	for _, r := range rounds {
		fmt.Fprintf(&out, " %s → %s;", r.load[0], r.load[1])
	}
	out.WriteString("\n\n| figure |")
	for c := range nConditions {
		fmt.Fprintf(&out, " %s |", c)
	}
	out.WriteString("\n|---|")
	for range nConditions {
		out.WriteString("---|")
	}
	out.WriteString("\n")
	for _, f := range figures {
		fmt.Fprintf(&out, "| %s |", f.name)
		for c := range nConditions {
			if f.reader && c == noReader {
				out.WriteString(" – |")
				continue
			}
			var v []float64
			for _, r := range rounds {
				v = append(v, f.get(r.s[c]))
			}
			fmt.Fprintf(&out, " %s |", benchreport.Cell(v, f.prec))
		}
		out.WriteString("\n")
	}
	out.WriteString("| connections a second, ratio to no reader in the same round |")
	for c := range nConditions {
		var v []float64
		for _, r := range rounds {
			v = append(v, r.s[c].conns/r.s[noReader].conns)
		}
		fmt.Fprintf(&out, " %s |", benchreport.Cell(v, 2))
	}
	out.WriteString("\n")
	os.Stdout.Write(out.Bytes())
	if path := benchreport.Path(root); path != "" {
		if err := benchreport.WriteSection(path, "flows", "flood", out.Bytes()); err != nil {
			b.Fatal(err)
		}
	}
}
