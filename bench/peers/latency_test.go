package peers

import (
	"context"
	"fmt"
	"github.com/weft-net/weft/internal/testkit/benchreport"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/weft-net/weft/test/e2e"
)

// BenchmarkLeaseRoute measures how soon a node programs the route to a
// node that just joined: a new lease (etcd) or Node (Kubernetes, see
// kubeLatency) put one at a time, each timed from the put to the kernel's
// route notification in the daemon's namespace. It does so at 100 and at
// 5,000 peers, for this tree's weftd and, in the same rounds, interleaved
// (the order alternating from round to round), the flanneld of
// WEFT_BENCH_FLANNELD and the earlier weftd of WEFT_BENCH_BASE_WEFTD. It
// prints each round with the load average, the medians and spread of the
// rounds' p50 and p99, and a verdict for every goal, met or not. Kubernetes
// mode runs when the kube-apiserver of test/kube/build.sh is there
// (kubetest.BinDir), else its verdicts say it was not measured.
// WEFT_BENCH_REPORT writes the LeaseRoute section of the report.
func BenchmarkLeaseRoute(b *testing.B) {
	bins := benchDaemons()
	modes := []latMode{etcdLatency{}}
	kubeNote := ""
	if km, err := newKubeLatency(b); err == nil {
		modes = append(modes, km)
	} else {
		kubeNote = err.Error()
		fmt.Printf("Kubernetes mode not run: %v\n", err)
	}
	sizes := latencySizes()
	var cells []*latCell
	for _, m := range modes {
		for _, n := range sizes {
			for _, d := range bins {
				if m.runs(d) {
					cells = append(cells, &latCell{mode: m.name(), peers: n, d: d})
				}
			}
		}
	}
	for i := 0; b.Loop(); i++ {
		for _, m := range modes {
			for _, n := range sizes {
				order := slices.Clone(bins)
				if i%2 == 1 { // alternate which goes first
					slices.Reverse(order)
				}
				for _, d := range order {
					if !m.runs(d) {
						continue
					}
					load := benchreport.LoadAvg("/")
					lat := m.measure(b, d, n, latencyProbes)
					c := findCell(cells, m.name(), n, d)
					c.rounds = append(c.rounds, latRound{round: i + 1, load: load, lat: lat})
					fmt.Printf("round %d %s %d peers %s: %s load %s\n", i+1, m.name(), n, d.label, summary(lat), load)
				}
			}
		}
	}
	report(b, latencySection(bins, modes, sizes, cells, kubeNote))
}

// latencyProbes is how many new leases (or Nodes) each daemon is timed on
// per round.
const latencyProbes = 200

// latencySizes are the peer counts measured: 100 and 5,000, or the list in
// WEFT_BENCH_PEERS (comma-separated), to look at one of them alone.
func latencySizes() []int {
	s := os.Getenv("WEFT_BENCH_PEERS")
	if s == "" {
		return []int{100, peers}
	}
	var out []int
	for _, f := range strings.Split(s, ",") {
		if n, err := strconv.Atoi(strings.TrimSpace(f)); err == nil && n > 0 {
			out = append(out, n)
		}
	}
	return out
}

// benchDaemons are this tree's weftd and those named in the environment.
func benchDaemons() []*daemon {
	bins := []*daemon{{label: "weftd (this tree)"}}
	if base := os.Getenv("WEFT_BENCH_BASE_WEFTD"); base != "" {
		bins = append(bins, &daemon{label: "weftd " + base, path: base})
	}
	if fl := os.Getenv("WEFT_BENCH_FLANNELD"); fl != "" {
		bins = append(bins, &daemon{label: "flanneld", path: fl, flanneld: true})
	}
	return bins
}

// latMode is a datastore the daemons lease from.
type latMode interface {
	name() string
	runs(d *daemon) bool
	// measure starts d on a fresh node with peers peers and returns, sorted,
	// how long each of probes new peers took to become a route.
	measure(b *testing.B, d *daemon, peers, probes int) []time.Duration
}

// latRound is one daemon's probes in one round.
type latRound struct {
	round int
	load  string
	lat   []time.Duration // sorted
}

func (r latRound) p50() time.Duration { return r.lat[len(r.lat)/2] }
func (r latRound) p99() time.Duration { return r.lat[len(r.lat)*99/100] }

// latCell is one daemon's rounds in one mode at one size.
type latCell struct {
	mode   string
	peers  int
	d      *daemon
	rounds []latRound
}

func findCell(cells []*latCell, mode string, n int, d *daemon) *latCell {
	for _, c := range cells {
		if c.mode == mode && c.peers == n && c.d == d {
			return c
		}
	}
	panic("no cell")
}

