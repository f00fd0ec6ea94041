package policy

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/testkit/benchreport"
	"github.com/weft-net/weft/test/e2e"
)

// connStats is one condition's connections in one round, times sorted.
type connStats struct {
	times  []time.Duration
	failed int
}

// quantile is the q-quantile of the times (nearest rank), in ms.
func (s connStats) quantile(q float64) float64 {
	if len(s.times) == 0 {
		return 0
	}
	i := int(q*float64(len(s.times))+0.999999) - 1
	return float64(s.times[max(i, 0)]) / float64(time.Millisecond)
}

// round is one round: each condition measured once, in r.order.
type round struct {
	n       int
	order   []condition
	load    [2]string // load averages (1, 5, 15 min) at its start and end
	connect [nConditions]connStats
	gbps    [nConditions]float64
	pos     [nConditions]int // the allowing rule's place among the policy rules of n2's ingress chain
}

func (r round) line(c condition) string {
	s := r.connect[c]
	return fmt.Sprintf("connect+first byte p50=%.3fms p99=%.3fms (n=%d, failed %d) iperf3=%.2fGbit/s rule at %d of %d",
		s.quantile(0.5), s.quantile(0.99), len(s.times), s.failed, r.gbps[c], r.pos[c], c.wantRules())
}

// figure is one row of the summary: how to read it from a round.
type figure struct {
	name string
	prec int
	get  func(r round, c condition) float64
}

var figures = []figure{
	{"connect + first byte p50 (ms)", 3, func(r round, c condition) float64 { return r.connect[c].quantile(0.5) }},
	{"connect + first byte p99 (ms)", 3, func(r round, c condition) float64 { return r.connect[c].quantile(0.99) }},
	{"single-stream throughput (Gbit/s)", 2, func(r round, c condition) float64 { return r.gbps[c] }},
}

// spread is the median, lowest and highest of v.
func spread(v []float64) (med, lo, hi float64) {
	v = slices.Clone(v)
	slices.Sort(v)
	med = v[len(v)/2]
	if len(v)%2 == 0 {
		med = (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return med, v[0], v[len(v)-1]
}

func cell(v []float64, prec int) string {
	m, lo, hi := spread(v)
	if len(v) == 1 {
		return fmt.Sprintf("%.*f", prec, m)
	}
	return fmt.Sprintf("%.*f (%.*f–%.*f)", prec, m, prec, lo, prec, hi)
}

// positionFit fits the many condition's p50 (ms) to the allowing rule's
// place (the number of rules before it) by least squares: slope (ms per
// rule), intercept (ms) and correlation; ok is false with fewer than three
// rounds or no spread of places.
func positionFit(rounds []round) (slope, intercept, r float64, ok bool) {
	n := float64(len(rounds))
	var sx, sy, sxx, syy, sxy float64
	for _, rd := range rounds {
		x, y := float64(rd.pos[many]-1), rd.connect[many].quantile(0.5)
		sx, sy, sxx, syy, sxy = sx+x, sy+y, sxx+x*x, syy+y*y, sxy+x*y
	}
	vx, vy, cxy := sxx-sx*sx/n, syy-sy*sy/n, sxy-sx*sy/n
	if len(rounds) < 3 || vx == 0 || vy == 0 {
		return 0, 0, 0, false
	}
	slope = cxy / vx
	return slope, (sy - slope*sx) / n, cxy / math.Sqrt(vx*vy), true
}

// write is the report of one benchmark's rounds.
func write(b *testing.B, name string, conns, secs int, rounds []round) []byte {
	var w bytes.Buffer
	host, _ := os.Hostname()
	rel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	cpus := strings.Count(readFile("/proc/cpuinfo"), "processor\t:")
	root := e2e.ModuleRootDir(b)
	st := benchreport.NewStamp(root, name, benchreport.Command("./bench/policy"), "policy", "internal/daemon", "backend/"+name)
	stamp, err := st.Markdown(root)
	if err != nil {
		b.Fatal(err)
	}
	fmt.Fprintf(&w, "### %s\n\n%s\nMade on %s (%d CPUs, Linux %s) by\n\n    %s\n\n",
		name, stamp, host, cpus, strings.TrimSpace(string(rel)), st.Command)
	fmt.Fprintf(&w, "%d rounds; in each, every condition once (the order rotates from round to round): %d connections one after the other, then one iperf3 stream for %d s. "+
		"Medians over the rounds, lowest–highest in brackets; a ratio is the condition's figure over the no-policy figure of the same round.\n\n",
		len(rounds), conns, secs)
	fmt.Fprintf(&w, "| figure |")
	for c := range nConditions {
		fmt.Fprintf(&w, " %s |", c)
	}
	fmt.Fprintf(&w, "\n|---|%s\n", strings.Repeat("---|", int(nConditions)))
	for _, f := range figures {
		fmt.Fprintf(&w, "| %s |", f.name)
		for c := range nConditions {
			var v []float64
			for _, r := range rounds {
				v = append(v, f.get(r, c))
			}
			fmt.Fprintf(&w, " %s |", cell(v, f.prec))
		}
		fmt.Fprintln(&w)
		fmt.Fprintf(&w, "| ÷ no policy |")
		for c := range nConditions {
			var v []float64
			for _, r := range rounds {
				v = append(v, f.get(r, c)/f.get(r, none))
			}
			fmt.Fprintf(&w, " %s |", cell(v, 3))
		}
		fmt.Fprintln(&w)
	}
	if slope, icept, r, ok := positionFit(rounds); ok {
		fmt.Fprintf(&w, "\nThe allowing rule's place among n2's %d policy rules changes from table to table (weftd orders them as its informer lists the policies). "+
			"With the 1,000 others, connect + first byte p50 against that place (least squares over the rounds): %.3f ms + %.2f µs per rule before it, correlation %.2f; "+
			"at the last place, %.3f ms.\n", many.wantRules(), icept, slope*1000, r, icept+slope*float64(many.wantRules()-1))
	}
	fmt.Fprintf(&w, "\nEach round (load average over 1, 5 and 15 minutes at its start and end):\n\n")
	fmt.Fprintf(&w, "| round | load at start | load at end | condition | p50 (ms) | p99 (ms) | connections failed | Gbit/s | allowing rule at |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rounds {
		for _, c := range r.order {
			s := r.connect[c]
			pos := "–"
			if c == allow || c == many {
				pos = fmt.Sprintf("%d of %d", r.pos[c], c.wantRules())
			}
			fmt.Fprintf(&w, "| %d | %s | %s | %s | %.3f | %.3f | %d of %d | %.2f | %s |\n",
				r.n, r.load[0], r.load[1], c, s.quantile(0.5), s.quantile(0.99), s.failed, conns, r.gbps[c], pos)
		}
	}
	return w.Bytes()
}

// report prints the report of name's rounds and, when WEFT_BENCH_REPORT
// names a markdown file (a relative path is taken from the repository's
// root), writes it between name's markers there.
func report(b *testing.B, name string, conns, secs int, rounds []round) {
	if len(rounds) == 0 {
		return
	}
	out := write(b, name, conns, secs, rounds)
	fmt.Printf("\n%s\n", out)
	path := benchreport.Path(e2e.ModuleRootDir(b))
	if path == "" {
		return
	}
	if err := benchreport.WriteSection(path, "policy", name, out); err != nil {
		b.Fatal(err)
	}
	fmt.Printf("report written to %s\n", path)
}

func readFile(path string) string {
	raw, _ := os.ReadFile(path)
	return string(raw)
}
