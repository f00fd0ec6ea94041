package cluster

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/weft-net/weft/internal/testkit/benchreport"
	"github.com/weft-net/weft/test/e2e"
)

// figure is one row of a path's table.
type figure struct {
	test, name string
	prec       int
	get        func(measurement) float64
	kind       string // "throughput" (higher is better), "latency" or "cpu" (lower), "" (no goal)
}

func cpuPerGb(m measurement) float64 {
	if m.gbps <= 0 {
		return math.NaN()
	}
	return (m.cpuSrv + m.cpuCli) / m.gbps
}

func srvCPU(m measurement) float64  { return m.cpuSrv }
func cliCPU(m measurement) float64  { return m.cpuCli }
func gbps(m measurement) float64    { return m.gbps }
func retrans(m measurement) float64 { return m.retrans }

var figures = []figure{
	{"TCP 1 stream", "Gb/s", 2, gbps, "throughput"},
	{"TCP 1 stream", "retransmissions/s", 0, retrans, ""},
	{"TCP 1 stream", "CPU s/s, server node", 2, srvCPU, ""},
	{"TCP 1 stream", "CPU s/s, client node", 2, cliCPU, ""},
	{"TCP 1 stream", "CPU-s per Gb (both nodes)", 3, cpuPerGb, "cpu"},
	{"TCP 8 streams", "Gb/s", 2, gbps, "throughput"},
	{"TCP 8 streams", "retransmissions/s", 0, retrans, ""},
	{"TCP 8 streams", "CPU s/s, server node", 2, srvCPU, ""},
	{"TCP 8 streams", "CPU s/s, client node", 2, cliCPU, ""},
	{"TCP 8 streams", "CPU-s per Gb (both nodes)", 3, cpuPerGb, "cpu"},
	{"UDP", "Gb/s received", 2, gbps, "throughput"},
	{"UDP", "loss %", 1, func(m measurement) float64 { return m.lossPct }, ""},
	{"UDP", "CPU s/s, server node", 2, srvCPU, ""},
	{"UDP", "CPU s/s, client node", 2, cliCPU, ""},
	{"UDP", "CPU-s per Gb received (both nodes)", 3, cpuPerGb, "cpu"},
	{"TCP RR", "p50 µs", 0, func(m measurement) float64 { return m.p50 }, "latency"},
	{"TCP RR", "p99 µs", 0, func(m measurement) float64 { return m.p99 }, "latency"},
	{"TCP RR", "transactions/s", 0, func(m measurement) float64 { return m.rate }, ""},
	{"TCP CRR", "connections/s", 0, func(m measurement) float64 { return m.rate }, "throughput"},
	{"TCP CRR", "p50 µs per connection", 0, func(m measurement) float64 { return m.p50 }, ""},
	{"TCP CRR", "CPU s/s, both nodes", 2, func(m measurement) float64 { return m.cpuSrv + m.cpuCli }, ""},
}

func (c *column) values(path string, f figure) []float64 {
	var v []float64
	for _, m := range c.got[path+"/"+f.test] {
		v = append(v, f.get(m))
	}
	return v
}

func (c *column) median(path string, f figure) float64 {
	m, _, _, ok := benchreport.Spread(c.values(path, f))
	if !ok {
		return math.NaN()
	}
	return m
}

func restMedian(c *column, get func(atRest) float64) float64 {
	var v []float64
	for _, r := range c.rest {
		v = append(v, get(r))
	}
	m, _, _, ok := benchreport.Spread(v)
	if !ok {
		return math.NaN()
	}
	return m
}

// comparisons are the goals of issue 40 between columns of these labels
// (WEFT_BENCH_CLUSTERS's): weft vxlan against Flannel vxlan on every
// throughput, latency and CPU-per-Gb row; uvxlan (fast path) and weft's
// kernel WireGuard against Flannel's on every throughput row.
var comparisons = []struct {
	a, b  string
	kinds []string
}{
	{"weft-vxlan", "flannel-vxlan", []string{"throughput", "latency", "cpu"}},
	{"weft-uvxlan", "flannel-vxlan", []string{"throughput"}},
	{"weft-wireguard", "flannel-wireguard", []string{"throughput"}},
}

// goals names every goal with its ratio (missing when a column is absent).
func goals(cols []*column) ([]benchreport.Goal, map[string]float64) {
	by := map[string]*column{}
	for _, c := range cols {
		by[c.label] = c
	}
	var gs []benchreport.Goal
	got := map[string]float64{}
	for _, cmp := range comparisons {
		a, b := by[cmp.a], by[cmp.b]
		for _, p := range paths {
			for _, f := range figures {
				if !slices.Contains(cmp.kinds, f.kind) {
					continue
				}
				g := benchreport.Goal{Name: fmt.Sprintf("%s / %s, %s %s %s", cmp.a, cmp.b, p, f.test, f.name),
					AtMost: f.kind != "throughput", Bound: 1, Unit: "×"}
				gs = append(gs, g)
				if a != nil && b != nil {
					got[g.Name] = a.median(p, f) / b.median(p, f)
				}
			}
		}
	}
	for _, r := range []struct {
		name string
		get  func(atRest) float64
	}{{"CNI pod CPU at rest", func(r atRest) float64 { return r.cpu }}, {"CNI pod memory at rest", func(r atRest) float64 { return r.mem }}} {
		g := benchreport.Goal{Name: "weft-vxlan (NetworkPolicy on) / flannel-vxlan, " + r.name, AtMost: true, Bound: 1, Unit: "×"}
		gs = append(gs, g)
		if a, b := by["weft-vxlan"], by["flannel-vxlan"]; a != nil && b != nil {
			got[g.Name] = restMedian(a, r.get) / restMedian(b, r.get)
		}
	}
	return gs, got
}

