package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"regexp"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/google/pprof/profile"

	"github.com/weft-net/weft/backend/uvxlan"
)

// A category of the dataplane's CPU time. A profile sample belongs to the
// first category whose function appears on its stack, from the leaf up:
// a system call is charged to the call site that made it (its kernel time
// included, since the profiler's clock counts user and system time). A
// closure counts as the function it is declared in.
type category struct {
	name  string
	funcs []string // suffixes of fully qualified function names
}

var categories = []category{
	{"egress: TAP read (syscall, kernel copy out)", []string{"(*tapBatch).read"}},
	{"egress: UDP GSO send (syscall, kernel copy in, UDP/IP)", []string{"(*gatherSender).write", "(*sender).write", "(*sendBatch).write"}},
	{"egress: segmentation, headers, checksums", []string{"(*datapath).sendSegments", "(*segmenter).pack", "(*segmenter).flush", "(*datapath).sendRun", "(*tsoPlan).fixHeader", "planTSO", "segmentTCP", "(*datapath).egressOffloaded", "(*datapath).queue", "(*datapath).egress"}},
	{"ingress: recvmmsg (syscall, kernel copy out)", []string{"(*recvBatch).read"}},
	{"ingress: TAP write (syscall, kernel copy in, delivery to the pod)", []string{"(*datapath).writeTAP", "(*datapath).writeTAPv"}},
	{"ingress: GRO merge", []string{"(*coalescer).add", "(*coalescer).merge", "(*coalescer).emit", "(*coalescer).flush", "(*coalescer).single"}},
	{"ingress: decode, source and checksum checks", []string{"(*datapath).receive", "(*datapath).checkInner", "checkInnerFrame", "(*decoder).decode", "(*datapath).receiveSuper", "(*datapath).receiveBatch", "(*datapath).ingress"}},
	{"Go scheduler: parking and waking the packet loops", []string{"runtime.findRunnable", "runtime.schedule", "runtime.park_m", "runtime.netpoll", "runtime.mcall", "(*pollDesc).wait"}},
}

const otherCategory = "other (reconciler, garbage collector, the benchmark itself)"

// breakdown is where the CPU time of the dataplanes went, per 64 KB of
// payload moved.
type breakdown struct {
	gbps   float64
	moved  float64 // bytes
	cpu    map[string]time.Duration
	total  time.Duration
	frames map[string]uint64 // dataplane counters during the run
}

// profileBreakdown runs one 1-stream iperf3 over uvxlan with the CPU
// profiler on and charges the samples to categories.
func profileBreakdown(ctx context.Context, o options, log *slog.Logger) (*breakdown, error) {
	fmt.Fprintln(os.Stderr, "profiling uvxlan, 1 stream")
	t, err := build(ctx, "uvxlan", o.queues, log)
	if err != nil {
		return nil, err
	}
	defer t.close()
	if _, err := t.a.runNS().Run(pod("ping", "-c", "3", "-i", "0.2", "-W", "2", t.b.target().String())...); err != nil {
		return nil, err
	}
	before := t.frames()
	var prof bytes.Buffer
	if err := pprof.StartCPUProfile(&prof); err != nil {
		return nil, err
	}
	gbps, err := iperf(ctx, t, 1, o.dur)
	pprof.StopCPUProfile()
	if err != nil {
		return nil, err
	}
	bd := &breakdown{gbps: gbps, moved: gbps * 1e9 / 8 * o.dur.Seconds(), cpu: map[string]time.Duration{}, frames: t.frames()}
	for k, v := range before {
		bd.frames[k] -= v
	}
	if o.profile != "" {
		if err := os.WriteFile(o.profile, prof.Bytes(), 0o644); err != nil {
			return nil, err
		}
	}
	p, err := profile.Parse(&prof)
	if err != nil {
		return nil, fmt.Errorf("parse the cpu profile: %w", err)
	}
	bd.charge(p)
	return bd, nil
}

// loopEvents are the uvxlan loop counters the breakdown reports.
var loopEvents = []string{uvxlan.EventTAPReads, uvxlan.EventUDPSends, uvxlan.EventUDPRecvs, uvxlan.EventTAPWrites,
	uvxlan.EventEgressWakeups, uvxlan.EventIngressWakeups}

// frames sums the frame and loop counters of the topology's backends.
func (t *topology) frames() map[string]uint64 {
	m := map[string]uint64{}
	for _, b := range t.backend {
		s := b.Stats()
		m["sent"] += s.TxFrames
		m["received"] += s.RxFrames
		for _, k := range loopEvents {
			m[k] += s.Events[k]
		}
	}
	return m
}

func (bd *breakdown) charge(p *profile.Profile) {
	vi := len(p.SampleType) - 1 // cpu nanoseconds
	for _, s := range p.Sample {
		d := time.Duration(s.Value[vi])
		bd.cpu[classify(s)] += d
		bd.total += d
	}
}

// closureSuffix ends the name of a closure (or of a closure in a closure).
var closureSuffix = regexp.MustCompile(`(\.func\d+)+(\.\d+)*$`)

func classify(s *profile.Sample) string {
	for _, loc := range s.Location {
		for _, line := range loc.Line {
			if line.Function == nil {
				continue
			}
			name := closureSuffix.ReplaceAllString(line.Function.Name, "")
			for _, c := range categories {
				for _, f := range c.funcs {
					if strings.HasSuffix(name, f) {
						return c.name
					}
				}
			}
		}
	}
	return otherCategory
}

func (bd *breakdown) write(w io.Writer) {
	per := bd.moved / 65536
	fmt.Fprintf(w, "### Where the CPU of a 64 KB super-frame goes (uvxlan, 1 stream, %.2f Gb/s, CPU profile of both nodes' dataplanes)\n\n", bd.gbps)
	fmt.Fprintln(w, "| part | µs per 64 KB | share |")
	fmt.Fprintln(w, "|---|---|---|")
	names := []string{}
	for _, c := range categories {
		names = append(names, c.name)
	}
	for _, n := range append(names, otherCategory) {
		d := bd.cpu[n]
		fmt.Fprintf(w, "| %s | %.1f | %.0f %% |\n", n, float64(d.Microseconds())/per, 100*float64(d)/float64(max(bd.total, 1)))
	}
	us := float64(bd.total.Microseconds()) / per
	fmt.Fprintf(w, "| **total** | **%.1f** | 100 %% |\n\n", us)
	f := func(k string) float64 { return float64(bd.frames[k]) / per }
	fmt.Fprintf(w, "%.1f µs of CPU per 64 KB is %.1f Gb/s per dataplane core. Per 64 KB (counters of both nodes) the dataplanes sent %.1f and received %.1f datagrams or frames; ",
		us, 65536*8/us/1e3, f("sent"), f("received"))
	calls := f(uvxlan.EventTAPReads) + f(uvxlan.EventUDPSends) + f(uvxlan.EventUDPRecvs) + f(uvxlan.EventTAPWrites)
	fmt.Fprintf(w, "their loops made %.1f system calls (TAP reads %.1f, UDP sends %.1f, UDP receives %.1f, TAP writes %.1f; those that found nothing to read included) and were woken %.1f times (egress %.1f, ingress %.1f).\n",
		calls, f(uvxlan.EventTAPReads), f(uvxlan.EventUDPSends), f(uvxlan.EventUDPRecvs), f(uvxlan.EventTAPWrites),
		f(uvxlan.EventEgressWakeups)+f(uvxlan.EventIngressWakeups), f(uvxlan.EventEgressWakeups), f(uvxlan.EventIngressWakeups))
}
