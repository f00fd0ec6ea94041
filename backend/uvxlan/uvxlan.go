package uvxlan

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/weft-net/weft/backend"
	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/vtep"
)

// Config configures a userspace VXLAN backend on one node.
type Config struct {
	// Handle is a netlink handle bound to the node's network namespace. When
	// nil, one is opened in NetNS (or in the current namespace).
	Handle *netlink.Handle
	// NetNS is the path of the node's network namespace (for example
	// /run/netns/node1). The TAP and the UDP sockets are opened inside it.
	// Empty means the namespace of the calling process.
	NetNS string

	// One Backend carries one address family, as in Flannel: IPv4 subnets
	// over an IPv4 underlay (Local and Subnet), or IPv6 subnets over an IPv6
	// underlay (Local and IPv6Subnet). A dual-stack node runs two, the
	// second with its own Name (for example "weft-u6.1").

	Name  string     // TAP device name; default DeviceName(VNI)
	VNI   int        // VXLAN network identifier; default 1
	Port  int        // UDP port, ours and the peers'; default 8472
	Local netip.Addr // this node's underlay address, IPv4 or IPv6
	// MAC is the VTEP MAC the node advertises in its lease; zero means
	// backend.VTEPMAC(Local, VNI). It must be stable across restarts.
	MAC subnet.MAC
	MTU int // overlay MTU (underlay MTU − 50 on IPv4, − 70 on IPv6); default for 1500
	// Subnet is this node's IPv4 subnet when Local is IPv4: <Subnet>.0/32
	// goes on the TAP.
	Subnet netip.Prefix
	// IPv6Subnet is this node's IPv6 subnet when Local is IPv6:
	// <IPv6Subnet>::/128 goes on the TAP.
	IPv6Subnet netip.Prefix

	// Plain turns the offloads off: the TAP is opened with water (which
	// cannot set IFF_VNET_HDR), every frame costs a TAP read or write, and
	// UDP GSO/GRO are not used. It exists for comparison and as a fallback
	// for kernels without TAP offloads.
	Plain bool
	// Queues is how many TAP queues and receive sockets there are, each with
	// its own egress and ingress goroutine; default 1. With more, the TAP is
	// multi-queue (the kernel spreads flows over the queues) and the receive
	// sockets share the port with SO_REUSEPORT (the kernel spreads peers'
	// source ports over them). A persistent TAP keeps its queue mode: change
	// Queues between 1 and more only after RemoveDevice.
	Queues int
	// SourcePorts is how many UDP sockets, each on its own ephemeral port of
	// the local port range, encapsulated frames leave from; the inner flow
	// hash picks one. Default 16.
	SourcePorts int
	// Reconcile is how often the neighbours and routes are re-checked and
	// repaired; default 30s.
	Reconcile time.Duration
}

// DeviceName is the default name of the TAP device for vni ("weft-u.1").
func DeviceName(vni int) string { return fmt.Sprintf("weft-u.%d", vni) }

func (c *Config) setDefaults() error {
	if c.VNI == 0 {
		c.VNI = subnet.DefaultVNI
	}
	if c.Port == 0 {
		c.Port = subnet.DefaultVXLANPort
	}
	if c.Name == "" {
		c.Name = DeviceName(c.VNI)
	}
	if c.MAC.IsZero() && c.Local.IsValid() {
		c.MAC = backend.VTEPMAC(c.Local.Unmap(), c.VNI)
	}
	if c.MTU == 0 {
		c.MTU = backend.OverlayMTU(1500, c.Local.Is6())
	}
	if c.Queues == 0 {
		c.Queues = 1
	}
	if c.SourcePorts == 0 {
		c.SourcePorts = 16
	}
	if c.Reconcile == 0 {
		c.Reconcile = 30 * time.Second
	}
	switch {
	case c.VNI < 0 || c.VNI > maxVNI:
		return fmt.Errorf("vni %d out of range", c.VNI)
	case c.Port < 1 || c.Port > 65535:
		return fmt.Errorf("port %d out of range", c.Port)
	case len(c.Name) > 15:
		return fmt.Errorf("device name %q longer than 15 bytes", c.Name)
	case !c.Local.IsValid():
		return errors.New("no local underlay address")
	case c.MAC[0]&1 != 0:
		return fmt.Errorf("vtep mac %s is not a unicast address", c.MAC)
	case c.MTU < 576 || c.MTU > 65000:
		return fmt.Errorf("mtu %d out of range", c.MTU)
	case c.Subnet.IsValid() && (!c.Subnet.Addr().Is4() || c.Local.Unmap().Is6()):
		return fmt.Errorf("subnet %s needs an IPv4 subnet and local address", c.Subnet)
	case c.IPv6Subnet.IsValid() && (!c.IPv6Subnet.Addr().Is6() || !c.Local.Unmap().Is6()):
		return fmt.Errorf("ipv6 subnet %s needs an IPv6 subnet and local address", c.IPv6Subnet)
	case c.Queues < 1 || c.Queues > 16:
		return fmt.Errorf("queues %d out of range", c.Queues)
	case c.SourcePorts < 1 || c.SourcePorts > 256:
		return fmt.Errorf("source ports %d out of range", c.SourcePorts)
	}
	c.Local = c.Local.Unmap()
	return nil
}

