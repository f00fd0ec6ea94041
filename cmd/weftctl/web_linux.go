package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/weft-net/weft/flow"
	"github.com/weft-net/weft/internal/ops/flows"
	"github.com/weft-net/weft/internal/ops/lab"
	"github.com/weft-net/weft/internal/ops/web"
	"github.com/weft-net/weft/subnet"
)

const webUsage = `usage: weftctl web [flags]

Serves a live page of the overlay: nodes, leases, pods, links with the
dataplane's rates, repairs and rejected leases as they happen, and a packet's
path as "explain" reads it. It reads the leases (etcd, --kubeconfig or --lab),
this node's kernel and weftd's /metrics (with --lab every lab node's), and
writes nothing. It listens on 127.0.0.1 unless --listen names another address.
`

// webFlags are the flags of `weftctl web`, also taken by `lab up --web`.
type webFlags struct {
	listen     string
	interval   time.Duration
	healthAddr string
	nodeName   string
}

func (f *webFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.listen, "listen", env("web-listen", "127.0.0.1:9471"), "address of the page; an address other than loopback must be given with this flag")
	fs.DurationVar(&f.interval, "interval", time.Second, "how often the page is updated")
}

// explicitListen reports whether --listen was given on the command line
// (an environment default never opens the page to other hosts).
func explicitListen(fs *flag.FlagSet) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == "listen" })
	return set
}

func runWeb(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("weftctl web", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, webUsage); fs.PrintDefaults() }
	var s store
	s.register(fs)
	var f webFlags
	f.register(fs)
	fs.StringVar(&f.healthAddr, "health-addr", env("health-addr", "127.0.0.1:9470"), "weftd's health address on this node (not with --lab)")
	fs.StringVar(&f.nodeName, "node-name", env("node-name", ""), "this node's name on the page (default: the host name)")
	if err := parse(fs, args, 0); err != nil {
		return err
	}
	log := logger(stderr)
	leases := func(ctx context.Context) ([]subnet.Lease, *subnet.Config, error) {
		ls, cfg, _, err := s.leases(ctx, log)
		return ls, cfg, err
	}
	var src web.Source = &web.NodeSource{Leases: leases, Source: s.kind(), HealthAddr: f.healthAddr, Name: f.nodeName}
	fl := nodeWebFlows(f.healthAddr, f.nodeName)
	if s.lab {
		if _, err := s.labState(); err != nil {
			return err
		}
		src, fl = labWebSource(s.stateDir, log), labWebFlows(s.stateDir)
	}
	serve, err := listenWeb(ctx, src, fl, f, explicitListen(fs), s.secrets(), stdout, log)
	if err != nil {
		return err
	}
	return serve(ctx)
}

// listenWeb checks the flags and listens; the function it returns serves
// the page until ctx ends.
func listenWeb(ctx context.Context, src web.Source, fl web.Flows, f webFlags, explicit bool, secrets []string, stdout io.Writer, log *slog.Logger) (func(context.Context) error, error) {
	if err := web.CheckListen(f.listen, explicit); err != nil {
		return nil, err
	}
	if f.interval < 100*time.Millisecond {
		return nil, fmt.Errorf("--interval %s: must be at least 100ms", f.interval)
	}
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", f.listen)
	if err != nil {
		return nil, fmt.Errorf("web: %w", err)
	}
	fmt.Fprintf(stdout, "weftctl web: serving http://%s/ (read-only)\n", ln.Addr())
	srv := &web.Server{Source: src, Flows: fl, Interval: f.interval, Log: log, AllowRemote: explicit && !loopback(f.listen), Redact: secrets}
	return func(ctx context.Context) error { return srv.Run(ctx, ln) }, nil
}

// labWebSource reads the lab of dir, its etcd found from its state at
// each read (the lab may still be starting).
func labWebSource(dir string, log *slog.Logger) web.Source {
	leases := func(ctx context.Context) ([]subnet.Lease, *subnet.Config, error) {
		s := store{lab: true, stateDir: dir}
		if _, err := s.labState(); err != nil {
			return nil, nil, err
		}
		ls, cfg, _, err := s.leases(ctx, log)
		return ls, cfg, err
	}
	return &web.LabSource{Dir: dir, Leases: leases, Source: "etcd"}
}

// labWebFlows reads the flows of every node of the lab of dir.
func labWebFlows(dir string) web.Flows {
	return func(ctx context.Context, limit int) ([]flow.Flow, []error) {
		st, err := lab.LoadState(dir)
		if err != nil {
			return nil, []error{err}
		}
		eps, names, closeEPs, err := flows.LabEndpoints(st)
		if err != nil {
			return nil, []error{err}
		}
		defer closeEPs()
		fs, _, errs := flows.Recent(ctx, eps, flows.Query{Limit: limit}, names)
		return fs, errs
	}
}

// nodeWebFlows reads the flows of this node's weftd.
func nodeWebFlows(healthAddr, name string) web.Flows {
	if name == "" {
		name, _ = os.Hostname()
	}
	ep := flows.Endpoint{Node: name, Client: &http.Client{}, Base: "http://" + healthAddr}
	return func(ctx context.Context, limit int) ([]flow.Flow, []error) {
		fs, _, errs := flows.Recent(ctx, []flows.Endpoint{ep}, flows.Query{Limit: limit}, nil)
		return fs, errs
	}
}

func loopback(addr string) bool { return web.CheckListen(addr, false) == nil }
