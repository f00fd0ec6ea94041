package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/weft-net/weft/internal/ops/lab"
)

const labUsage = `usage: weftctl lab <up|down|status|exec> [flags]
  up      build the lab and stay in the foreground until "lab down" or Ctrl-C
  down    stop a running lab, or remove the debris of a dead one
  status  show the nodes, their weftd and readiness, and the pods
  exec    weftctl lab exec <node1|node1-pod1|sw> -- <command…>
`

func runLab(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, labUsage)
		return errUsage
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, labUsage+"\nRun \"weftctl lab <command> -h\" for the flags of a command.\n")
		return nil
	}
	cmds := map[string]func(context.Context, []string, io.Writer, io.Writer) error{
		"up": runLabUp, "down": runLabDown, "status": runLabStatus, "exec": runLabExec,
	}
	f, ok := cmds[args[0]]
	if !ok {
		fmt.Fprint(stderr, labUsage)
		return fmt.Errorf("lab: unknown command %q", args[0])
	}
	return f(ctx, args[1:], stdout, stderr)
}

func stateDirFlag(fs *flag.FlagSet) *string {
	return fs.String("state-dir", env("lab-state-dir", lab.DefaultStateDir), "state directory of the lab")
}

func runLabUp(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("weftctl lab up", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := lab.Options{Out: stdout}
	fs.IntVar(&o.Nodes, "nodes", 3, "number of nodes (at least 1)")
	fs.IntVar(&o.PodsPerNode, "pods-per-node", 2, "pods per node (0: bare nodes)")
	fs.StringVar(&o.Backend, "backend", lab.BackendVXLAN, "dataplane of the nodes: vxlan, uvxlan or mixed (alternating)")
	fastPath := fs.Bool("fast-path", true, "uvxlan nodes run the fast path, tc programs in the kernel that carry the traffic to and from peers, as weft does by default; --fast-path=false leaves it to weftd (the userspace path)")
	fs.StringVar(&o.Weftd, "weftd", "", "weftd binary (default: next to weftctl, else in PATH)")
	fs.StringVar(&o.CNIBin, "cni-bin", "", "directory holding the weft CNI plugin (default: next to weftctl, else from PATH)")
	fs.DurationVar(&o.Timeout, "timeout", 90*time.Second, "how long the lab may take to come up")
	dir := stateDirFlag(fs)
	verbose := fs.Bool("v", false, "log each step")
	withWeb := fs.Bool("web", false, "also serve the live page of the lab (see \"weftctl web\"), on --listen")
	var wf webFlags
	wf.register(fs)
	if err := parse(fs, args, 0); err != nil {
		return err
	}
	switch {
	case o.Nodes < 1:
		return fmt.Errorf("--nodes %d: must be at least 1", o.Nodes)
	case o.PodsPerNode < 0:
		return fmt.Errorf("--pods-per-node %d: must be 0 or more (0: nodes without pods)", o.PodsPerNode)
	}
	o.StateDir = *dir
	o.NoFastPath = !*fastPath
	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelInfo
	}
	o.Log = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	if err := o.FindBinaries(selfPath()); err != nil {
		return err
	}
	if !*withWeb {
		return lab.Up(ctx, o)
	}
	serve, err := listenWeb(ctx, labWebSource(o.StateDir, logger(stderr)), labWebFlows(o.StateDir), wf, explicitListen(fs), nil, stdout, logger(stderr))
	if err != nil {
		return err
	}
	g, gctx := errgroup.WithContext(ctx)
	wctx, stop := context.WithCancel(gctx)
	g.Go(func() error { return serve(wctx) })
	g.Go(func() error { defer stop(); return lab.Up(gctx, o) })
	return g.Wait()
}

func runLabDown(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("weftctl lab down", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := stateDirFlag(fs)
	timeout := fs.Duration("timeout", 45*time.Second, "how long to wait for the lab to tear itself down before killing it")
	if err := parse(fs, args, 0); err != nil {
		return err
	}
	err := lab.Down(*dir, *timeout, logger(stderr))
	if errors.Is(err, lab.ErrNoLab) {
		fmt.Fprintln(stdout, "no lab to remove:", err)
		return nil
	}
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, "lab removed")
	return nil
}

func runLabStatus(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("weftctl lab status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := stateDirFlag(fs)
	if err := parse(fs, args, 0); err != nil {
		return err
	}
	err := lab.Status(ctx, *dir, stdout)
	if errors.Is(err, lab.ErrNoLab) {
		return fmt.Errorf("%w: start one with `weftctl lab up`", err)
	}
	return err
}

func runLabExec(ctx context.Context, args []string, _, stderr io.Writer) error {
	fs := flag.NewFlagSet("weftctl lab exec", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := stateDirFlag(fs)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: weftctl lab exec [--state-dir D] <node1|node1-pod1|sw> -- <command…>")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	rest := fs.Args()
	if i := slices.Index(rest, "--"); i >= 0 {
		rest = slices.Delete(rest, i, i+1)
	}
	if len(rest) < 2 {
		fs.Usage()
		return errUsage
	}
	if rest[1] == "weftctl" {
		rest[1] = selfPath() // this weftctl, whether or not it is in PATH
	}
	cmd, err := lab.Command(ctx, *dir, rest[0], rest[1:])
	if err != nil {
		return err
	}
	return cmd.Run()
}
