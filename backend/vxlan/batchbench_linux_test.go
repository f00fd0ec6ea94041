package vxlan

import (
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/namespace"
	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/vtep"
)

// BenchmarkBatchWriter compares the netlink batch writer with one
// vishvananda/netlink request per entry (the same handle, the overlay's
// path when it has no batch writer) where a user would feel it:
//
//   - start: the first sync of 5,000 peers into a fresh namespace and
//     VXLAN device, as weftd's first sync at start (read the empty tables,
//     write 5,000 neighbours, FDB entries and routes);
//   - new peer: Apply of one new peer on top of those 5,000, 20 times, the
//     path of a new lease.
//
// Each round makes a fresh namespace per mode, in alternating order, and
// deletes it before the next. It prints every round (with the load
// average) and the medians with their spread:
//
//	sudo go test -v -run '^$' -bench BatchWriter -benchtime 1x ./backend/vxlan
//
// WEFT_BENCH_ROUNDS sets the number of rounds (default 9).
func BenchmarkBatchWriter(b *testing.B) {
	rounds := 9
	if v := os.Getenv("WEFT_BENCH_ROUNDS"); v != "" {
		if _, err := fmt.Sscan(v, &rounds); err != nil {
			b.Fatalf("WEFT_BENCH_ROUNDS: %v", err)
		}
	}
	nettest.RequireRoot(b)
	table := batchTable(0, 5000, 1)
	modes := []bool{false, true}
	name := map[bool]string{false: "per-request", true: "batched"}
	start := map[bool][]time.Duration{}
	startCPU := map[bool][]time.Duration{}
	apply := map[bool][]time.Duration{}
	for b.Loop() {
		for r := range rounds {
			order := modes
			if r%2 == 1 {
				order = []bool{true, false}
			}
			for _, batched := range order {
				load := loadAvg(b)
				s, cpu, a := batchRound(b, table, batched)
				start[batched] = append(start[batched], s)
				startCPU[batched] = append(startCPU[batched], cpu)
				apply[batched] = append(apply[batched], a)
				b.Logf("round %d %-11s start %7.1f ms (CPU %7.1f ms)  new peer p50 %6.3f ms  load %s", r+1, name[batched],
					ms(s), ms(cpu), ms(a), load)
			}
		}
	}
	for _, batched := range modes {
		b.Logf("%-11s start %s ms, CPU %s ms; new peer p50 %s ms (medians of %d rounds, lowest–highest)", name[batched],
			spread(start[batched]), spread(startCPU[batched]), spread(apply[batched]), len(start[batched]))
	}
	ratio := ms(median(start[false])) / ms(median(start[true]))
	b.Logf("start: per-request / batched = %.2f; saved %.1f ms", ratio, ms(median(start[false]))-ms(median(start[true])))
	b.ReportMetric(ms(median(start[false])), "start-per-request-ms")
	b.ReportMetric(ms(median(start[true])), "start-batched-ms")
	b.ReportMetric(ms(median(startCPU[false])), "start-cpu-per-request-ms")
	b.ReportMetric(ms(median(startCPU[true])), "start-cpu-batched-ms")
	b.ReportMetric(ms(median(apply[false])), "newpeer-per-request-ms")
	b.ReportMetric(ms(median(apply[true])), "newpeer-batched-ms")
}

// batchRound programs table into a fresh namespace and returns the time of
// that first sync, the process's CPU time during it (user and system), and
// the median time to apply one new peer after it.
func batchRound(b *testing.B, table vtep.Table, batched bool) (time.Duration, time.Duration, time.Duration) {
	ns, err := namespace.Create("bwbench")
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		if err := ns.Delete(); err != nil {
			b.Errorf("delete netns: %v", err)
		}
	}()
	s := newBatchSideIn(b, ns, batched)
	cpu0, t0 := cpuTime(b), time.Now()
	if _, err := s.o.Sync(table); err != nil {
		b.Fatal(err)
	}
	first, cpu := time.Since(t0), cpuTime(b)-cpu0
	var adds []time.Duration
	old := table
	for sn, peer := range batchTable(5000, 20, 1) {
		next := maps.Clone(old)
		next[sn] = peer
		t0 := time.Now()
		if _, err := s.o.Apply(old, next); err != nil {
			b.Fatal(err)
		}
		adds = append(adds, time.Since(t0))
		old = next
	}
	return first, cpu, median(adds)
}

func loadAvg(tb testing.TB) string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		tb.Fatal(err)
	}
	return strings.Join(strings.Fields(string(raw))[:3], "/")
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func spread(ds []time.Duration) string {
	return fmt.Sprintf("%.2f (%.2f–%.2f)", ms(median(ds)), ms(slices.Min(ds)), ms(slices.Max(ds)))
}
