package hostgw

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
	"github.com/weft-net/weft/backend/nft"
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
	// UnderlayIndex is the underlay device's link index: a change of it or
	// of its addresses calls for a sync. Required.
	UnderlayIndex int
	// Local, LocalIPv6, Subnet and IPv6Subnet describe this node; a table
	// row naming one of them is never programmed.
	Local, LocalIPv6   netip.Addr
	Subnet, IPv6Subnet netip.Prefix
	// Network and IPv6Network are the cluster networks: a packet from the
	// underlay whose source is in one of them but in no peer's subnet is
	// dropped (see the package documentation). Unset: not checked.
	Network, IPv6Network netip.Prefix
	// ResyncInterval is the period of the full resync; 0 means
	// kernel.DefaultResync.
	ResyncInterval time.Duration
}

// Backend is the host-gw dataplane (see the package documentation).
type Backend struct {
	cfg             Config
	log             *slog.Logger
	*kernel.Desired // Set, Ready

	running   atomic.Bool
	repairs   atomic.Uint64
	offEvents atomic.Uint64
	off       atomic.Pointer[[]vtep.Entry]

	// filter drops pod-network sources in no peer's subnet; nil without
	// a cluster network, or (filterOff) on a kernel without nf_tables.
	filter    *nft.AddrSets
	filterOff atomic.Bool

	// Owned by Run.
	overlay *kernel.Overlay
	applied vtep.Table // the table last programmed in full, nil before
	routed  vtep.Table // its rows that got a route
	offSet  map[netip.Prefix]vtep.Peer
}

var _ backend.Backend = (*Backend)(nil)

// New validates cfg and returns a backend that programs nothing until Run.
func New(cfg Config, log *slog.Logger) (*Backend, error) {
	if cfg.Handle == nil {
		return nil, errors.New("host-gw config: no netlink handle")
	}
	if cfg.UnderlayIndex <= 0 {
		return nil, errors.New("host-gw config: no underlay link index")
	}
	if cfg.ResyncInterval <= 0 {
		cfg.ResyncInterval = kernel.DefaultResync
	}
	b := &Backend{cfg: cfg, log: log.With("component", "host-gw"),
		Desired: kernel.NewDesired()}
	b.overlay = kernel.NewOverlay(cfg.Handle, 0, kernel.OverlayOptions{
		Family: netlink.FAMILY_ALL, DirectRouting: true, DirectOnly: true})
	if cfg.Network.IsValid() || cfg.IPv6Network.IsValid() {
		l, err := cfg.Handle.LinkByIndex(cfg.UnderlayIndex)
		if err != nil {
			return nil, fmt.Errorf("host-gw config: underlay link %d: %w", cfg.UnderlayIndex, err)
		}
		if spec := filterSpec(cfg, l.Attrs().Name); spec != nil {
			b.filter = &nft.AddrSets{NetNS: cfg.NetNS, Spec: *spec, Log: b.log,
				What: "the filter of pod-network sources from the underlay"}
		}
	}
	return b, nil
}

// OffLink returns the peers that got no route because their public address
// is not on-link (not on this node's L2 segment), as of the last sync.
func (b *Backend) OffLink() []vtep.Entry {
	if p := b.off.Load(); p != nil {
		return *p
	}
	return nil
}

// Run programs the latest table and keeps repairing drift until ctx is
// done. It leaves the routes in place when it returns.
func (b *Backend) Run(ctx context.Context) error {
	if !b.running.CompareAndSwap(false, true) {
		return errors.New("host-gw backend: already running")
	}
	defer b.running.Store(false)
	if b.filter != nil {
		if err := b.filter.Probe(); nft.Missing(err) {
			b.filterOff.Store(true)
			b.log.Warn("the kernel has no nf_tables: packets from the underlay with pod-network sources are not checked against the peers' subnets", "err", err)
		}
	}
	r := &kernel.Reconciler{
		NetNS:  b.cfg.NetNS,
		Log:    b.log,
		Resync: b.cfg.ResyncInterval,
		Kick:   b.Kick(),
		Sync:   b.sync,
		Drift:  b.drift,
	}
	if err := r.Run(ctx); err != nil {
		return fmt.Errorf("host-gw backend: %w", err)
	}
	return nil
}

