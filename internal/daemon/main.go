package daemon

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"

	"github.com/weft-net/weft/internal/fdstore"
	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/subnet/etcd"
)

// Main is weftd's main: it runs weftd with the process's arguments until
// SIGINT or SIGTERM and exits 1 on an error.
func Main(version string) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := Run(ctx, os.Args[0], os.Args[1:], version); err != nil {
		if errors.Is(err, flag.ErrHelp) { // -h, --help: the usage was printed
			return
		}
		fmt.Fprintln(os.Stderr, "weftd:", err)
		stop()
		os.Exit(1)
	}
}

// Run runs weftd with args (prog is the name it was started as: as
// "flanneld" it takes flanneld's defaults) until ctx ends.
func Run(ctx context.Context, prog string, args []string, version string) error {
	c, err := parseFlags(prog, args, os.Stderr)
	if err != nil {
		return err
	}
	if c.version {
		fmt.Println("weftd", version)
		return nil
	}
	log, err := newLogger(c.logFormat, c.logLevel, os.Stderr)
	if err != nil {
		return err
	}
	files, err := fdstore.FromEnv(log)
	if err != nil {
		log.Warn("ignoring the files passed by the service manager", "err", err)
	}
	if names := files.Unclaimed(); len(names) > 0 {
		log.Info("service manager passed files kept from the last run", "names", names)
	}
	log.Info("starting weftd", "version", version, "flannelCompat", c.compat, "kubernetesClient", kubeClientBuilt)
	logFlannelFlags(c, log)

	// The registry first: a configuration error stops weftd before it
	// changes anything in the kernel.
	live := &liveBackend{}
	metricsReg, metrics := newMetrics(live)
	rej := subnet.NewRejections(log, metrics.LeaseRejected)
	reg, etcdClient, closeReg, err := newRegistry(ctx, c, rej, log)
	if err != nil {
		return err
	}
	defer closeReg()
	fl, err := newFlows(c, metricsReg)
	if err != nil {
		return err
	}
	p := &process{c: c, reg: reg, etcd: etcdClient, live: live, metrics: metrics,
		rej: rej, files: files, flows: fl, log: log}
	// STOPPING=1 once, when weftd stops: not between the node's runs (the
	// service manager would take it for a stop and kill weftd after its
	// stop timeout).
	sctx, stop := context.WithCancel(ctx)
	stopped := make(chan struct{})
	go func() { notifyStopping(sctx, files, log); close(stopped) }()
	defer func() { stop(); <-stopped }()
	// The health server outlives the node's runs: between two of them
	// weftd is alive (kubelet's liveness probe must not kill it) but not
	// ready.
	g, gctx := errgroup.WithContext(ctx)
	hctx, stopHealth := context.WithCancel(gctx)
	defer stopHealth()
	if c.healthAddr != "" {
		hs := NewHealthServer(c.healthAddr, p.status.Ready, log)
		hs.Why = p.status.Why
		mountMetrics(hs, metricsReg)
		if fl != nil {
			fl.mount(hs, flowNode(c))
		}
		g.Go(func() error { return hs.Run(hctx) })
	}
	g.Go(func() error {
		defer stopHealth()
		for {
			err := p.runNode(gctx)
			ch, ok := errors.AsType[*underlayChanged](err)
			if !ok || gctx.Err() != nil {
				log.Info("weftd stopped; lease and dataplane left in place")
				return ignoreCanceled(gctx, err)
			}
			log.Warn("the underlay changed: starting the node again on it", "change", ch.Error())
			p.status.between("the underlay changed (" + ch.Error() + "): starting the node again on it")
		}
	})
	return g.Wait()
}

// nodeStatus answers the health server for the node's current run.
type nodeStatus struct {
	d   atomic.Pointer[Daemon]
	gap atomic.Pointer[string] // why no run is current, once one ended
}

func (s *nodeStatus) set(d *Daemon) { s.d.Store(d) }

func (s *nodeStatus) between(why string) {
	s.gap.Store(&why)
	s.d.Store(nil)
}

// Ready reports whether the current run is ready.
func (s *nodeStatus) Ready() bool {
	d := s.d.Load()
	return d != nil && d.Ready()
}

// Why says what the node waits for.
func (s *nodeStatus) Why() string {
	if d := s.d.Load(); d != nil {
		return d.Waiting()
	}
	if g := s.gap.Load(); g != nil {
		return *g
	}
	return "starting"
}

// process is what weftd keeps across the node's runs: its flags, registry,
// metrics and the files the service manager passed.
type process struct {
	c       *config
	reg     subnet.Registry
	etcd    *clientv3.Client // nil in Kubernetes mode
	live    *liveBackend
	metrics *Metrics
	rej     *subnet.Rejections
	files   *fdstore.Store
	flows   *flows // nil: --flows off
	log     *slog.Logger
	status  nodeStatus
}

