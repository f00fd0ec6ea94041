package fleet

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/weft-net/weft/internal/testkit/benchreport"
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// TestFleetSmall runs the fleet harness with 20 nodes: every node's watch
// sees every added and removed lease.
func TestFleetSmall(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e := startEtcd(t)
	put(ctx, t, e.endpoints)
	f := startFleet(ctx, t, e.endpoints, 20)
	for i := range 3 {
		add, del := f.addRemove(ctx, t, e.endpoints, 100000+i)
		for _, p := range []*probe{add, del} {
			for n, d := range p.lat {
				if d <= 0 {
					t.Errorf("%v of %s: node %d has no latency recorded", p.typ, p.sn, n)
				}
			}
		}
	}
}

func put(ctx context.Context, tb testing.TB, endpoints []string) {
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		tb.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Put(ctx, prefix+"/config", config); err != nil {
		tb.Fatal(err)
	}
}

// BenchmarkFleet brings up the fleet, measures what it costs etcd at rest,
// then adds and removes leases one by one and reports how long each took to
// reach every node.
func BenchmarkFleet(b *testing.B) {
	n, probes := envInt("WEFT_FLEET_NODES", 1000), envInt("WEFT_FLEET_PROBES", 20)
	for range b.N {
		rep := &report{name: "etcd", command: "go test -run '^$' -bench 'Fleet$' -benchtime 1x -timeout 30m ./bench/fleet", measures: []string{"subnet/etcd"}}
		ctx, cancel := context.WithCancel(context.Background())
		e := startEtcd(b)
		put(ctx, b, e.endpoints)
		cpu0, req0, t0 := e.cpu(b), e.requests(b), time.Now()
		f := startFleet(ctx, b, e.endpoints, n)
		up := time.Since(t0)
		cpu1, req1 := e.cpu(b), e.requests(b)
		rep.printf("fleet: %d nodes up (acquire + watch + first batch) in %s; etcd used %s CPU and %.0f requests for it; load %s\n",
			n, up.Round(time.Millisecond), cpu1-cpu0, req1-req0, benchreport.LoadAvg("/"))
		const rest = 10 * time.Second
		time.Sleep(rest) // a window of idle time to measure, not a synchronisation
		cpu2, req2 := e.cpu(b), e.requests(b)
		rep.printf("fleet at rest: etcd CPU %.1f%% of a core, %.1f requests/s; load %s\n",
			100*(cpu2-cpu1).Seconds()/rest.Seconds(), (req2-req1)/rest.Seconds(), benchreport.LoadAvg("/"))
		var adds, dels, worstAdd, worstDel []time.Duration
		tp := time.Now()
		for i := range probes {
			add, del := f.addRemove(ctx, b, e.endpoints, 200000+i)
			adds, dels = append(adds, add.lat...), append(dels, del.lat...)
			worstAdd, worstDel = append(worstAdd, slices.Max(add.lat)), append(worstDel, slices.Max(del.lat))
		}
		el := time.Since(tp)
		cpu3, req3 := e.cpu(b), e.requests(b)
		rep.printf("new lease -> every node's watch (%d x %d): %s; slowest node per lease: %s\n", probes, n, quantiles(adds), quantiles(worstAdd))
		rep.printf("removed lease -> every node's watch (%d x %d): %s; slowest node per lease: %s\n", probes, n, quantiles(dels), quantiles(worstDel))
		rep.printf("during the changes: etcd CPU %.1f%% of a core, %.1f requests/s over %s; load %s\n",
			100*(cpu3-cpu2).Seconds()/el.Seconds(), (req3-req2)/el.Seconds(), el.Round(time.Millisecond), benchreport.LoadAvg("/"))
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		rep.printf("etcd: db size %s, host process RSS %.0fMB (3 members and their proxies); fleet process heap %.0fMB (%.1fKB per node: client, registry, watch)\n",
			dbSize(ctx, b, e.endpoints), e.rss(b), float64(ms.HeapInuse)/(1<<20), float64(ms.HeapInuse)/1024/float64(n))
		rep.verdicts(adds)
		b.ReportMetric(float64(quantile(adds, 0.5).Microseconds())/1000, "add-p50-ms")
		b.ReportMetric(float64(quantile(adds, 0.99).Microseconds())/1000, "add-p99-ms")
		rep.write(b)
		cancel()
	}
}

func dbSize(ctx context.Context, tb testing.TB, endpoints []string) string {
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		tb.Fatal(err)
	}
	defer c.Close()
	var out []string
	for _, ep := range endpoints {
		st, err := c.Status(ctx, ep)
		if err != nil {
			tb.Fatal(err)
		}
		out = append(out, fmt.Sprintf("%.1fMB (in use %.1fMB)", float64(st.DbSize)/(1<<20), float64(st.DbSizeInUse)/(1<<20)))
	}
	return strings.Join(out, ", ")
}

// fleetGoals are issue 15's goals for a change reaching every node.
var fleetGoals = []benchreport.Goal{
	{Name: "a change to every node, p50", AtMost: true, Bound: 200, Unit: "ms"},
	{Name: "a change to every node, p99", AtMost: true, Bound: 1000, Unit: "ms"},
}

// report is what one run of a fleet benchmark prints; with
// WEFT_BENCH_REPORT naming a markdown file (bench/fleet/README.md), it is
// written there, with its stamp, between the markers of its section.
type report struct {
	name, command string
	measures      []string
	text          strings.Builder
}

func (r *report) printf(format string, a ...any) {
	fmt.Printf(format, a...)
	fmt.Fprintf(&r.text, format, a...)
}

// verdicts prints a verdict for each of fleetGoals from the latencies of
// new leases or Nodes to every node.
func (r *report) verdicts(adds []time.Duration) {
	ms := func(q float64) float64 { return float64(quantile(adds, q).Microseconds()) / 1000 }
	for _, v := range benchreport.Verdicts(fleetGoals, map[string]float64{fleetGoals[0].Name: ms(0.5), fleetGoals[1].Name: ms(0.99)}) {
		r.printf("%s\n", v)
	}
}

func (r *report) write(b *testing.B) {
	root, err := benchreport.Root()
	if err != nil {
		b.Fatal(err)
	}
	path := benchreport.Path(root)
	if path == "" {
		return
	}
	var env []string // the sizes, when not the defaults
	for _, e := range slices.Sorted(slices.Values(os.Environ())) {
		if strings.HasPrefix(e, "WEFT_FLEET_") {
			env = append(env, e)
		}
	}
	command := strings.Join(append(env, r.command), " ")
	stamp, err := benchreport.NewStamp(root, r.name, command, r.measures...).Markdown(root)
	if err != nil {
		b.Fatal(err)
	}
	text := fmt.Sprintf("%s\nMade by `%s` (load: 1, 5 and 15 minute averages):\n\n```\n%s```\n", stamp, command, r.text.String())
	if err := benchreport.WriteSection(path, "fleet", r.name, []byte(text)); err != nil {
		b.Fatal(err)
	}
}

func quantile(d []time.Duration, q float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

func quantiles(d []time.Duration) string {
	return fmt.Sprintf("p50=%s p99=%s max=%s", quantile(d, 0.5).Round(time.Microsecond),
		quantile(d, 0.99).Round(time.Microsecond), quantile(d, 1).Round(time.Microsecond))
}
