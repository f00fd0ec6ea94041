// Package daemon is weftd: its command line (flanneld's too), its wiring
// and its control loop. Run parses the flags, builds the registry (etcd, or
// the Kubernetes API unless built with -tags weft_nokube) and the factories
// of the configured dataplane, and serves health and metrics. The loop
// (Daemon) leases this node's subnet from the registry, writes the subnet
// file (with NetworkPolicy on, once the session's policy controller has
// committed its first table, so that no pod is wired before), keeps the
// lease renewed (and acquires again if it is lost: a new session, whose
// readiness starts over), turns the peers' leases into a vtep.Table and
// hands it to the dataplane; once that is programmed (and, with
// NetworkPolicy on, the first policy transaction committed) it tells the
// service manager (READY=1). The
// loop itself knows no datastore and no kernel: it sees the Registry and
// Dataplane interfaces, which its tests fake. cmd/weftd is a one-line main.
//
// Run also watches the underlay: when a new device takes the old one's name
// (tailscaled or a network manager recreating it) or another address
// replaces the one weftd took from the device, weftd moves its lease to the
// new address (etcd) and starts the node again on the new underlay, in the
// same process, with the same subnet.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/weft-net/weft/backend"
	"github.com/weft-net/weft/subnet"
)

// Runner is a long-lived part that runs until ctx is done.
type Runner interface {
	Run(ctx context.Context) error
}

// Node describes this node as the daemon sees it.
type Node struct {
	PublicIP    netip.Addr // underlay IPv4 advertised in the lease; invalid if none
	PublicIPv6  netip.Addr // underlay IPv6; invalid if none
	UnderlayMTU int        // MTU of the underlay device
}

// Dataplane is what the daemon needs to build for a lease.
type Dataplane struct {
	Backend backend.Backend
	// Cleanup, if set, removes state other dataplanes left behind (for
	// example the kernel device when this node now runs uvxlan). It runs
	// before Backend.Run.
	Cleanup func() error
	// Close, if set, releases what the factory opened for this dataplane
	// (a netlink handle). It runs after Backend.Run has returned.
	Close func()
	// Runners run beside Backend for as long as the lease (the blackhole
	// routes of --ip-blackhole-route).
	Runners []Runner
	// Fallback, if set, says that this dataplane runs in place of the type
	// asked for, which this node cannot run.
	Fallback *Fallback
}

// Fallback describes a dataplane that runs in place of the configured one:
// uvxlan for vxlan on a kernel without the VXLAN driver.
type Fallback struct {
	Type   string // the dataplane that runs
	Code   string // a short reason, for metrics: no_vxlan_driver
	Reason string // why the configured one cannot run (the kernel's error)
}

// Factories build the parts that depend on the network config and the lease.
type Factories struct {
	// Dataplane builds the dataplane for our lease. typ is the backend type
	// to run (the config's, or the node's override); mtu is the overlay MTU.
	Dataplane func(typ string, cfg *subnet.Config, lease subnet.Lease, mtu int) (Dataplane, error)
	// Masquerade builds the masquerade rules for the network and our
	// lease; nil when --ip-masq is off.
	Masquerade func(cfg *subnet.Config, lease subnet.Lease) (Runner, error)
	// Policy builds the NetworkPolicy enforcement for our lease, which
	// tells rep how it goes; nil: none (--network-policy off, or etcd
	// mode). While it is on, the daemon is ready only when its last
	// transaction committed.
	Policy func(cfg *subnet.Config, lease subnet.Lease, rep PolicyReporter) (Runner, error)
	// Forward builds the forward accept rules (and removes Flannel's
	// leftovers); nil: none.
	Forward func(cfg *subnet.Config) (Runner, error)
	// Flows builds the reader of the kernel's flow events for the
	// network; nil: none (--flows off).
	Flows func(cfg *subnet.Config) (Runner, error)
	// LeaseData, if set, adds the backend data that only the dataplane
	// knows to the lease value (the wireguard public key).
	LeaseData func(ctx context.Context, typ string, cfg *subnet.Config, a *subnet.LeaseAttrs) error
}

