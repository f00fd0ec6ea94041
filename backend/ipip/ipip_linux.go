package ipip

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/weft-net/weft/backend"
	"github.com/weft-net/weft/backend/kernel"
	"github.com/weft-net/weft/vtep"
)

// Config describes the node. The zero value of an optional field means its
// default.
type Config struct {
	// Handle is bound to the node's network namespace. Required.
	Handle *netlink.Handle
	// NetNS is the path of the namespace Handle is bound to, for change
	// notifications; empty means the namespace weftd runs in.
	NetNS string
	// UnderlayIndex is the underlay device's link index. Required.
	UnderlayIndex int
	// Local is the underlay's IPv4 address, the tunnel's local end; a
	// table row naming it is never programmed. Required.
	Local netip.Addr
	// Subnet is this node's subnet: its first address goes on the device,
	// and a table row naming it is never programmed. Required.
	Subnet netip.Prefix
	// MTU of the device; 0 means the underlay's MTU minus Overhead.
	MTU int
	// DirectRouting routes a peer on this node's L2 segment over the
	// underlay, unencapsulated.
	DirectRouting bool
	// ResyncInterval is the period of the full resync; 0 means
	// kernel.DefaultResync.
	ResyncInterval time.Duration
}

// Backend is the ipip dataplane (see the package documentation).
type Backend struct {
	cfg             Config
	log             *slog.Logger
	*kernel.Desired // Set, Ready

	running       atomic.Bool
	deviceRepairs atomic.Uint64
	routeRepairs  atomic.Uint64

	// Owned by Run.
	index   int // the device's, 0 before it was first made
	overlay *kernel.Overlay
	applied vtep.Table // the table last programmed in full, nil before
}

var _ backend.Backend = (*Backend)(nil)

// New validates cfg and returns a backend that programs nothing until Run.
func New(cfg Config, log *slog.Logger) (*Backend, error) {
	switch {
	case cfg.Handle == nil:
		return nil, errors.New("ipip config: no netlink handle")
	case cfg.UnderlayIndex <= 0:
		return nil, errors.New("ipip config: no underlay link index")
	case !cfg.Local.Is4():
		return nil, fmt.Errorf("ipip config: local address %s: IPIP needs the underlay's IPv4 address", cfg.Local)
	case !cfg.Subnet.Addr().Is4():
		return nil, fmt.Errorf("ipip config: subnet %s: IPIP carries IPv4 only", cfg.Subnet)
	case cfg.MTU < 0:
		return nil, fmt.Errorf("ipip config: MTU %d: must not be negative", cfg.MTU)
	}
	if cfg.ResyncInterval <= 0 {
		cfg.ResyncInterval = kernel.DefaultResync
	}
	return &Backend{cfg: cfg, log: log.With("component", "ipip"), Desired: kernel.NewDesired()}, nil
}

// Run creates or adopts the device, programs the latest table and keeps
// repairing drift until ctx is done. It leaves the device and the routes in
// place when it returns.
func (b *Backend) Run(ctx context.Context) error {
	if !b.running.CompareAndSwap(false, true) {
		return errors.New("ipip backend: already running")
	}
	defer b.running.Store(false)
	r := &kernel.Reconciler{
		NetNS:  b.cfg.NetNS,
		Log:    b.log,
		Resync: b.cfg.ResyncInterval,
		Kick:   b.Kick(),
		Sync:   b.sync,
		Drift:  b.drift,
	}
	if err := r.Run(ctx); err != nil {
		return fmt.Errorf("ipip backend: %w", err)
	}
	return nil
}

// spec is the device as it must be.
func (b *Backend) spec() (deviceSpec, error) {
	mtu := b.cfg.MTU
	if mtu == 0 {
		u, err := b.cfg.Handle.LinkByIndex(b.cfg.UnderlayIndex)
		if err != nil {
			return deviceSpec{}, fmt.Errorf("find underlay link %d: %w", b.cfg.UnderlayIndex, err)
		}
		mtu = u.Attrs().MTU - Overhead
	}
	return deviceSpec{local: b.cfg.Local, addr: netip.PrefixFrom(kernel.Gateway(b.cfg.Subnet), 32), mtu: mtu}, nil
}

