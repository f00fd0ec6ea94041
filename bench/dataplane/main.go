// Command dataplane benchmarks weft's userspace VXLAN dataplane against the
// kernel's VXLAN and the raw underlay, inside network namespaces that it
// creates and deletes. Run it as root from the repository root:
//
//	go run ./bench/dataplane            # 10 s runs, median of 3
//	go run ./bench/dataplane -quick     # 3 s runs, one each
//	go run ./bench/dataplane -modes uvxlan,uvxlan-plain
//
// For each mode it measures iperf3 TCP throughput with 1 and 4 streams
// (pod to pod over the overlay; host to host on the underlay), ping latency
// (p50/p99 of 200 pings) and CPU use (busy cores from /proc/stat during the
// 1-stream run, and for uvxlan the share of this process, which runs both
// nodes' dataplanes). It prints a table and the ratio uvxlan/kernel. It
// asserts nothing: the figures depend on the machine. See README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"
)

type options struct {
	modes   []string
	dur     time.Duration
	reps    int
	pings   int
	queues  int
	verbose bool
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "dataplane:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("dataplane", flag.ContinueOnError)
	modes := fs.String("modes", "underlay,kernel,weft-vxlan,uvxlan", "comma-separated modes: underlay, kernel (hand-made kernel VXLAN), weft-vxlan (weft's kernel backend), uvxlan, uvxlan-plain")
	quick := fs.Bool("quick", false, "3 s runs, one repetition")
	var o options
	fs.DurationVar(&o.dur, "time", 10*time.Second, "duration of one iperf3 run")
	fs.IntVar(&o.reps, "reps", 3, "repetitions per figure (the median is reported)")
	fs.IntVar(&o.pings, "pings", 200, "pings for the latency percentiles")
	fs.IntVar(&o.queues, "queues", 1, "uvxlan TAP queues / receive sockets per node (Config.Queues)")
	fs.BoolVar(&o.verbose, "v", false, "log the backend")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of this process (the uvxlan dataplanes) to `file`")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *quick {
		o.dur, o.reps, o.pings = 3*time.Second, 1, 100
	}
	o.modes = strings.Split(*modes, ",")
	if os.Geteuid() != 0 {
		return errors.New("needs root (network namespaces)")
	}
	log := slog.New(slog.DiscardHandler)
	if o.verbose {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	var results []result
	for _, m := range o.modes {
		fmt.Fprintf(os.Stderr, "measuring %s ...\n", m)
		r, err := measure(ctx, m, o, log)
		if err != nil {
			return fmt.Errorf("%s: %w", m, err)
		}
		results = append(results, r)
	}
	report(os.Stdout, results, o)
	return nil
}
