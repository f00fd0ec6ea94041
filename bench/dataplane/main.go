// Command dataplane benchmarks weft's userspace VXLAN dataplane against the
// kernel's VXLAN (and optionally the raw underlay), inside network
// namespaces that it creates and deletes. Run it as root from the
// repository root:
//
//	go run ./bench/dataplane                     # kernel and uvxlan, quiet and loaded, 3 rounds of 10 s
//	go run ./bench/dataplane -quick              # 3 s runs, 1 round, quiet only
//	go run ./bench/dataplane -readme bench/dataplane/README.md
//
// The modes are measured in interleaved rounds (kernel, uvxlan, kernel,
// uvxlan, ...), each on a freshly built topology, and the median of the
// rounds is reported with the spread (lowest–highest). Under -load busy a
// child process of the benchmark keeps one core busy throughout, so that
// a good figure is not a lucky one. For each mode: iperf3 TCP throughput
// with 1 and 4 streams (pod to pod over the overlay; host to host on the
// underlay), ping round trip p50/p99, busy cores from /proc/stat during
// the 1-stream run, for uvxlan the cores this process used (both nodes'
// dataplanes) and Gb/s per dataplane core. Then the ratios against the
// kernel, the idle CPU of a uvxlan node pair, and where the CPU of a 64 KB
// super-frame goes (from a CPU profile of a separate 1-stream run). With
// -readme it writes the figures between the markers of that file. It
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
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/weft-net/weft/backend/kernel"
)

type options struct {
	modes   []string
	loads   []string // "quiet", "busy"
	dur     time.Duration
	rounds  int
	pings   int
	queues  int
	verbose bool
	profile string // where to keep the breakdown run's CPU profile
	nice    int    // the nice value of this process and of the uvxlan dataplanes it runs or starts
}

// spinEnv makes the binary a busy loop: the background load of -load busy.
const spinEnv = "WEFT_BENCH_SPIN"

func main() {
	if spec := os.Getenv(nodeEnv); spec != "" {
		if err := runNode(spec); err != nil {
			fmt.Fprintln(os.Stderr, "dataplane node:", err)
			os.Exit(1)
		}
		return
	}
	if os.Getenv(spinEnv) != "" {
		kernel.SetProcessNice(0) // a pod's priority, not the dataplane's
		for {
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "dataplane:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("dataplane", flag.ContinueOnError)
	modes := fs.String("modes", "kernel,uvxlan-fast,uvxlan-proc,uvxlan", "comma-separated modes: underlay, kernel (hand-made kernel VXLAN), weft-vxlan (weft's kernel backend, with its VXLAN port filter), weft-vxlan-open (the same with the filter off), uvxlan, uvxlan-plain, uvxlan-proc (uvxlan with each node in a process of its own, as weftd), uvxlan-fast (uvxlan-proc with the fast path); kernel-to-fast, kernel-to-proc, fast-to-kernel, proc-to-kernel (one kernel VXLAN node and one uvxlan node, with or without the fast path; traffic from the first named to the second)")
	loads := fs.String("load", "quiet,busy", "comma-separated conditions: quiet, busy (a child process keeps one core busy)")
	quick := fs.Bool("quick", false, "3 s runs, 1 round, quiet only, no breakdown")
	var o options
	fs.DurationVar(&o.dur, "time", 10*time.Second, "duration of one iperf3 run")
	fs.IntVar(&o.rounds, "rounds", 3, "interleaved rounds per condition (the median is reported)")
	fs.IntVar(&o.pings, "pings", 200, "pings per round for the latency percentiles")
	fs.IntVar(&o.queues, "queues", 1, "uvxlan TAP queues / receive sockets per node (Config.Queues)")
	fs.BoolVar(&o.verbose, "v", false, "log the backend")
	breakdown := fs.Bool("breakdown", true, "profile a separate uvxlan 1-stream run and print where the CPU of a 64 KB super-frame goes")
	idle := fs.Duration("idle", 10*time.Second, "measure the CPU of an idle uvxlan node pair for this long (0: skip)")
	fs.StringVar(&o.profile, "cpuprofile", "", "keep the CPU profile of the breakdown run in `file` (go tool pprof)")
	fs.IntVar(&o.nice, "dataplane-nice", 0, "nice value of the uvxlan dataplanes (this process, whose nice the node processes of uvxlan-proc inherit), as weftd's --dataplane-nice; iperf3, ping and the background load run at 0 as pods do")
	readme := fs.String("readme", "", "write the report between the markers of this README")
	peerFilter := fs.Bool("peer-filter", false, "instead of the modes above, compare weft-vxlan (its VXLAN port filter on) with weft-vxlan-open (off): connections per second, 1-stream and 8-stream throughput between the pods")
	peerFilterOut := fs.String("peer-filter-report", "", "with -peer-filter, also write the report to this file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *quick {
		o.dur, o.rounds, o.pings, *loads, *breakdown, *idle = 3*time.Second, 1, 100, "quiet", false, 0
	}
	o.modes, o.loads = strings.Split(*modes, ","), strings.Split(*loads, ",")
	for _, l := range o.loads {
		if l != "quiet" && l != "busy" {
			return fmt.Errorf("unknown load %q (quiet, busy)", l)
		}
	}
	if os.Geteuid() != 0 {
		return errors.New("needs root (network namespaces)")
	}
	if err := kernel.SetProcessNice(o.nice); err != nil {
		return err
	}
	log := slog.New(slog.DiscardHandler)
	if o.verbose {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	if *peerFilter {
		return measurePeerFilter(ctx, o, log, os.Stdout, *peerFilterOut)
	}
	var rep report
	rep.header = header(o)
	for _, l := range o.loads {
		c, err := measureCondition(ctx, l, o, log)
		if err != nil {
			return err
		}
		rep.conds = append(rep.conds, c)
	}
	if *idle > 0 {
		var err error
		if rep.idle, err = idleCPU(ctx, o, *idle, log); err != nil {
			return fmt.Errorf("idle: %w", err)
		}
	}
	if *breakdown {
		var err error
		if rep.breakdown, err = profileBreakdown(ctx, o, log); err != nil {
			return fmt.Errorf("breakdown: %w", err)
		}
	}
	rep.write(os.Stdout)
	if *readme != "" {
		return rep.updateReadme(*readme)
	}
	return nil
}

// withLoad runs f while the condition's background load runs.
func withLoad(load string, f func() error) error {
	if load != "busy" {
		return f()
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	p, err := os.StartProcess(self, []string{self}, &os.ProcAttr{
		Env: append(os.Environ(), spinEnv+"=1"), Files: []*os.File{nil, nil, os.Stderr}})
	if err != nil {
		return fmt.Errorf("start the background load: %w", err)
	}
	defer func() {
		p.Kill() // ours, by PID
		p.Wait()
	}()
	return f()
}

// pod returns argv to run a program at nice 0, as in a pod, whatever this
// process's own nice value (which its children would inherit).
func pod(argv ...string) []string {
	n, err := kernel.ThreadNice(0)
	if err != nil || n == 0 {
		return argv
	}
	return append([]string{"nice", "-n", strconv.Itoa(-n)}, argv...)
}
