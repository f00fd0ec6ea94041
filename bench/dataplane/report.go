package main

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/weft-net/weft/internal/testkit/benchreport"
)

// report is everything one run of the benchmark measured.
type report struct {
	header    string
	conds     []condition
	idle      float64 // cores; 0 when not measured
	breakdown *breakdown
}

func header(o options) string {
	host, _ := os.Hostname()
	cpus := fmt.Sprintf("%d CPUs", runtime.NumCPU())
	if m := readCPU().cpus; m > runtime.NumCPU() {
		cpus = fmt.Sprintf("%d CPUs, of which the benchmark's CPU affinity allows %d", m, runtime.NumCPU())
	}
	return fmt.Sprintf("%s, %s; %s (%s); iperf3 TCP %s per run; %d interleaved rounds per condition (median, and lowest–highest); %d pings per round; uvxlan: both nodes' dataplanes in this process (GOMAXPROCS %d), uvxlan-proc: each in a process of its own, as weftd runs; uvxlan-fast: the same with the fast path (Config.FastPath); kernel-to-fast and the like: one kernel VXLAN node, one uvxlan node, traffic from the first named; dataplanes at nice %d, everything else at 0",
		time.Now().UTC().Format("2006-01-02 15:04 UTC"), host, cpus, kernelRelease(), o.dur, o.rounds, o.pings, runtime.GOMAXPROCS(0), o.nice)
}

func kernelRelease() string {
	b, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return "Linux " + strings.TrimSpace(string(b))
}

func (r *report) write(w io.Writer) {
	fmt.Fprintf(w, "%s\n", r.header)
	for _, c := range r.conds {
		c.write(w)
	}
	if r.idle > 0 {
		fmt.Fprintf(w, "\nIdle: two uvxlan nodes carrying no traffic used %.2f %% of a core together.\n", 100*r.idle)
	}
	if r.breakdown != nil {
		fmt.Fprintln(w)
		r.breakdown.write(w)
	}
}

func (c condition) write(w io.Writer) {
	what := "quiet: nothing else started by the benchmark"
	if c.load == "busy" {
		what = "busy: one core kept busy by a child process of the benchmark"
	}
	fmt.Fprintf(w, "\n### %s (load average at the end %s)\n\n", what, c.loadavg)
	fmt.Fprintln(w, "| mode | 1 stream Gb/s | 4 streams Gb/s | p50 RTT µs | p99 RTT µs | busy cores | dataplane cores | Gb/s per busy core | Gb/s per dataplane core |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|")
	for _, m := range c.modes {
		col := func(f func(sample) float64, prec int) string {
			var v []float64
			for _, s := range m.samples {
				v = append(v, f(s))
			}
			med, lo, hi := spread(v)
			if math.IsNaN(med) {
				return "–"
			}
			return fmt.Sprintf("%.*f (%.*f–%.*f)", prec, med, prec, lo, prec, hi)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", m.mode,
			col(func(s sample) float64 { return s.gbps1 }, 2), col(func(s sample) float64 { return s.gbps4 }, 2),
			col(func(s sample) float64 { return s.p50 }, 0), col(func(s sample) float64 { return s.p99 }, 0),
			col(func(s sample) float64 { return s.busy }, 2), col(func(s sample) float64 { return s.proc }, 2),
			col(func(s sample) float64 { return s.gbps1 / math.Max(s.busy, 0.01) }, 2),
			col(func(s sample) float64 {
				if fastMode(m.mode) { // its dataplane is not in the processes
					return math.NaN()
				}
				return s.gbps1 / s.proc
			}, 2))
	}
	k := c.mode("kernel")
	if k == nil {
		return
	}
	fmt.Fprintln(w)
	for _, m := range c.modes {
		if !userMode(m.mode) {
			continue
		}
		ratio := func(f func(sample) float64) float64 { return m.median(f) / k.median(f) }
		perBusy := func(s sample) float64 { return s.gbps1 / math.Max(s.busy, 0.01) }
		r1, r4 := 100*ratio(func(s sample) float64 { return s.gbps1 }), 100*ratio(func(s sample) float64 { return s.gbps4 })
		r50, r99 := ratio(func(s sample) float64 { return s.p50 }), ratio(func(s sample) float64 { return s.p99 })
		fmt.Fprintf(w, "- %s/kernel: 1 stream %.0f %%, 4 streams %.0f %%, p50 RTT ×%.1f, p99 RTT ×%.1f; ", m.mode, r1, r4, r50, r99)
		verdicts := benchreport.Verdicts(goals(m.mode), map[string]float64{
			m.mode + goal1: r1, m.mode + goal4: r4, m.mode + goalP50: r50})
		if fastMode(m.mode) {
			// Its packets are handled in softirq, as the kernel's VXLAN
			// handles them, and cannot be told apart from the rest either.
			fmt.Fprintf(w, "%.1f Gb/s per busy core of the whole machine against the kernel's %.1f (its dataplane runs in the kernel's softirq, like the kernel's VXLAN; the node processes used %.3f cores)",
				m.median(perBusy), k.median(perBusy), m.median(func(s sample) float64 { return s.proc }))
			if f := m.fast; f.tx > 0 && f.rx > 0 {
				fmt.Fprintf(w, "; the fast path carried %.2f %% of the frames sent and %.2f %% of those received",
					100*float64(f.fastTx)/float64(f.tx), 100*float64(f.fastRx)/float64(f.rx))
			}
			fmt.Fprintln(w)
		} else {
			fmt.Fprintf(w, "%.1f Gb/s per dataplane core (the kernel moves %.1f Gb/s per busy core of the whole machine)\n",
				m.median(func(s sample) float64 { return s.gbps1 / s.proc }), k.median(perBusy))
		}
		for _, v := range verdicts {
			fmt.Fprintf(w, "  - %s\n", v)
		}
		if len(m.drops) > 0 {
			fmt.Fprintf(w, "- %s drops: %v\n", m.mode, m.drops)
		}
	}
}