// sync makes the routes match the latest table. Every sync reads the
// kernel: whether a peer is on-link depends on the underlay, not only on
// the table.
func (b *Backend) sync(full bool) error {
	tp := b.Table()
	if tp == nil {
		return nil
	}
	t := b.withoutSelf(*tp)
	// A filter that cannot be written does not hold the routes back: the
	// error is returned after them, and the retry, a second later, is
	// full.
	filtering := b.filter != nil && !b.filterOff.Load()
	var filterErr error
	if filtering {
		if err := b.filter.Admit(peerSubnets(t), full); err != nil {
			filterErr = fmt.Errorf("admit peers' subnets: %w", err)
		}
	}
	start := time.Now()
	st, err := b.overlay.Sync(t)
	off := b.overlay.OffLink()
	b.reportOffLink(off)
	if st.Changed() && b.applied != nil && maps.Equal(b.applied, t) {
		b.repairs.Add(uint64(st.RouteSet + st.RouteDel))
		b.log.Warn("repaired drift", "route", st.RouteSet+st.RouteDel)
	}
	if err != nil {
		return errors.Join(filterErr, fmt.Errorf("sync routes: %w", err))
	}
	b.log.Debug("synced routes", "peers", len(t), "offLink", len(off), "took", time.Since(start))
	b.applied = t
	b.routed = maps.Clone(t)
	for _, e := range off {
		delete(b.routed, e.Subnet)
	}
	if filterErr != nil {
		return filterErr // the full retry prunes what went, once it can write
	}
	if filtering {
		if err := b.filter.Prune(peerSubnets(t)); err != nil {
			return fmt.Errorf("refuse departed peers' subnets: %w", err)
		}
	}
	if b.MarkReady() {
		b.log.Info("dataplane ready", "peers", len(t), "offLink", len(off))
	}
	return nil
}

// reportOffLink logs and counts each peer that became unreachable, and logs
// each that became reachable again.
func (b *Backend) reportOffLink(off []vtep.Entry) {
	now := make(map[netip.Prefix]vtep.Peer, len(off))
	for _, e := range off {
		now[e.Subnet] = e.Peer
		if v, ok := b.offSet[e.Subnet]; !ok || v != e.Peer {
			b.offEvents.Add(1)
			b.log.Warn("peer is not on this node's L2 segment: host-gw cannot reach it, no route programmed",
				"subnet", e.Subnet, "publicIP", e.Peer.Addr,
				"hint", "host-gw needs every node on one L2 segment; use vxlan or wireguard across routers")
		}
	}
	for p, v := range b.offSet {
		if _, ok := now[p]; !ok {
			b.log.Info("peer reachable on-link again, or gone", "subnet", p, "publicIP", v.Addr)
		}
	}
	b.offSet = now
	b.off.Store(&off)
}

// drift is what calls for a sync between two periodic ones: a route of
// weft's deleted or changed, any route written for a peer subnet by someone
// else (an `ip route replace` takes weft's place; kernel.OverlayDrift), and
// any change of the underlay device or its addresses.
func (b *Backend) drift() kernel.Drift {
	od := kernel.NewOverlayDrift(b.routed, nil)
	u := b.cfg.UnderlayIndex
	return kernel.Drift{
		Link:  func(l netlink.LinkUpdate) bool { return int(l.Index) == u },
		Addr:  func(a netlink.AddrUpdate) bool { return a.LinkIndex == u },
		Route: od.Route,
	}
}

// withoutSelf drops rows that describe this node.
func (b *Backend) withoutSelf(t vtep.Table) vtep.Table {
	self := func(p netip.Prefix, v vtep.Peer) bool {
		return p == b.cfg.Subnet.Masked() || p == b.cfg.IPv6Subnet.Masked() ||
			(v.Addr.IsValid() && (v.Addr == b.cfg.Local || v.Addr == b.cfg.LocalIPv6))
	}
	out := maps.Clone(t)
	maps.DeleteFunc(out, self)
	return out
}

// Stats reports the repaired routes and the peers found off-link. host-gw
// has no device of its own, so it counts no frames.
func (b *Backend) Stats() backend.Stats {
	st := backend.Stats{
		Repairs: map[string]uint64{"route": b.repairs.Load()},
		Events:  map[string]uint64{"peer_off_link": b.offEvents.Load()},
	}
	if b.filter != nil && !b.filterOff.Load() {
		st.Repairs["filter"] = b.filter.Repairs()
		if d, err := FilterDrops(b.cfg.NetNS); err == nil {
			st.Drops = d
		}
	}
	return st
}