// Config is the daemon's configuration.
type Config struct {
	Registry    subnet.Registry
	Node        Node
	Factories   Factories
	SubnetFile  string
	IPMasq      bool
	BackendType string // overrides the config's Backend.Type when set

	Metrics *Metrics // nil: no metrics
	// Rejections records the peers' leases that fail the checks (logged
	// once, counted); nil: a recorder logging to the daemon's logger and
	// counting in Metrics.
	Rejections    *subnet.Rejections
	RenewMargin   time.Duration // renew this long before expiry (default 1h)
	RetryInterval time.Duration // between failed renewals and acquisitions (default 1m)
	// Notifier, if set, is told READY=1 the first time the daemon is
	// ready: systemd's Type=notify (flanneld notifies it too).
	Notifier Notifier
	// Presence, if set, is the record that this node advertises its public
	// addresses: no lease is acquired before it is claimed (etcd mode).
	Presence Presence
}

// Presence is a claim on the node's public addresses (etcd.Presence).
type Presence interface {
	// Held reports whether the claim is ours and alive; err says why not
	// (subnet.ErrPublicIPTaken: another running node holds an address).
	Held() (bool, error)
	// Changed has a value after Held's answer may have changed (the
	// daemon is its only reader).
	Changed() <-chan struct{}
}

// PolicyReporter is told how NetworkPolicy enforcement goes.
type PolicyReporter interface {
	// Programmed is the outcome of one transaction, after the first full
	// view of the cluster: nil when it committed.
	Programmed(err error)
	// CannotEnforce says that policy cannot be enforced on this node at
	// all, and why; the dataplane runs on, the daemon is not ready.
	CannotEnforce(err error)
	// SourceChecks follows each committed transaction: nil when pods'
	// source addresses are checked, else why not (the controller logs
	// it); the daemon stays ready, a metric says it.
	SourceChecks(err error)
}

// Notifier sends notifications to the service manager (sd_notify(3)).
type Notifier interface {
	Notify(state string) error
}

// Daemon is weftd's control loop.
type Daemon struct {
	cfg      Config
	log      *slog.Logger
	ready    atomic.Bool
	notified atomic.Bool // READY=1 sent
	lease    atomic.Pointer[subnet.Lease]
	waiting  atomic.Pointer[string] // see Waiting
	// policy is the NetworkPolicy state of the current session (nil
	// before the first, or with policy off).
	policy atomic.Pointer[policySession]
}

// policySession is the readiness of NetworkPolicy enforcement during one
// lease's session: each session starts with nothing committed, so a lost
// lease never lends the new session its controller's commit. It is the
// PolicyReporter that session's controller is given.
type policySession struct {
	d         *Daemon
	committed atomic.Bool   // the last transaction committed
	cannot    atomic.Bool   // CannotEnforce was said
	first     chan struct{} // closed at the first commit
	once      sync.Once
}

var _ PolicyReporter = (*policySession)(nil)

// newPolicySession makes a fresh policy state the current one.
func (d *Daemon) newPolicySession() *policySession {
	s := &policySession{d: d, first: make(chan struct{})}
	d.policy.Store(s)
	d.cfg.Metrics.policyUnknown()
	d.cfg.Metrics.setReady(d.Ready())
	return s
}

// New returns a daemon; Run starts it.
func New(cfg Config, log *slog.Logger) (*Daemon, error) {
	if cfg.Registry == nil || cfg.Factories.Dataplane == nil {
		return nil, errors.New("daemon: registry and dataplane factory are required")
	}
	if !cfg.Node.PublicIP.IsValid() && !cfg.Node.PublicIPv6.IsValid() {
		return nil, errors.New("daemon: no public address for this node")
	}
	if cfg.SubnetFile == "" {
		cfg.SubnetFile = subnet.DefaultSubnetFile
	}
	if cfg.RenewMargin <= 0 {
		cfg.RenewMargin = time.Hour
	}
	if cfg.RetryInterval <= 0 {
		cfg.RetryInterval = time.Minute
	}
	if cfg.Node.UnderlayMTU == 0 {
		cfg.Node.UnderlayMTU = 1500
	}
	if cfg.Rejections == nil {
		cfg.Rejections = subnet.NewRejections(log.With("component", "daemon"), cfg.Metrics.LeaseRejected)
	}
	if cfg.Factories.Policy != nil {
		cfg.Metrics.policyEnabled()
	}
	return &Daemon{cfg: cfg, log: log.With("component", "daemon")}, nil
}