// The figures issue 32 sets goals for, against the kernel's VXLAN, after
// the mode's name.
const (
	goal1   = ": 1 stream, % of the kernel's"
	goal4   = ": 4 streams, % of the kernel's"
	goalP50 = ": p50 RTT, × the kernel's"
)

// goals are issue 32's goals for mode: none for a mode not run as weftd
// runs it (both nodes in one process) or with a kernel VXLAN node.
func goals(mode string) []benchreport.Goal {
	switch mode {
	case "uvxlan-fast":
		return []benchreport.Goal{{Name: mode + goal1, Bound: 100, Unit: "%"},
			{Name: mode + goal4, Bound: 100, Unit: "%"}, {Name: mode + goalP50, AtMost: true, Bound: 1, Unit: "×"}}
	case "uvxlan-proc": // the userspace path, per process as weftd runs it
		return []benchreport.Goal{{Name: mode + goal1, Bound: 55, Unit: "%"}, {Name: mode + goalP50, AtMost: true, Bound: 2, Unit: "×"}}
	}
	return nil
}

// fastMode says whether mode runs uvxlan's fast path.
func fastMode(mode string) bool {
	return mode == "uvxlan-fast" || mode == "kernel-to-fast" || mode == "fast-to-kernel"
}

// userMode says whether mode runs uvxlan on at least one node.
func userMode(mode string) bool {
	switch mode {
	case "kernel-to-fast", "kernel-to-proc", "fast-to-kernel", "proc-to-kernel":
		return true
	}
	return strings.HasPrefix(mode, "uvxlan")
}

func (c condition) mode(name string) *modeResult {
	for _, m := range c.modes {
		if m.mode == name {
			return m
		}
	}
	return nil
}

func (m *modeResult) median(f func(sample) float64) float64 {
	var v []float64
	for _, s := range m.samples {
		v = append(v, f(s))
	}
	med, _, _ := spread(v)
	return med
}

// Markers in README.md between which -readme writes the report.
const (
	beginMarker = "<!-- bench/dataplane report: begin (written by the benchmark; do not edit) -->"
	endMarker   = "<!-- bench/dataplane report: end -->"
)

// updateReadme replaces what lies between the markers of path with the
// report and the command that made it.
func (r *report) updateReadme(path string) error {
	old, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	i, j := bytes.Index(old, []byte(beginMarker)), bytes.Index(old, []byte(endMarker))
	if i < 0 || j < i {
		return fmt.Errorf("%s has no report markers", path)
	}
	var b bytes.Buffer
	b.Write(old[:i+len(beginMarker)])
	root, err := benchreport.Root()
	if err != nil {
		return err
	}
	st := benchreport.NewStamp(root, "dataplane", "go run ./bench/dataplane "+strings.Join(os.Args[1:], " "),
		"backend/vxlan", "backend/kernel", "backend/uvxlan")
	stamp, err := st.Markdown(root)
	if err != nil {
		return err
	}
	fmt.Fprintf(&b, "\n\n%s\nMade by `%s`:\n\n", stamp, st.Command)
	r.write(&b)
	b.WriteString("\n")
	b.Write(old[j:])
	return os.WriteFile(path, b.Bytes(), 0o644)
}
