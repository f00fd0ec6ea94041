package peers

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/testkit/benchreport"
	"github.com/weft-net/weft/test/e2e"
)

// result is one daemon's figures in one round.
type result struct {
	round              int
	loadStart, loadEnd string // load averages (1, 5, 15 minutes) before the daemon starts and after its churn
	startup, fromExec  time.Duration
	p50, p99, max      time.Duration // new lease to route
	idle               window        // with no peers (samples 0: not measured)
	rest, churn        window
	gomem              goMem // weftd's Go runtime at the end of the rest window
}

func (r result) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "startup_to_all_programmed=%s", r.startup.Round(time.Millisecond))
	if r.fromExec > 0 {
		fmt.Fprintf(&b, " (from the daemon's start %s)", r.fromExec.Round(time.Millisecond))
	}
	fmt.Fprintf(&b, " new_lease_to_route p50=%s p99=%s max=%s "+
		"at_rest anon=%.1fMB (max %.1f) pss=%.1fMB (max %.1f) file-backed=%.1fMB cpu=%.2f%% "+
		"churn anon=%.1fMB (max %.1f) pss=%.1fMB (max %.1f) cpu=%.2f%%",
		r.p50.Round(time.Microsecond), r.p99.Round(time.Microsecond), r.max.Round(time.Microsecond),
		r.rest.anon, r.rest.anonMax, r.rest.pss, r.rest.pssMax, r.rest.file, r.rest.cpu,
		r.churn.anon, r.churn.anonMax, r.churn.pss, r.churn.pssMax, r.churn.cpu)
	if r.idle.samples > 0 {
		fmt.Fprintf(&b, " idle_no_peers anon=%.1fMB pss=%.1fMB", r.idle.anon, r.idle.pss)
	}
	fmt.Fprintf(&b, " load=%s→%s", r.loadStart, r.loadEnd)
	return b.String()
}

// column is one daemon's rounds.
type column struct {
	label string
	rs    []result
}

// figure is one row of a report's summary: how to read it from a round.
type figure struct {
	name string
	prec int
	get  func(result) float64 // NaN: the daemon does not have it
}

// median is f's median over c's rounds (NaN if none has it).
func (c column) median(f func(result) float64) float64 {
	var v []float64
	for _, r := range c.rs {
		v = append(v, f(r))
	}
	m, _, _, ok := benchreport.Spread(v)
	if !ok {
		return nan
	}
	return m
}

func (c column) cell(f figure) string {
	var v []float64
	for _, r := range c.rs {
		v = append(v, f.get(r))
	}
	m, lo, hi, ok := benchreport.Spread(v)
	if !ok {
		return "–"
	}
	if len(v) == 1 || lo == hi {
		return fmt.Sprintf("%.*f", f.prec, m)
	}
	return fmt.Sprintf("%.*f (%.*f–%.*f)", f.prec, m, f.prec, lo, f.prec, hi)
}

// section is one benchmark's part of the report.
type section struct {
	name   string   // names its markers
	intro  []string // paragraphs before the tables
	raw    []string // paragraphs in place of the tables below, when set
	cols   []column
	figs   []figure
	perRow func(r result) []string // a round's cells after round, daemon and load
	perHdr []string
	tail   []string // paragraphs after the tables
}