// Ready reports whether the subnet file is written, the dataplane has
// programmed its first table and, when NetworkPolicy is enforced, the last
// transaction of the current session's controller committed.
func (d *Daemon) Ready() bool {
	if d.cfg.Factories.Policy == nil {
		return d.ready.Load()
	}
	s := d.policy.Load()
	return d.ready.Load() && s != nil && s.committed.Load()
}

// current says whether s is the current session's state: a controller of
// an ended session has no say in readiness.
func (s *policySession) current() bool { return s.d.policy.Load() == s }

// Programmed records the outcome of a network policy transaction
// (PolicyReporter): readiness follows it.
func (s *policySession) Programmed(err error) {
	d := s.d
	d.cfg.Metrics.policyProgrammed(err)
	if err != nil {
		if s.committed.Swap(false) && d.ready.Load() && s.current() {
			d.log.Error("not ready: network policy cannot be programmed (retrying)", "err", err)
		}
	} else {
		s.committed.Store(true)
		s.once.Do(func() { close(s.first) })
	}
	d.cfg.Metrics.setReady(d.Ready())
}

// SourceChecks records whether pods' source addresses are checked
// (PolicyReporter).
func (s *policySession) SourceChecks(err error) { s.d.cfg.Metrics.policySourceChecks(err) }

// CannotEnforce records that this node cannot enforce network policy
// (PolicyReporter): said once; the daemon stays not ready.
func (s *policySession) CannotEnforce(err error) {
	d := s.d
	s.committed.Store(false)
	d.cfg.Metrics.policyCannot()
	if !s.cannot.Swap(true) && s.current() {
		d.log.Error("network policy cannot be enforced on this node: the dataplane runs, weftd reports not ready", "err", err)
	}
	d.cfg.Metrics.setReady(d.Ready())
}

// Lease returns the lease the daemon runs on, or nil before the first.
func (d *Daemon) Lease() *subnet.Lease { return d.lease.Load() }

// Run runs until ctx is done. It returns nil on cancellation and leaves the
// lease and the dataplane in place, so that a restart drops no traffic.
func (d *Daemon) Run(ctx context.Context) error {
	cfg, err := d.networkConfig(ctx)
	if err != nil {
		return ignoreCanceled(ctx, err)
	}
	typ := cfg.Backend.Type
	if d.cfg.BackendType != "" {
		typ = d.cfg.BackendType
	}
	if err := subnet.CheckBackendType(typ); err != nil {
		return fmt.Errorf("daemon: %w", err)
	}
	d.log.Info("network config", "network", cfg.Network, "ipv6Network", cfg.IPv6Network, "backend", typ, "vni", cfg.Backend.VNI, "port", cfg.Backend.Port)

	var fwd Runner
	if d.cfg.Factories.Forward != nil {
		if fwd, err = d.cfg.Factories.Forward(cfg); err != nil {
			return fmt.Errorf("daemon: forward rules: %w", err)
		}
	}
	var fl Runner
	if d.cfg.Factories.Flows != nil {
		if fl, err = d.cfg.Factories.Flows(cfg); err != nil {
			return fmt.Errorf("daemon: flows: %w", err)
		}
	}
	g, gctx := errgroup.WithContext(ctx)
	if fwd != nil {
		g.Go(func() error { return fwd.Run(gctx) })
	}
	if fl != nil {
		g.Go(func() error { return fl.Run(gctx) })
	}
	g.Go(func() error { return d.leaseLoop(gctx, cfg, typ) })
	return ignoreCanceled(ctx, g.Wait())
}

func ignoreCanceled(ctx context.Context, err error) error {
	if ctx.Err() != nil && (err == nil || errors.Is(err, context.Canceled) || errors.Is(err, ctx.Err())) {
		return nil
	}
	return err
}

// networkConfig reads the network config, retrying until it is available:
// an operator may write it after starting the daemons.
func (d *Daemon) networkConfig(ctx context.Context) (*subnet.Config, error) {
	for {
		cfg, err := d.cfg.Registry.Config(ctx)
		if err == nil {
			return cfg, nil
		}
		d.log.Warn("cannot read the network config, retrying", "err", err, "retryIn", d.retryDelay())
		if err := sleep(ctx, d.retryDelay()); err != nil {
			return nil, err
		}
	}
}

// retryDelay is how long to wait before retrying a failed datastore call: the
// retry interval, but never more than 5 s while nothing is set up yet.
func (d *Daemon) retryDelay() time.Duration { return min(d.cfg.RetryInterval, 5*time.Second) }

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
