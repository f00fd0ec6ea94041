package daemon

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sync/errgroup"

	"github.com/weft-net/weft/internal/fdstore"
	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/subnet/etcd"
)

// Main is weftd's main: it runs weftd with the process's arguments until
// SIGINT or SIGTERM and exits 1 on an error.
func Main(version string) {
	tuneGC()
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
	reg, closeReg, err := newRegistry(ctx, c, rej, log)
	if err != nil {
		return err
	}
	defer closeReg()

	node, underlay, err := findNode(c)
	if err != nil {
		return err
	}
	log.Info("underlay", "device", underlay.name, "mtu", underlay.mtu, "publicIP", node.PublicIP, "publicIPv6", node.PublicIPv6)
	if err := enableForwarding(forwardIPv4, log); err != nil {
		return err
	}

	d, err := New(Config{
		Registry:    reg,
		Node:        node,
		Metrics:     metrics,
		Rejections:  rej,
		Factories:   factories(c, underlay, live, files, log),
		SubnetFile:  c.subnetFile,
		IPMasq:      c.ipMasq,
		BackendType: c.backend,
		RenewMargin: c.renewMargin,
		Notifier:    files,
	}, log)
	if err != nil {
		return err
	}
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return d.Run(gctx) })
	if c.healthAddr != "" {
		hs := NewHealthServer(c.healthAddr, d.Ready, log)
		mountMetrics(hs, metricsReg)
		g.Go(func() error { return hs.Run(gctx) })
	}
	g.Go(func() error {
		<-gctx.Done()
		if err := files.Notify("STOPPING=1"); err != nil {
			log.Warn("cannot tell the service manager that weftd is stopping", "err", err)
		}
		return nil
	})
	err = g.Wait()
	log.Info("weftd stopped; lease and dataplane left in place")
	return err
}

// findNode picks the underlay device and the addresses to advertise.
func findNode(c *config) (Node, underlayInfo, error) {
	u, err := findUnderlay(c)
	if err != nil {
		return Node{}, u, err
	}
	n := Node{PublicIP: u.ipv4, PublicIPv6: u.ipv6, UnderlayMTU: u.mtu}
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

// newRegistry builds the etcd or the Kubernetes registry.
func newRegistry(ctx context.Context, c *config, rej *subnet.Rejections, log *slog.Logger) (subnet.Registry, func(), error) {
	if c.kubeSubnetMgr {
		reg, err := newKubeRegistry(ctx, c, rej, log)
		if err != nil {
			return nil, nil, err
		}
		if !c.setNodeNetUnav {
			reg = registryOnly{reg}
		}
		return reg, func() {}, nil
	}
	client, err := etcd.NewClient(c.etcd.ClientConfig())
	if err != nil {
		return nil, nil, err
	}
	reg := etcd.New(client, etcd.Options{Prefix: c.etcd.Prefix, TTL: c.leaseTTL, Rejections: rej}, log)
	return reg, func() { client.Close() }, nil
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