// Backend is the userspace VXLAN dataplane of one node. Create it with New.
type Backend struct {
	cfg Config
	log *slog.Logger
	dec decoder

	peers atomic.Pointer[peers]      // read by the packet loops
	table atomic.Pointer[vtep.Table] // latest table handed to Set
	kick  chan struct{}              // Set → reconciler, capacity 1

	ready     chan struct{}
	readyOnce sync.Once
	ctr       counters
}

var _ backend.Backend = (*Backend)(nil)

// New checks cfg and returns a backend that does nothing until Run.
func New(cfg Config, log *slog.Logger) (*Backend, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, fmt.Errorf("uvxlan config: %w", err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	b := &Backend{
		cfg:   cfg,
		log:   log.With("component", "uvxlan", "dev", cfg.Name),
		dec:   decoder{vni: uint32(cfg.VNI), mac: cfg.MAC, maxFrame: ethHeaderLen + cfg.MTU},
		kick:  make(chan struct{}, 1),
		ready: make(chan struct{}),
	}
	b.peers.Store(newPeers(nil, cfg.Port, cfg.Local.Is6()))
	return b, nil
}

// Set hands the backend a new peer table. The packet loops see it at once
// (an atomic pointer swap); neighbours and routes follow in Run. t must not
// be modified afterwards.
func (b *Backend) Set(t vtep.Table) {
	b.table.Store(&t)
	b.peers.Store(newPeers(t, b.cfg.Port, b.cfg.Local.Is6()))
	select {
	case b.kick <- struct{}{}:
	default:
	}
}

// Ready is closed once the device is up and the first table handed to Set
// is programmed.
func (b *Backend) Ready() <-chan struct{} { return b.ready }

// Stats returns the frame, drop, repair and event counters; drops are
// keyed by DropReason.String().
func (b *Backend) Stats() backend.Stats { return b.ctr.stats() }

// Config returns the configuration with its defaults filled in.
func (b *Backend) Config() Config { return b.cfg }

// Run creates (or re-attaches to) the TAP device, opens the sockets, moves
// frames until ctx is done and then returns after its goroutines exit. The
// device, its address, neighbours and routes stay in place on return (the
// TAP is persistent), so a restarting daemon keeps its routes; RemoveDevice
// deletes them.
func (b *Backend) Run(ctx context.Context) error {
	dp, err := b.open()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	var wg sync.WaitGroup
	loop := func(name string, f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(); err != nil && ctx.Err() == nil {
				cancel(fmt.Errorf("uvxlan %s: %w", name, err))
			}
		}()
	}
	for q := range b.cfg.Queues {
		loop(fmt.Sprintf("egress %d", q), func() error { return dp.egress(q) })
		loop(fmt.Sprintf("ingress %d", q), func() error { return dp.ingress(q) })
	}
	loop("reconcile", func() error { return b.reconcileLoop(ctx, dp) })
	<-ctx.Done()
	dp.close()
	wg.Wait()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// reconcileLoop programs neighbours and routes on every Set and every
// b.cfg.Reconcile, repairing drift; the timer also re-checks the device's
// MAC, MTU, address and state.
func (b *Backend) reconcileLoop(ctx context.Context, dp *datapath) error {
	tick := time.NewTicker(b.cfg.Reconcile)
	defer tick.Stop()
	for {
		if t := b.table.Load(); t != nil {
			if err := dp.program(*t); err != nil {
				b.log.Error("program peers", "err", err)
			} else {
				b.readyOnce.Do(func() { close(b.ready) })
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-b.kick:
		case <-tick.C:
			if err := dp.configureLink(); err != nil {
				b.log.Error("repair device", "err", err)
			}
		}
	}
}