// stat is the median, lowest and highest of f over c's rounds, in ms.
func (c *latCell) stat(f func(latRound) time.Duration) (med, lo, hi float64) {
	var v []float64
	for _, r := range c.rounds {
		v = append(v, ms(f(r)))
	}
	med, lo, hi, _ = benchreport.Spread(v)
	return med, lo, hi
}

func (c *latCell) cell(f func(latRound) time.Duration) string {
	if c == nil || len(c.rounds) == 0 {
		return "–"
	}
	m, lo, hi := c.stat(f)
	if len(c.rounds) == 1 {
		return fmt.Sprintf("%.1f", m)
	}
	return fmt.Sprintf("%.1f (%.1f–%.1f)", m, lo, hi)
}

// pooled is the quantile q of every probe of every round.
func (c *latCell) pooled(q float64) time.Duration {
	var all []time.Duration
	for _, r := range c.rounds {
		all = append(all, r.lat...)
	}
	slices.Sort(all)
	return all[int(q*float64(len(all)))]
}

func summary(lat []time.Duration) string {
	return fmt.Sprintf("p50=%s p99=%s max=%s", lat[len(lat)/2].Round(time.Microsecond),
		lat[len(lat)*99/100].Round(time.Microsecond), lat[len(lat)-1].Round(time.Microsecond))
}

// etcdLatency leases from a fresh etcd holding the peers' leases (vxlan, as
// flanneld writes them).
type etcdLatency struct{}

func (etcdLatency) name() string        { return "etcd" }
func (etcdLatency) runs(d *daemon) bool { return true }

func (etcdLatency) measure(b *testing.B, d *daemon, n, probes int) []time.Duration {
	opts := e2e.Options{Nodes: 0, Config: config}
	if !d.flanneld {
		opts.Weftd = d.path
	}
	c := e2e.NewCluster(b, opts)
	d.use(c)
	defer func() {
		for _, n := range c.Nodes {
			n.Stop()
		}
		c.Client.Close()
		c.Etcd.Close()
	}()
	ctx := context.Background()
	putLeases(b, c.Client, n)
	node := c.AddNode("n1")
	waitRoutes(b, node, d.device(), n)
	d.waitReady(b, node)
	d.readVersion(node)
	return probeLatency(b, node, probes, func(i int) netip.Prefix {
		k, v := fakeLease(4*peers + i)
		want, _ := fakePeer(4*peers + i)
		if _, err := c.Client.Put(ctx, k, v); err != nil {
			b.Fatal(err)
		}
		return want
	})
}

// putLeases writes the leases of peers 0..n-1, many to a transaction.
func putLeases(b *testing.B, cl *clientv3.Client, n int) {
	const perTxn = 128 // etcd's default --max-txn-ops
	for i := 0; i < n; i += perTxn {
		var ops []clientv3.Op
		for j := i; j < min(i+perTxn, n); j++ {
			k, v := fakeLease(j)
			ops = append(ops, clientv3.OpPut(k, v))
		}
		if _, err := cl.Txn(context.Background()).Then(ops...).Commit(); err != nil {
			b.Fatal(err)
		}
	}
}

// waitRoutes waits until dev on node has n routes.
func waitRoutes(b *testing.B, node *e2e.Node, dev string, n int) {
	for deadline := time.Now().Add(3 * time.Minute); countRoutes(b, node.Handle, dev) < n; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(node.LogFile)
			b.Fatalf("only %d of %d routes on %s after 3 minutes:\n%s", countRoutes(b, node.Handle, dev), n, dev, tail(string(log), 30))
		}
	}
}

func tail(s string, n int) string {
	ls := strings.Split(s, "\n")
	return strings.Join(ls[max(0, len(ls)-n):], "\n")
}

