package cluster

import (
	"math"
	"os"
	"strings"
	"testing"
)

// TestParseIperf3 reads iperf3 3.12's JSON (testdata: real runs on
// loopback) as the report does: the receiver's rate, UDP loss, TCP
// retransmissions per second.
func TestParseIperf3(t *testing.T) {
	for _, c := range []struct {
		file          string
		gbps, loss, r float64
	}{
		{"testdata/tcp.json", 1.9699, 0, 1 / 1.0},
		{"testdata/udp.json", 0.21946, 7.18, 0},
	} {
		out, err := os.ReadFile(c.file)
		if err != nil {
			t.Fatal(err)
		}
		var m measurement
		if err := tests[0].parse(out, &m); err != nil {
			t.Fatal(err)
		}
		if math.Abs(m.gbps-c.gbps) > 0.0001 || math.Abs(m.lossPct-c.loss) > 0.01 || math.Abs(m.retrans-c.r) > 0.05 {
			t.Errorf("%s: got %.5f Gb/s, loss %.2f %%, %.2f retransmissions/s; want %.5f, %.2f, %.2f",
				c.file, m.gbps, m.lossPct, m.retrans, c.gbps, c.loss, c.r)
		}
	}
}

// TestGoals checks that every goal gets a verdict, a ratio of the two
// columns' medians when both ran and "not measured" when one did not.
func TestGoals(t *testing.T) {
	col := func(label string, g float64) *column {
		c := &column{label: label, got: map[string][]measurement{}}
		for _, p := range paths {
			for _, ts := range tests {
				for r := 1; r <= 3; r++ {
					m := measurement{round: r, gbps: g * float64(r), p50: 100 / g, p99: 200 / g, rate: 1000 * g, cpuSrv: 0.5, cpuCli: 0.5}
					c.got[p+"/"+ts.name] = append(c.got[p+"/"+ts.name], m)
				}
			}
		}
		c.rest = []atRest{{cpu: 2 * g, mem: 10 * g}}
		return c
	}
	cols := []*column{{label: "bare underlay"}, col("weft-vxlan", 2), col("flannel-vxlan", 1)}
	gs, got := goals(cols)
	// per path: weft vxlan 4 throughput + 2 latency + 3 CPU-per-Gb rows,
	// uvxlan and WireGuard 4 throughput rows each; and the 2 at rest.
	if len(gs) != 2*(4+2+3)+2*2*4+2 {
		t.Errorf("%d comparisons, want 36", len(gs))
	}
	tcp := "weft-vxlan / flannel-vxlan, pod→pod TCP 1 stream Gb/s"
	if got[tcp] != 2 {
		t.Errorf("%s: %v, want 2 (medians 4 and 2)", tcp, got[tcp])
	}
	rr := "weft-vxlan / flannel-vxlan, pod→Service TCP RR p99 µs"
	if got[rr] != 0.5 {
		t.Errorf("%s: %v, want 0.5", rr, got[rr])
	}
	var met, unmeasured int
	for _, g := range gs {
		v := g.Verdict(got[g.Name])
		if _, ok := got[g.Name]; !ok {
			v = g.Verdict(math.NaN())
			unmeasured++
			if !strings.HasSuffix(v, "not measured") {
				t.Errorf("%s", v)
			}
		} else if strings.HasSuffix(v, ": met") {
			met++
		}
	}
	// Every weft-vxlan/flannel-vxlan comparison but the at-rest ones (2×
	// Flannel's CPU and memory) is met; uvxlan and WireGuard did not run.
	if met != 2*(4+2+3) || unmeasured != 2*2*4 {
		t.Errorf("met %d, not measured %d", met, unmeasured)
	}
}
