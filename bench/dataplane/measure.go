package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// sample is one round of one mode.
type sample struct {
	gbps1, gbps4 float64
	p50, p99     float64 // µs
	busy         float64 // busy cores of the whole machine, during the 1-stream run
	proc         float64 // cores this process used (the uvxlan dataplanes), same run
}

// modeResult is every round of one mode under one condition.
type modeResult struct {
	mode    string
	samples []sample
	drops   map[string]uint64
	fast    fastShare // uvxlan-fast: summed over its rounds
}

// condition is one background load and the results of every mode under it.
type condition struct {
	load    string
	loadavg string // at the end
	modes   []*modeResult
}

// measureCondition measures every mode in o.rounds interleaved rounds
// under the given background load.
func measureCondition(ctx context.Context, load string, o options, log *slog.Logger) (condition, error) {
	c := condition{load: load}
	for _, m := range o.modes {
		c.modes = append(c.modes, &modeResult{mode: m, drops: map[string]uint64{}})
	}
	err := withLoad(load, func() error {
		for round := range o.rounds {
			for _, mr := range c.modes {
				fmt.Fprintf(os.Stderr, "%s, round %d of %d: %s\n", load, round+1, o.rounds, mr.mode)
				s, err := measureOnce(ctx, mr, o, log)
				if err != nil {
					return fmt.Errorf("%s, %s: %w", load, mr.mode, err)
				}
				mr.samples = append(mr.samples, s)
			}
		}
		return nil
	})
	c.loadavg = loadavg()
	return c, err
}

// measureOnce builds the topology of mr.mode and measures one round.
func measureOnce(ctx context.Context, mr *modeResult, o options, log *slog.Logger) (s sample, err error) {
	t, err := build(ctx, mr.mode, o.queues, log)
	if err != nil {
		return s, err
	}
	defer t.close()
	// Warm up (and fail early when the path is broken).
	if _, err := t.a.runNS().Run(pod("ping", "-c", "3", "-i", "0.2", "-W", "2", t.b.target().String())...); err != nil {
		return s, err
	}
	p50, p99, err := pingLatency(t, o.pings)
	if err != nil {
		return s, err
	}
	s.p50, s.p99 = float64(p50)/1e3, float64(p99)/1e3
	c0, p0 := readCPU(), t.dataplaneCPU()
	if s.gbps1, err = iperf(ctx, t, 1, o.dur); err != nil {
		return s, err
	}
	c1, p1 := readCPU(), t.dataplaneCPU()
	s.busy = c1.busyCores(c0)
	s.proc = math.NaN()
	if userMode(mr.mode) && p0 >= 0 && p1 >= 0 {
		s.proc = (p1 - p0).Seconds() / c1.wall.Sub(c0.wall).Seconds()
	}
	if s.gbps4, err = iperf(ctx, t, 4, o.dur); err != nil {
		return s, err
	}
	drops, fast := t.drops()
	for k, v := range drops {
		if v > 0 {
			mr.drops[k] += v
		}
	}
	mr.fast.tx += fast.tx
	mr.fast.rx += fast.rx
	mr.fast.fastTx += fast.fastTx
	mr.fast.fastRx += fast.fastRx
	return s, nil
}

