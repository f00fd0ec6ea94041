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
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// result holds the figures of one mode.
type result struct {
	mode         string
	gbps1, gbps4 float64
	p50, p99     time.Duration
	busyCores    float64 // whole machine, during the 1-stream runs
	procCores    float64 // this process (the uvxlan dataplanes), same runs
	drops        map[string]uint64
}

func measure(ctx context.Context, mode string, o options, log *slog.Logger) (result, error) {
	r := result{mode: mode}
	t, err := build(ctx, mode, o.queues, log)
	if err != nil {
		return r, err
	}
	defer t.close()
	// Warm up (and fail early when the path is broken).
	if _, err := t.a.runNS().Run("ping", "-c", "3", "-i", "0.2", "-W", "2", t.b.target().String()); err != nil {
		return r, err
	}
	if r.p50, r.p99, err = pingLatency(t, o.pings); err != nil {
		return r, err
	}
	var runs1, runs4, busy, proc []float64
	for range o.reps {
		c0, p0 := readCPU(), procCPU()
		g, err := iperf(ctx, t, 1, o.dur)
		if err != nil {
			return r, err
		}
		c1, p1 := readCPU(), procCPU()
		runs1 = append(runs1, g)
		busy = append(busy, c1.busyCores(c0))
		proc = append(proc, (p1-p0).Seconds()/c1.wall.Sub(c0.wall).Seconds())
		if g, err = iperf(ctx, t, 4, o.dur); err != nil {
			return r, err
		}
		runs4 = append(runs4, g)
	}
	r.gbps1, r.gbps4, r.busyCores, r.procCores = median(runs1), median(runs4), median(busy), median(proc)
	if !strings.HasPrefix(mode, "uvxlan") {
		r.procCores = math.NaN()
	}
	r.drops = map[string]uint64{}
	for _, b := range t.backend {
		for k, v := range b.Stats().Drops {
			if v > 0 {
				r.drops[k] += v
			}
		}
	}
	return r, nil
}

// iperf runs one iperf3 TCP test from a to b and returns Gb/s received.
func iperf(ctx context.Context, t *topology, streams int, dur time.Duration) (float64, error) {
	dst := t.b.target().String()
	ctx, cancel := context.WithTimeout(ctx, dur+30*time.Second)
	defer cancel()
	srv := t.b.runNS().Command(ctx, "iperf3", "-s", "-1", "-B", dst)
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
	out, err := t.a.runNS().Run("iperf3", "-c", dst, "-t", strconv.Itoa(int(dur.Seconds())), "-P", strconv.Itoa(streams), "-J")
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
	out, err := t.a.runNS().Run("ping", "-c", strconv.Itoa(n), "-i", "0.01", "-W", "2", t.b.target().String())
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
	wall        time.Time
}

func readCPU() cpuSample {
	s := cpuSample{wall: time.Now()}
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return s
	}
	line, _, _ := strings.Cut(string(b), "\n")
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
	return float64(s.busy-before.busy) / float64(s.total-before.total) * float64(runtime.NumCPU())
}

// procCPU is the CPU time this process has used so far.
func procCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

func report(w io.Writer, rs []result, o options) {
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Fprintf(w, "iperf3 TCP %s per run, median of %d; ping p50/p99 of %d; %d CPUs; load average %s\n",
		o.dur, o.reps, o.pings, runtime.NumCPU(), strings.Join(strings.Fields(string(load))[:3], " "))
	fmt.Fprintf(w, "(other load on the machine lowers and equalises every figure: compare runs made together)\n\n")
	fmt.Fprintf(w, "%-13s %9s %9s %9s %9s %11s %11s %9s\n", "mode", "1 stream", "4 streams", "p50", "p99", "busy cores", "dataplane", "Gb/s/core")
	var kernel *result
	for i := range rs {
		r := rs[i]
		if r.mode == "kernel" {
			kernel = &rs[i]
		}
		dp := "-"
		if !math.IsNaN(r.procCores) {
			dp = fmt.Sprintf("%.2f", r.procCores)
		}
		fmt.Fprintf(w, "%-13s %8.2fG %8.2fG %9s %9s %11.2f %11s %9.2f\n", r.mode, r.gbps1, r.gbps4,
			r.p50.Round(time.Microsecond), r.p99.Round(time.Microsecond), r.busyCores, dp, r.gbps1/math.Max(r.busyCores, 0.01))
	}
	if kernel == nil {
		return
	}
	fmt.Fprintln(w)
	for _, r := range rs {
		if r.mode == "weft-vxlan" {
			fmt.Fprintf(w, "weft-vxlan/kernel (weft's kernel backend vs the same device made by hand): 1 stream %.0f%%, 4 streams %.0f%%\n",
				100*r.gbps1/kernel.gbps1, 100*r.gbps4/kernel.gbps4)
		}
		if !strings.HasPrefix(r.mode, "uvxlan") {
			continue
		}
		fmt.Fprintf(w, "%s/kernel: 1 stream %.0f%%, 4 streams %.0f%%, p50 latency ×%.1f, p99 ×%.1f\n", r.mode,
			100*r.gbps1/kernel.gbps1, 100*r.gbps4/kernel.gbps4,
			float64(r.p50)/float64(kernel.p50), float64(r.p99)/float64(kernel.p99))
		if len(r.drops) > 0 {
			fmt.Fprintf(w, "  %s drops: %v\n", r.mode, r.drops)
		}
	}
}