// latencySection is the report: a table per mode, rows by size and
// figure, a column per daemon, then the verdicts.
func latencySection(bins []*daemon, modes []latMode, sizes []int, cells []*latCell, kubeNote string) section {
	var body []string
	for _, m := range modes {
		var t strings.Builder
		fmt.Fprintf(&t, "%s mode:\n\n| peers | figure |", m.name())
		var cols []*daemon
		for _, d := range bins {
			if m.runs(d) {
				cols = append(cols, d)
				fmt.Fprintf(&t, " %s |", d.name())
			}
		}
		fmt.Fprintf(&t, "\n|---|---|%s", strings.Repeat("---|", len(cols)))
		for _, n := range sizes {
			for _, f := range []struct {
				name string
				get  func(latRound) time.Duration
			}{{"p50, ms", latRound.p50}, {"p99, ms", latRound.p99}} {
				fmt.Fprintf(&t, "\n| %s | %s |", thousands(n), f.name)
				for _, d := range cols {
					fmt.Fprintf(&t, " %s |", findCell(cells, m.name(), n, d).cell(f.get))
				}
			}
			fmt.Fprintf(&t, "\n| %s | p99 of every round's probes together, ms |", thousands(n))
			for _, d := range cols {
				c := findCell(cells, m.name(), n, d)
				if len(c.rounds) == 0 {
					fmt.Fprint(&t, " – |")
					continue
				}
				fmt.Fprintf(&t, " %.1f |", ms(c.pooled(0.99)))
			}
		}
		body = append(body, t.String())
	}
	var rounds strings.Builder
	fmt.Fprintf(&rounds, "Each round (load average over 1, 5 and 15 minutes before the daemon starts):\n\n| round | mode | peers | daemon | load | p50 ms | p99 ms | slowest ms |\n|---|---|---|---|---|---|---|---|")
	var all []struct {
		c *latCell
		r latRound
	}
	for _, c := range cells {
		for _, r := range c.rounds {
			all = append(all, struct {
				c *latCell
				r latRound
			}{c, r})
		}
	}
	slices.SortStableFunc(all, func(a, b struct {
		c *latCell
		r latRound
	}) int {
		return a.r.round - b.r.round
	})
	for _, x := range all {
		fmt.Fprintf(&rounds, "\n| %d | %s | %s | %s | %s | %.1f | %.1f | %.1f |", x.r.round, x.c.mode, thousands(x.c.peers),
			x.c.d.name(), x.r.load, ms(x.r.p50()), ms(x.r.p99()), ms(x.r.lat[len(x.r.lat)-1]))
	}
	body = append(body, rounds.String())
	return section{
		name: "LeaseRoute",
		intro: []string{fmt.Sprintf("New lease → route: in each round and mode, every daemon starts on a fresh node with the peers already leased (etcd: a fresh etcd in the benchmark's process; Kubernetes: Nodes in a real kube-apiserver), "+
			"and once all their routes are on its VXLAN device (weftd `weft.1`, flanneld `flannel.1`) %d new peers are added one at a time (a lease put in etcd, a Node created), each timed from the put to the kernel's notification of its route in the daemon's namespace. "+
			"p50 and p99 are each round's; the tables give their median over the rounds and the spread (lowest–highest), and the p99 of all rounds' probes taken together, which one slow moment of the machine moves less. "+
			"The verdicts compare the medians of the rounds' p50 and p99.", latencyProbes)},
		raw:  body,
		tail: latencyVerdicts(bins, modes, sizes, cells, kubeNote),
	}
}

// latencyVerdicts says, for every goal of issue 40 on lease → route, met or
// not: weftd's p50 and p99 (medians over the rounds) at most flanneld's, at
// each size and in each mode; the figure of each goal is weftd's over
// flanneld's, and a line before the verdicts gives both in ms.
func latencyVerdicts(bins []*daemon, modes []latMode, sizes []int, cells []*latCell, kubeNote string) []string {
	var fl *daemon
	for _, d := range bins {
		if d.flanneld {
			fl = d
		}
	}
	var goals []benchreport.Goal
	got := map[string]float64{}
	var out []string
	for _, name := range []string{"etcd", "kube"} {
		var m latMode
		for _, x := range modes {
			if x.name() == name {
				m = x
			}
		}
		for _, n := range sizes {
			for _, q := range []struct {
				name string
				get  func(latRound) time.Duration
			}{{"p50", latRound.p50}, {"p99", latRound.p99}} {
				g := benchreport.Goal{Name: fmt.Sprintf("lease → route %s at %s peers, %s mode, weftd over flanneld", q.name, thousands(n), name),
					AtMost: true, Bound: 1, Unit: "×"}
				goals = append(goals, g)
				switch {
				case m == nil:
					out = append(out, fmt.Sprintf("%s: Kubernetes mode did not run (%s)", g.Name, kubeNote))
				case fl == nil || !m.runs(fl):
					w, _, _ := findCell(cells, name, n, bins[0]).stat(q.get)
					out = append(out, fmt.Sprintf("%s: weftd %.1f ms, flanneld not run", g.Name, w))
				default:
					w, _, _ := findCell(cells, name, n, bins[0]).stat(q.get)
					f, _, _ := findCell(cells, name, n, fl).stat(q.get)
					out = append(out, fmt.Sprintf("%s: weftd %.1f ms, flanneld %.1f ms", g.Name, w, f))
					got[g.Name] = w / f
				}
			}
		}
	}
	for _, v := range benchreport.Verdicts(goals, got) {
		out = append(out, "**"+v+"**")
	}
	return out
}

// name is how the report names d: flanneld with its version once known.
func (d *daemon) name() string {
	if d.flanneld && d.version != "" {
		return "flanneld " + d.version
	}
	return d.label
}