// idleCPU measures the cores this process (both uvxlan nodes) uses while
// the overlay carries nothing, over d.
func idleCPU(ctx context.Context, o options, d time.Duration, log *slog.Logger) (float64, error) {
	fmt.Fprintf(os.Stderr, "idle uvxlan nodes, %s\n", d)
	t, err := build(ctx, "uvxlan", o.queues, log)
	if err != nil {
		return 0, err
	}
	defer t.close()
	if _, err := t.a.runNS().Run(pod("ping", "-c", "3", "-i", "0.2", "-W", "2", t.b.target().String())...); err != nil {
		return 0, err
	}
	time.Sleep(time.Second) // let the reconcilers settle after the start
	p0, w0 := procCPU(), time.Now()
	select {
	case <-time.After(d):
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	return (procCPU() - p0).Seconds() / time.Since(w0).Seconds(), nil
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// iperf runs one iperf3 TCP test from a to b and returns Gb/s received.
func iperf(ctx context.Context, t *topology, streams int, dur time.Duration) (float64, error) {
	dst := t.b.target().String()
	ctx, cancel := context.WithTimeout(ctx, dur+30*time.Second)
	defer cancel()
	srv := t.b.runNS().Command(ctx, pod("iperf3", "-s", "-1", "-B", dst)...)
	srv.Stdout, srv.Stderr = io.Discard, io.Discard
	if err := srv.Start(); err != nil {
		return 0, fmt.Errorf("start iperf3 server: %w", err)
	}
	defer func() {
		srv.Process.Kill() // ours, by PID; a no-op once it exited
		srv.Wait()
	}()
	// The server needs a moment to listen; retry while it refuses.
	for i := 0; ; i++ {
		g, err := iperfClient(t, dst, streams, dur)
		if err == nil || !strings.Contains(err.Error(), "Connection refused") || i == 50 {
			return g, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func iperfClient(t *topology, dst string, streams int, dur time.Duration) (float64, error) {
	out, err := t.a.runNS().Run(pod("iperf3", "-c", dst, "-t", strconv.Itoa(int(dur.Seconds())), "-P", strconv.Itoa(streams), "-J")...)
	var rep struct {
		Error string `json:"error"`
		End   struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if jerr := json.Unmarshal([]byte(out), &rep); jerr != nil {
		return 0, errors.Join(err, fmt.Errorf("parse iperf3 output: %w", jerr))
	}
	if rep.Error != "" || rep.End.SumReceived.BitsPerSecond == 0 {
		return 0, fmt.Errorf("iperf3 -P %d: no result: %s", streams, rep.Error)
	}
	return rep.End.SumReceived.BitsPerSecond / 1e9, nil
}

// pingLatency pings b from a and returns the p50 and p99 round trip.
func pingLatency(t *topology, n int) (p50, p99 time.Duration, err error) {
	out, err := t.a.runNS().Run(pod("ping", "-c", strconv.Itoa(n), "-i", "0.01", "-W", "2", t.b.target().String())...)
	if err != nil {
		return 0, 0, err
	}
	var rtts []float64
	for _, line := range strings.Split(out, "\n") {
		_, after, ok := strings.Cut(line, "time=")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSuffix(strings.Fields(after)[0], "ms"), 64)
		if err == nil {
			rtts = append(rtts, v)
		}
	}
	if len(rtts) == 0 {
		return 0, 0, fmt.Errorf("no replies in ping output")
	}
	slices.Sort(rtts)
	pct := func(p float64) time.Duration {
		return time.Duration(rtts[min(len(rtts)-1, int(p*float64(len(rtts))))] * float64(time.Millisecond))
	}
	return pct(0.50), pct(0.99), nil
}

// cpuSample is the machine-wide CPU time from /proc/stat.
type cpuSample struct {
	busy, total uint64
	cpus        int // the machine's online CPUs (its cpuN lines), whatever this process's affinity
	wall        time.Time
}

func readCPU() cpuSample {
	s := cpuSample{wall: time.Now()}
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return s
	}
	line, rest, _ := strings.Cut(string(b), "\n")
	for l := range strings.Lines(rest) {
		if strings.HasPrefix(l, "cpu") {
			s.cpus++
		}
	}
	for i, f := range strings.Fields(line)[1:] {
		v, _ := strconv.ParseUint(f, 10, 64)
		s.total += v
		if i != 3 && i != 4 { // idle, iowait
			s.busy += v
		}
	}
	return s
}

func (s cpuSample) busyCores(before cpuSample) float64 {
	if s.total == before.total {
		return 0
	}
	return float64(s.busy-before.busy) / float64(s.total-before.total) * float64(s.cpus)
}

// procCPU is the CPU time this process has used so far.
func procCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// spread returns the median, lowest and highest of v.
func spread(v []float64) (med, lo, hi float64) {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return math.NaN(), math.NaN(), math.NaN()
	}
	return s[len(s)/2], s[0], s[len(s)-1]
}