// sync makes the device and the routes match the latest table. Every sync
// reads the kernel: with DirectRouting, whether a peer is on-link depends on
// the underlay, not only on the table.
func (b *Backend) sync(bool) error {
	s, err := b.spec()
	if err != nil {
		return err
	}
	idx, created, err := ensureDevice(b.cfg.Handle, s, b.log)
	if err != nil {
		return err
	}
	if created && b.index != 0 {
		b.deviceRepairs.Add(1)
		b.log.Warn("repaired device", "device", DeviceName, "old_index", b.index, "index", idx)
	}
	if idx != b.index || b.overlay == nil {
		b.index = idx
		b.overlay = kernel.NewOverlay(b.cfg.Handle, idx, kernel.OverlayOptions{
			Family: netlink.FAMILY_V4, ViaPeer: true, DirectRouting: b.cfg.DirectRouting})
	}
	tp := b.Table()
	if tp == nil {
		return nil
	}
	t := b.withoutSelf(*tp)
	start := time.Now()
	st, err := b.overlay.Sync(t)
	if st.Changed() && !created && b.applied != nil && maps.Equal(b.applied, t) {
		b.routeRepairs.Add(uint64(st.RouteSet + st.RouteDel))
		b.log.Warn("repaired drift", "route", st.RouteSet+st.RouteDel)
	}
	if err != nil {
		return fmt.Errorf("sync routes on %s: %w", DeviceName, err)
	}
	b.log.Debug("synced routes", "peers", len(t), "took", time.Since(start))
	b.applied = t
	if b.MarkReady() {
		b.log.Info("dataplane ready", "peers", len(t))
	}
	return nil
}

// drift is what calls for a sync between two periodic ones: the device or
// one of its addresses changed or gone, a route of weft's deleted or
// changed, another owner's route to a peer subnet, and with DirectRouting
// any change of the underlay device or its addresses.
func (b *Backend) drift() kernel.Drift {
	od := kernel.NewOverlayDrift(b.applied, map[string]int{DeviceName: b.index})
	d := od.Drift()
	d.Neigh = nil // an IPIP tunnel has no neighbours
	if b.cfg.DirectRouting {
		u := b.cfg.UnderlayIndex
		link, addr := d.Link, d.Addr
		d.Link = func(l netlink.LinkUpdate) bool { return int(l.Index) == u || link(l) }
		d.Addr = func(a netlink.AddrUpdate) bool { return a.LinkIndex == u || addr(a) }
	}
	return d
}

// withoutSelf drops rows that describe this node, and rows that are not
// IPv4 (IPIP carries IPv4 only).
func (b *Backend) withoutSelf(t vtep.Table) vtep.Table {
	drop := func(p netip.Prefix, v vtep.Peer) bool {
		return p == b.cfg.Subnet.Masked() || v.Addr == b.cfg.Local || !p.Addr().Is4() || !v.Addr.Is4()
	}
	out := maps.Clone(t)
	maps.DeleteFunc(out, drop)
	return out
}

// Stats reports the repairs and, as frames and drops, the device's packet
// counters as the kernel keeps them.
func (b *Backend) Stats() backend.Stats {
	st := backend.Stats{Repairs: map[string]uint64{
		"device": b.deviceRepairs.Load(), "route": b.routeRepairs.Load()}}
	l, err := b.cfg.Handle.LinkByName(DeviceName)
	if err != nil || l.Attrs().Statistics == nil {
		return st
	}
	ls := l.Attrs().Statistics
	st.TxFrames, st.RxFrames = ls.TxPackets, ls.RxPackets
	st.Drops = map[string]uint64{"tx_dropped": ls.TxDropped, "rx_dropped": ls.RxDropped,
		"tx_errors": ls.TxErrors, "rx_errors": ls.RxErrors}
	return st
}