func (s section) write(w io.Writer, b *testing.B) {
	host, _ := os.Hostname()
	rel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	root := e2e.ModuleRootDir(b)
	st := benchreport.NewStamp(root, s.name, benchreport.Command("./bench/peers"), measures[s.name]...)
	stamp, err := st.Markdown(root)
	if err != nil {
		b.Fatal(err)
	}
	fmt.Fprintf(w, "%s\nMade on %s (%d CPUs, Linux %s) by\n\n    %s\n\n",
		stamp, host, runtime.NumCPU(), strings.TrimSpace(string(rel)), st.Command)
	for _, p := range s.intro {
		fmt.Fprintf(w, "%s\n\n", p)
	}
	if s.raw != nil {
		for _, p := range append(s.raw, s.tail...) {
			fmt.Fprintf(w, "%s\n\n", p)
		}
		return
	}
	n := 0
	for _, c := range s.cols {
		n = max(n, len(c.rs))
	}
	switch {
	case n == 1:
		fmt.Fprintf(w, "One round:\n\n")
	case len(s.cols) == 1:
		fmt.Fprintf(w, "Medians of %d rounds (lowest–highest):\n\n", n)
	default:
		fmt.Fprintf(w, "Medians of %d interleaved rounds (lowest–highest):\n\n", n)
	}
	fmt.Fprint(w, "| figure |")
	for _, c := range s.cols {
		fmt.Fprintf(w, " %s |", c.label)
	}
	fmt.Fprint(w, "\n|---|")
	for range s.cols {
		fmt.Fprint(w, "---|")
	}
	fmt.Fprintln(w)
	for _, f := range s.figs {
		fmt.Fprintf(w, "| %s |", f.name)
		for _, c := range s.cols {
			fmt.Fprintf(w, " %s |", c.cell(f))
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "\nEach round (load average over 1, 5 and 15 minutes before the daemon starts and after its churn):\n\n")
	fmt.Fprintf(w, "| round | daemon | load before | load after | %s |\n|---|---|---|---|%s\n",
		strings.Join(s.perHdr, " | "), strings.Repeat("---|", len(s.perHdr)))
	var rows []struct {
		r     result
		label string
	}
	for _, c := range s.cols {
		for _, r := range c.rs {
			rows = append(rows, struct {
				r     result
				label string
			}{r, c.label})
		}
	}
	slices.SortStableFunc(rows, func(a, b struct {
		r     result
		label string
	}) int {
		return a.r.round - b.r.round
	})
	for _, x := range rows {
		fmt.Fprintf(w, "| %d | %s | %s | %s | %s |\n", x.r.round, x.label, x.r.loadStart, x.r.loadEnd,
			strings.Join(s.perRow(x.r), " | "))
	}
	for _, p := range s.tail {
		fmt.Fprintf(w, "\n%s\n", p)
	}
}

// measures are the paths whose code each section's figures describe.
var measures = map[string][]string{
	"Peers5000":  {"cmd/weftd", "internal/daemon", "subnet", "backend/vxlan", "backend/kernel", "vtep"},
	"Kube1000":   {"cmd/weftd", "internal/daemon", "subnet", "backend/vxlan", "backend/kernel", "vtep", "policy"},
	"Kube5000":   {"cmd/weftd", "internal/daemon", "subnet", "backend/vxlan", "backend/kernel", "vtep", "policy"},
	"LeaseRoute": {"cmd/weftd", "internal/daemon", "subnet", "backend/vxlan", "backend/kernel", "vtep"},
}

// report prints s and, when WEFT_BENCH_REPORT names a markdown file (a
// relative path is taken from the repository's root), writes it between
// s's markers there.
func report(b *testing.B, s section) {
	var buf bytes.Buffer
	s.write(&buf, b)
	fmt.Printf("\n%s\n", buf.String())
	path := benchreport.Path(e2e.ModuleRootDir(b))
	if path == "" {
		return
	}
	if err := benchreport.WriteSection(path, "peers", s.name, buf.Bytes()); err != nil {
		b.Error(err)
		return
	}
	fmt.Printf("report written to %s\n", path)
}

// ms is d in milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// orNaN is v, or NaN when ok is false.
func orNaN(v float64, ok bool) float64 {
	if !ok {
		return nan
	}
	return v
}

// human writes d as the report does: "200 ms", "5 s".
func human(d time.Duration) string {
	if d < time.Second {
		return fmt.Sprintf("%d ms", d.Milliseconds())
	}
	return fmt.Sprintf("%g s", d.Seconds())
}

// thousands writes n with a comma between thousands: 5,000.
func thousands(n int) string {
	if n < 1000 {
		return fmt.Sprint(n)
	}
	return fmt.Sprintf("%s,%03d", thousands(n/1000), n%1000)
}
