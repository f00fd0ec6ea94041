package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/weft-net/weft/flow"
	"github.com/weft-net/weft/subnet"
)

// The bounds of the flows weftd keeps (see docs/flows.md): the ring's
// slots and the flows a second it takes (bursts of flowBurst), and the
// conntrack events a second weftd reads.
const (
	flowSlots         = 4096
	flowRate          = 1000
	flowBurst         = 1000
	flowConntrackRate = flow.DefaultRate
)

// flows is what weftd keeps of --flows across the node's runs: the ring
// served on /flows and the verdict counter.
type flows struct {
	ring    *flow.Ring
	metrics *flow.Metrics
	mu      sync.Mutex
	ended   flow.Readers // what runners that ended missed
	current *flowRunner  // the runner of this node's run
}

// newFlows returns the ring and registers the metric; nil with --flows off
// or no health address to serve them on.
func newFlows(c *config, reg prometheus.Registerer) (*flows, error) {
	if !c.flows || c.healthAddr == "" {
		return nil, nil
	}
	m, err := flow.NewMetrics(reg)
	if err != nil {
		return nil, err
	}
	f := &flows{ring: flow.NewRing(flowSlots, flowRate, flowBurst), metrics: m}
	suppressed := prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "weft_flows_suppressed_total",
		Help: "Flows the ring of /flows turned away over its rate (" + fmt.Sprint(flowRate) + " a second)."},
		func() float64 { return float64(f.ring.Stats().Suppressed) })
	lost := prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "weft_flow_events_lost_total",
		Help: "Times the kernel said flow events (conntrack's, or logged drops) were lost because weftd's socket was full."},
		func() float64 { return float64(f.readers().Lost) })
	pauses := prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "weft_flow_conntrack_pauses_total",
		Help: "Times weftd stopped reading conntrack's events for the rest of a second, over " + fmt.Sprint(flowConntrackRate) + " a second."},
		func() float64 { return float64(f.readers().ConntrackPauses) })
	paused := prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "weft_flow_conntrack_paused_seconds_total",
		Help: "Seconds weftd did not read conntrack's events because they came faster than it reads them."},
		func() float64 { return f.readers().ConntrackPausedSeconds })
	for _, c := range []prometheus.Collector{suppressed, lost, pauses, paused} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// readers is what every runner missed so far.
func (f *flows) readers() flow.Readers {
	f.mu.Lock()
	defer f.mu.Unlock()
	r := f.ended
	if f.current != nil {
		r = addReaders(r, f.current.missed())
	}
	r.ConntrackRate = flowConntrackRate
	return r
}

func addReaders(a, b flow.Readers) flow.Readers {
	a.Lost += b.Lost
	a.ConntrackPauses += b.ConntrackPauses
	a.ConntrackPausedSeconds += b.ConntrackPausedSeconds
	return a
}

func (f *flows) add(fl flow.Flow) {
	if f.ring.Add(fl) {
		f.metrics.Observe(fl)
	}
}

// mount serves the ring on /flows.
func (f *flows) mount(hs *HealthServer, node string) {
	hs.Mux.Handle("/flows", flow.Handler(node, f.ring, f.readers))
}

// flowNode names the node in its flows: --node-name, else the host name.
func flowNode(c *config) string {
	if c.nodeName != "" {
		return c.nodeName
	}
	name, _ := os.Hostname()
	return name
}

// factory builds the runner that reads the kernel's events for a network
// config: conntrack's for connections with an end in the cluster network,
// and, with network policy enforced, the drops logged to the NFLOG group.
func (f *flows) factory(c *config, log *slog.Logger) func(cfg *subnet.Config) (Runner, error) {
	return func(cfg *subnet.Config) (Runner, error) {
		var pods []netip.Prefix
		for _, p := range []netip.Prefix{cfg.Network, cfg.IPv6Network} {
			if p.IsValid() {
				pods = append(pods, p)
			}
		}
		log := log.With("component", "flows")
		r := &flowRunner{f: f, log: log, ct: &flow.Conntrack{Pods: pods, Accounting: conntrackAccounting(c, log),
			Rate: flowConntrackRate, Log: log}}
		if c.kubeSubnetMgr && c.networkPolicy {
			r.nflog = &flow.NFLog{Group: uint16(c.flowLogGroup), Log: log}
		}
		return r, nil
	}
}

type flowRunner struct {
	f     *flows
	ct    *flow.Conntrack
	nflog *flow.NFLog
	log   *slog.Logger
}

// Run reads until ctx is done. A reader that fails (no conntrack in this
// kernel, the NFLOG group bound by another program) is logged and left
// stopped: flows are for looking, and never stop the node.
func (r *flowRunner) Run(ctx context.Context) error {
	r.f.mu.Lock()
	r.f.current = r
	r.f.mu.Unlock()
	defer func() {
		r.f.mu.Lock()
		defer r.f.mu.Unlock()
		r.f.ended = addReaders(r.f.ended, r.missed())
		if r.f.current == r {
			r.f.current = nil
		}
	}()
	var wg sync.WaitGroup
	run := func(what string, read func(context.Context, func(flow.Flow)) error) {
		wg.Go(func() {
			if err := read(ctx, r.f.add); err != nil {
				r.log.Warn("flows: cannot read "+what+"; /flows goes on without them", "err", err)
			}
		})
	}
	run("conntrack's events", r.ct.Run)
	if r.nflog != nil {
		run("the policy drops (NFLOG)", r.nflog.Run)
	}
	wg.Wait()
	return nil
}

// missed is what this runner's readers missed so far.
func (r *flowRunner) missed() flow.Readers {
	pauses, paused := r.ct.Paused()
	m := flow.Readers{Lost: r.ct.Lost(), ConntrackPauses: pauses, ConntrackPausedSeconds: paused.Seconds()}
	if r.nflog != nil {
		m.Lost += r.nflog.Lost()
	}
	return m
}

// conntrackAccounting says whether the kernel counts the bytes and
// packets of connections in weftd's namespace (nf_conntrack_acct). With
// --flow-conntrack-acct weftd turns it on (a setting of the whole network
// namespace, so opt-in); else closed flows have no counts unless it is on
// already.
func conntrackAccounting(c *config, log *slog.Logger) bool {
	procSys := c.procSys
	if procSys == "" {
		procSys = "/proc/sys"
	}
	path := filepath.Join(procSys, "net/netfilter/nf_conntrack_acct")
	if c.flowConntrackAcct {
		if err := os.WriteFile(path, []byte("1\n"), 0o644); err != nil {
			log.Warn("cannot turn on conntrack accounting: closed flows have no byte counts", "err", err)
			return false
		}
		log.Info("turned on conntrack accounting in this network namespace (--flow-conntrack-acct)", "sysctl", "net.netfilter.nf_conntrack_acct=1")
		return true
	}
	b, err := os.ReadFile(path)
	on := err == nil && strings.TrimSpace(string(b)) == "1"
	if !on {
		log.Info("conntrack accounting is off: closed flows have no byte counts (--flow-conntrack-acct turns it on)")
	}
	return on
}