// runNode finds the underlay and runs the node on it (lease, dataplane,
// presence) until ctx ends or the underlay changes under it (an
// *underlayChanged): then it moves the lease to the underlay's new address,
// if it has one, and returns so that Run starts the node again on it.
func (p *process) runNode(ctx context.Context) error {
	c, log := p.c, p.log
	node, underlay, err := findNode(ctx, c, p.reg, log)
	if err != nil {
		return ignoreCanceled(ctx, err)
	}
	reg := p.reg
	if c.kubeSubnetMgr && !c.setNodeNetUnav {
		reg = registryOnly{reg}
	}
	log.Info("underlay", "device", underlay.name, "index", underlay.index, "mtu", underlay.mtu,
		"publicIP", node.PublicIP, "publicIPv6", node.PublicIPv6)
	if err := enableForwarding(forwardIPv4, log); err != nil {
		return err
	}
	var presence *etcd.Presence
	if p.etcd != nil {
		if presence, err = newPresence(c, p.etcd, node, log); err != nil {
			return err
		}
	}
	f := factories(c, underlay, p.live, p.files, log)
	if f.Policy, err = policyFactory(c, log); err != nil {
		return err
	}
	if p.flows != nil {
		f.Flows = p.flows.factory(c, log)
	}
	d, err := New(Config{
		Registry: reg, Node: node, Metrics: p.metrics, Rejections: p.rej, Factories: f,
		SubnetFile: c.subnetFile, IPMasq: c.ipMasq, BackendType: c.backend, RenewMargin: c.renewMargin,
		Notifier: p.files, Presence: presenceOrNil(presence),
	}, log)
	if err != nil {
		return err
	}
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return d.Run(gctx) })
	if presence != nil {
		g.Go(func() error { return presence.Run(gctx) })
	}
	g.Go(func() error { return newAddrWatch(underlay, node, log).Run(gctx) })
	p.status.set(d)
	err = g.Wait()
	if ch, ok := errors.AsType[*underlayChanged](err); ok && ch.old.IsValid() && ctx.Err() == nil {
		mctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if merr := d.MoveLease(mctx, ch.now); merr != nil {
			log.Error("cannot move the lease to the new address; the next run takes another subnet", "err", merr)
		}
		cancel()
	}
	return err
}

// notifyStopping tells the service manager STOPPING=1 when ctx ends.
func notifyStopping(ctx context.Context, n Notifier, log *slog.Logger) {
	<-ctx.Done()
	if err := n.Notify("STOPPING=1"); err != nil {
		log.Warn("cannot tell the service manager that weftd is stopping", "err", err)
	}
}

// nodePublicIPer is a registry that stores the addresses an operator chose
// for this node (Kubernetes: the node-public-ip annotations).
type nodePublicIPer interface {
	NodePublicIPs(ctx context.Context) (v4, v6 netip.Addr, err error)
}

// publicIPs are the addresses this node is told to advertise: --public-ip
// and --public-ipv6, or the registry's node-public-ip(v6), which win over
// the flags as they do for flanneld. Either may be invalid (not set). They
// choose the underlay device when no flag names it (findUnderlay).
func publicIPs(ctx context.Context, c *config, reg subnet.Registry, log *slog.Logger) (v4, v6 netip.Addr, err error) {
	if c.publicIP != "" {
		if v4, err = parseAddr("--public-ip", c.publicIP, false); err != nil {
			return v4, v6, err
		}
	}
	if c.publicIPv6 != "" {
		if v6, err = parseAddr("--public-ipv6", c.publicIPv6, true); err != nil {
			return v4, v6, err
		}
	}
	s, ok := reg.(nodePublicIPer)
	if !ok {
		return v4, v6, nil
	}
	// The registry may not be reachable yet, or the Node not created yet,
	// or its annotation wrong: retry, as for the network config.
	var a4, a6 netip.Addr
	for delay := 200 * time.Millisecond; ; delay = min(2*delay, 5*time.Second) {
		if a4, a6, err = s.NodePublicIPs(ctx); err == nil {
			break
		}
		log.Warn("cannot read this node's public IP annotations, retrying", "err", err, "retryIn", delay)
		if err := sleep(ctx, delay); err != nil {
			return v4, v6, err
		}
	}
	if a4.IsValid() || a6.IsValid() {
		log.Info("public IP set by the node-public-ip annotations", "publicIP", a4, "publicIPv6", a6)
	}
	if a4.IsValid() {
		v4 = a4
	}
	if a6.IsValid() {
		v6 = a6
	}
	return v4, v6, nil
}

// findNode picks the underlay device, with the help of the addresses set
// by flag or annotation (publicIPs), and the addresses to advertise: the
// flags', else the underlay's. The registry applies the annotations to what
// it publishes itself.
func findNode(ctx context.Context, c *config, reg subnet.Registry, log *slog.Logger) (Node, underlayInfo, error) {
	pub4, pub6, err := publicIPs(ctx, c, reg, log)
	if err != nil {
		return Node{}, underlayInfo{}, err
	}
	u, err := findUnderlay(c, pub4, pub6, log)
	if err != nil {
		return Node{}, u, err
	}
	n := Node{PublicIP: u.ipv4, PublicIPv6: u.ipv6, UnderlayMTU: u.mtu}
	u.picked4 = c.publicIP == "" && !pub4.IsValid()
	u.picked6 = c.publicIPv6 == "" && !pub6.IsValid()
	if c.publicIP != "" {
		if n.PublicIP, err = parseAddr("--public-ip", c.publicIP, false); err != nil {
			return n, u, err
		}
	}
	if c.publicIPv6 != "" {
		if n.PublicIPv6, err = parseAddr("--public-ipv6", c.publicIPv6, true); err != nil {
			return n, u, err
		}
	}
	if !n.PublicIP.IsValid() && !n.PublicIPv6.IsValid() {
		return n, u, fmt.Errorf("underlay %s has no global address: set --public-ip or pick another --iface", u.name)
	}
	return n, u, nil
}