func write(w io.Writer, b *testing.B, cols []*column, secs, restSecs int) {
	host, _ := os.Hostname()
	rel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	root := e2e.ModuleRootDir(b)
	st := benchreport.NewStamp(root, sectionName(), benchreport.Command("./bench/cluster"),
		"cmd/weftd", "cmd/weft", "internal/daemon", "backend", "policy", "flow", "kube-manifests", "bench/cluster/rr")
	stamp, err := st.Markdown(root)
	if err != nil {
		b.Fatal(err)
	}
	fmt.Fprintf(w, "%s\nMade on %s (%d CPUs, Linux %s), shared with other work (the load averages below say how much), by\n\n    %s\n\n",
		stamp, host, runtime.NumCPU(), strings.TrimSpace(string(rel)), st.Command)
	n := 0
	for _, c := range cols {
		for _, ms := range c.got {
			n = max(n, len(ms))
		}
	}
	fmt.Fprintf(w, "Each client ran %d s (iperf3 `-t %d -O 1`, so %d s of traffic; the published method runs `-t 60`: on this shared 2-core machine the rounds are shorter), the columns taking turns test by test, the order rotating from round to round. "+
		"Medians of %d rounds (lowest–highest). CPU s/s: CPU-seconds per second of the node's whole cgroup (kubelet, containerd, kube-proxy, the CNI, the pods; the bare column's tools are put in the same cgroups), "+
		"over %d s from %s after the client's start, while the traffic flows.\n\n",
		clientSeconds(secs), clientSeconds(secs), clientSeconds(secs)+1, n, secs, warmup)
	for _, p := range paths {
		var cs []*column
		note := ""
		for _, c := range cols {
			if _, ok := c.addrs[p]; ok {
				cs = append(cs, c)
				if c.bare {
					note = " (the bare column: node namespace → node namespace)"
				}
			}
		}
		fmt.Fprintf(w, "**%s**%s\n\n| test | figure |", p, note)
		for _, c := range cs {
			fmt.Fprintf(w, " %s |", c.label)
		}
		fmt.Fprintf(w, "\n|---|---|%s\n", strings.Repeat("---|", len(cs)))
		for _, f := range figures {
			fmt.Fprintf(w, "| %s | %s |", f.test, f.name)
			for _, c := range cs {
				fmt.Fprintf(w, " %s |", benchreport.Cell(c.values(p, f), f.prec))
			}
			fmt.Fprintln(w)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "**At rest** (the CNI's DaemonSet pod's cgroup on each of the two nodes, mean of the two; CPU over %d s with no bench traffic in any cluster; memory: working set, usage less inactive file pages, as `kubectl top` counts it)\n\n| figure |", restSecs)
	for _, c := range cols[1:] {
		fmt.Fprintf(w, " %s (%s) |", c.label, c.cniNS)
	}
	fmt.Fprintf(w, "\n|---|%s\n| CPU, millicores |", strings.Repeat("---|", len(cols)-1))
	for _, c := range cols[1:] {
		fmt.Fprintf(w, " %s |", restCell(c, func(r atRest) float64 { return r.cpu }, 1))
	}
	fmt.Fprint(w, "\n| memory, MiB |")
	for _, c := range cols[1:] {
		fmt.Fprintf(w, " %s |", restCell(c, func(r atRest) float64 { return r.mem }, 1))
	}
	fmt.Fprint(w, "\n| of it, shared memory (the CNI plugin binary the init container copied onto the node's tmpfs `/opt/cni/bin`), MiB |")
	for _, c := range cols[1:] {
		fmt.Fprintf(w, " %s |", restCell(c, func(r atRest) float64 { return r.shmem }, 1))
	}
	fmt.Fprintf(w, "\n\nLoad average (1, 5, 15 min) at the start of each round's TCP 1 stream pod→pod test, by column: %s.\n\n", loads(cols))
	for _, c := range cols {
		if len(c.failed) > 0 {
			fmt.Fprintf(w, "Failed twice in a round, left out of the medians: %s: %s.\n\n", c.label, strings.Join(c.failed, "; "))
		}
	}
	gs, got := goals(cols)
	for _, v := range benchreport.Verdicts(gs, got) {
		fmt.Fprintf(w, "- **%s**\n", v)
	}
}

func restCell(c *column, get func(atRest) float64, prec int) string {
	var v []float64
	for _, r := range c.rest {
		v = append(v, get(r))
	}
	return benchreport.Cell(v, prec)
}

func loads(cols []*column) string {
	var parts []string
	for _, c := range cols {
		var l []string
		for _, m := range c.got[toPod+"/"+tests[0].name] {
			l = append(l, fmt.Sprintf("round %d %s", m.round, m.load))
		}
		parts = append(parts, fmt.Sprintf("%s: %s", c.label, strings.Join(l, "; ")))
	}
	return strings.Join(parts, " — ")
}

// sectionName is the report section a run writes: WEFT_BENCH_SECTION
// (runs of different columns keep their own sections), else "Cluster".
func sectionName() string {
	if s := os.Getenv("WEFT_BENCH_SECTION"); s != "" {
		return s
	}
	return "Cluster"
}

// report prints the report and, when WEFT_BENCH_REPORT names a markdown
// file, writes it between its section's markers there.
func report(b *testing.B, cols []*column, secs, restSecs int) {
	var buf bytes.Buffer
	write(&buf, b, cols, secs, restSecs)
	fmt.Printf("\n%s\n", buf.String())
	path := benchreport.Path(e2e.ModuleRootDir(b))
	if path == "" {
		return
	}
	if err := benchreport.WriteSection(path, "cluster", sectionName(), buf.Bytes()); err != nil {
		b.Error(err)
		return
	}
	fmt.Printf("report written to %s\n", path)
}