func parseAddr(flagName, s string, v6 bool) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%s %q: %w", flagName, s, err)
	}
	if a.Is6() != v6 {
		return netip.Addr{}, fmt.Errorf("%s %q: wrong address family", flagName, s)
	}
	return a, nil
}

// newRegistry builds the etcd or the Kubernetes registry; the etcd client
// is returned too (nil in Kubernetes mode).
func newRegistry(ctx context.Context, c *config, rej *subnet.Rejections, log *slog.Logger) (subnet.Registry, *clientv3.Client, func(), error) {
	if c.kubeSubnetMgr {
		reg, err := newKubeRegistry(ctx, c, rej, log)
		if err != nil {
			return nil, nil, nil, err
		}
		return reg, nil, func() {}, nil
	}
	client, err := etcd.NewClient(c.etcd.ClientConfig())
	if err != nil {
		return nil, nil, nil, err
	}
	reg := etcd.New(client, etcd.Options{Prefix: c.etcd.Prefix, TTL: c.leaseTTL, Rejections: rej}, log)
	return reg, client, func() { client.Close() }, nil
}

// newPresence is the record that this node (--node-name, else the host
// name) advertises its public addresses (etcd mode; Kubernetes names each
// node's lease after the node).
func newPresence(c *config, client *clientv3.Client, node Node, log *slog.Logger) (*etcd.Presence, error) {
	name := c.nodeName
	if name == "" {
		var err error
		if name, err = os.Hostname(); err != nil {
			return nil, fmt.Errorf("this node's name for its presence record: %w (set --node-name)", err)
		}
	}
	token, err := instanceToken(c.subnetFile+".instance", bootID(), log)
	if err != nil {
		return nil, err
	}
	return etcd.NewPresence(client, etcd.PresenceOwner{Node: name, Instance: token}, []netip.Addr{node.PublicIP, node.PublicIPv6},
		etcd.PresenceOptions{Prefix: c.etcd.Prefix, TTL: c.presenceTTL}, log)
}

// instanceToken is this weftd's instance (etcd.PresenceOwner): kept in
// path (the subnet file's name plus ".instance", so two weftd with their
// own subnet files have their own) with the boot it was made in, so that
// weftd's restarts keep it and a reboot, or a machine cloned from this
// one's disk, makes a new one. A token that cannot be kept still works for
// this process: a restart then waits for its own record to expire, which
// weftd logs.
func instanceToken(path, bootID string, log *slog.Logger) (string, error) {
	if b, err := os.ReadFile(path); err == nil {
		boot, t, ok := strings.Cut(strings.TrimSpace(string(b)), " ")
		if ok && boot == bootID && len(t) == 32 && strings.Trim(t, "0123456789abcdef") == "" {
			return t, nil
		}
	}
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("instance token: %w", err)
	}
	t := hex.EncodeToString(b[:])
	if err := writeAtomic(path, []byte(bootID+" "+t+"\n")); err != nil {
		log.Warn("cannot keep the instance token; a restart of weftd waits for its presence record to expire", "path", path, "err", err)
	}
	return t, nil
}

// writeAtomic writes data to path through a temporary file renamed over
// it, so that a reader sees the old content or the new.
func writeAtomic(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	_, werr := f.Write(data)
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(f.Name(), path)
	}
	if werr != nil {
		os.Remove(f.Name())
	}
	return werr
}

// bootID is the kernel's identifier of this boot ("unknown" where it
// cannot be read: the token then lives as long as its file).
func bootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil || len(strings.Fields(string(b))) != 1 {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}

// presenceOrNil keeps a nil *etcd.Presence a nil interface.
func presenceOrNil(p *etcd.Presence) Presence {
	if p == nil {
		return nil
	}
	return p
}

// logFlannelFlags logs the names of the FLANNELD_* variables weftd read
// (never their values: FLANNELD_ETCD_PASSWORD is a secret) and the flanneld
// flags it accepted but does not act on.
func logFlannelFlags(c *config, log *slog.Logger) {
	if len(c.envApplied) > 0 {
		log.Info("flags set from flanneld's environment variables", "variables", c.envApplied)
	}
	for _, f := range c.ignored() {
		log.Warn("flanneld flag accepted but ignored", "flag", f.flag, "reason", f.reason)
	}
}

// registryOnly hides the registry's SetNetworkAvailable, for
// --set-node-network-unavailable=false: the node condition is left alone.
type registryOnly struct{ subnet.Registry }
