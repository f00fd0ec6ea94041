package vxlan

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/weft-net/weft/backend"
	"github.com/weft-net/weft/backend/kernel"
	"github.com/weft-net/weft/backend/nft"
	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/vtep"
)

// Backend is the kernel VXLAN dataplane (see the package documentation).
type Backend struct {
	cfg             Config
	log             *slog.Logger
	*kernel.Desired // Set, Ready

	running atomic.Bool
	repairs repairCounters
	// noTxChecksum: the kernel is older than 5.7, so the devices' transmit
	// checksum offload is turned off (Config.KernelRelease).
	noTxChecksum bool
	// selfV4 and selfV6 are this node's subnets, masked (see self).
	selfV4, selfV6 netip.Prefix

	// filter admits VXLAN datagrams from peers only; nil with
	// NoPeerFilter. filterOff is set when the kernel has no nf_tables.
	filter    *nft.AddrSets
	filterOff atomic.Bool
	// ingress is the hook of the filter's overlay source checks, on each
	// overlay device (inetIngress); nil once the kernel refused it, the
	// checks then on the prerouting hook (see filterSpec). Owned by Run.
	ingress *nftables.ChainHook

	// Owned by Run.
	devs  []*devState
	peers peerState
}

var _ backend.Backend = (*Backend)(nil)

type devState struct {
	spec    deviceSpec
	index   int // 0 until the device was first seen or made
	overlay *kernel.Overlay
}

// New validates cfg and returns a backend that programs nothing until Run.
func New(cfg Config, log *slog.Logger) (*Backend, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	bug, _ := checksumBug(cfg.KernelRelease) // withDefaults checked it
	b := &Backend{
		cfg:          cfg,
		log:          log.With("component", "vxlan"),
		Desired:      kernel.NewDesired(),
		noTxChecksum: bug,
		selfV4:       cfg.Subnet.Masked(),
		selfV6:       cfg.IPv6Subnet.Masked(),
	}
	for _, s := range cfg.specs() {
		b.devs = append(b.devs, &devState{spec: s})
	}
	if !cfg.NoPeerFilter {
		b.ingress = inetIngress
		b.filter = &nft.AddrSets{NetNS: cfg.NetNS, Spec: filterSpec(cfg, cfg.specs(), b.ingress), Log: b.log,
			What: "the VXLAN port filter (datagrams from peers only)"}
	}
	return b, nil
}

// Create makes the devices that do not exist yet, as Run would, and leaves
// them down for Run to finish: a kernel that cannot make them (ErrNoDriver)
// shows before anything else is programmed, and the caller can choose
// another dataplane. Devices that exist are left to Run.
func (b *Backend) Create() error {
	for _, d := range b.devs {
		_, err := b.cfg.Handle.LinkByName(d.spec.name)
		var notFound netlink.LinkNotFoundError
		switch {
		case err == nil:
			continue
		case !errors.As(err, &notFound):
			return fmt.Errorf("vxlan backend: find device %s: %w", d.spec.name, err)
		}
		if _, err := createDevice(b.cfg.Handle, d.spec, b.log); err != nil {
			return fmt.Errorf("vxlan backend: %w", err)
		}
	}
	return nil
}

// MAC returns the MAC of the IPv4 device, and MACv6 of the IPv6 device, as
// configured (the ones to advertise in the lease).
func (b *Backend) MAC() (v4, v6 subnet.MAC) { return b.cfg.MAC, b.cfg.MACv6 }

// Run creates or adopts the devices, programs the latest table, and keeps
// repairing drift, on change notifications and every ResyncInterval, until
// ctx is done. It leaves everything in place when it returns, and returns
// after its goroutines have exited. Only one Run may be active at a time.
func (b *Backend) Run(ctx context.Context) error {
	if !b.running.CompareAndSwap(false, true) {
		return errors.New("vxlan backend: already running")
	}
	defer b.running.Store(false)
	b.startFilter()

	r := kernel.Reconciler{
		NetNS:  b.cfg.NetNS,
		Log:    b.log,
		Resync: b.cfg.ResyncInterval,
		Kick:   b.Kick(),
		Sync:   b.reconcile,
		Drift:  b.drift,
	}
	if err := r.Run(ctx); err != nil {
		return fmt.Errorf("vxlan backend: %w", err)
	}
	return nil
}

// startFilter says at start what the VXLAN port accepts: the filter is
// off by configuration (and a table left from before goes), or the kernel
// has no nf_tables, or the filter is programmed by the first reconcile.
func (b *Backend) startFilter() {
	switch {
	case b.filter == nil:
		if err := RemoveFilter(b.cfg.NetNS); err != nil && !nft.Missing(err) {
			b.log.Warn("cannot remove the VXLAN port filter", "table", FilterTable, "err", err)
		}
		b.log.Info("VXLAN port filter off: the port accepts datagrams from any host, as Flannel's does")
	case b.filterOff.Load():
	default:
		if err := b.filter.Probe(); nft.Missing(err) {
			b.filterOff.Store(true)
			b.log.Warn("the kernel has no nf_tables: the VXLAN port accepts datagrams from any host, and frames from the overlay with any source",
				"err", err, "fix", "a kernel with CONFIG_NF_TABLES and CONFIG_NF_TABLES_INET")
		}
	}
}

// filtering reports whether the filter follows the peers.
func (b *Backend) filtering() bool { return b.filter != nil && !b.filterOff.Load() }

// reconcile makes every device and its peers match the latest table (the
// last one Set, with the rows handed to Update since). With full unset, and
// a table programmed before on devices that still exist, it writes only
// what changed since (the changed rows, or the difference between two
// whole tables when one was Set); a full reconcile reads the kernel and
// repairs drift.
func (b *Backend) reconcile(full bool) error {
	b.peers.take(b.Desired, b.self)
	var tp *vtep.Table
	if b.peers.want != nil {
		tp = &b.peers.want
	}
	ch := b.peers.change()
	// A new peer is admitted before its route exists, and a departed one
	// refused once its route is gone: a change made row by row touches
	// the filter's sets at those rows' addresses only. A filter that
	// cannot be written does not hold the routes back (a departed peer's
	// route must go, and a new peer's route only sends): the error is
	// returned after them, and the retry, a second later, is a full
	// reconcile (a full sync of every device each second for as long as
	// the filter fails).
	add, gone, rows := b.peers.addrDelta(ch)
	rows = rows && !full && b.filter != nil && b.filter.Known()
	var filterErr error
	if tp != nil && b.filtering() && (full || !b.filter.Known()) {
		// Admit may write the table, whose overlay chains hook the
		// devices' ingress, and older kernels (not 6.18) refuse a chain for a
		// device that does not exist: the devices come first (an error is
		// reconcileDevice's to report).
		for _, d := range b.devs {
			ensureDevice(b.cfg.Handle, d.spec, b.log)
		}
	}
	if tp != nil && b.filtering() {
		var err error
		if rows {
			err = b.filter.Add(add)
		} else {
			err = b.filter.Admit(peerAddrs(*tp), full)
		}
		if err != nil && b.ingress != nil && errors.Is(err, unix.EOPNOTSUPP) {
			b.log.Info("the kernel refuses chains on the overlay devices' ingress hook (they need Linux 5.10 and CONFIG_NETFILTER_INGRESS): "+
				"the overlay source check runs on the prerouting hook", "err", err)
			b.ingress = nil
			b.filter.Spec = filterSpec(b.cfg, b.cfg.specs(), nil)
			err = b.filter.Admit(peerAddrs(*tp), true)
		}
		if err != nil {
			filterErr = fmt.Errorf("admit peers to the VXLAN port: %w", err)
		}
	}
	var errs []error
	for _, d := range b.devs {
		if err := b.reconcileDevice(d, tp, ch, full); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 || tp == nil {
		return errors.Join(append(errs, filterErr)...)
	}
	b.peers.programmed() // the devices hold the table, whatever the filter's state
	if filterErr != nil {
		return filterErr // the full retry prunes what went, once it can write
	}
	if b.filtering() {
		var err error
		if rows {
			err = b.filter.Drop(gone)
		} else {
			err = b.filter.Prune(peerAddrs(*tp))
		}
		if err != nil {
			return fmt.Errorf("refuse departed peers at the VXLAN port: %w", err)
		}
	}
	if b.MarkReady() {
		b.log.Info("dataplane ready", "peers", len(*tp))
	}
	return nil
}

func (b *Backend) reconcileDevice(d *devState, tp *vtep.Table, ch change, full bool) error {
	if !full && ch.ok && d.overlay != nil {
		// A change of peers on a device a sync made: the device itself
		// needs no look (any change to it is drift, which calls a full
		// sync; a write to a device that is gone fails, and the retry is
		// full).
		return b.applyChange(d, ch)
	}
	idx, created, err := ensureDevice(b.cfg.Handle, d.spec, b.log)
	if err != nil {
		return err
	}
	// A device of another index is new too: reconcile may have made it
	// just before, for the filter.
	created = created || idx != d.index
	if created && d.index != 0 {
		b.repairs.device.Add(1)
		b.log.Warn("repaired device", "device", d.spec.name, "old_index", d.index, "index", idx)
	}
	if b.noTxChecksum && (idx != d.index || full) {
		// A workaround, not the dataplane: a device whose offload cannot be
		// changed still carries pod traffic, so the error is logged (doctor's
		// offload/checksum check reports the state) and the sync goes on.
		changed, err := disableTxChecksum(b.cfg.NetNS, d.spec.name)
		if err != nil {
			b.log.Warn("cannot turn transmit checksum offload off; NATed traffic through this device may stall on this kernel",
				"device", d.spec.name, "kernel", b.cfg.KernelRelease, "err", err)
		}
		if changed {
			b.log.Info("turned transmit checksum offload off: kernels before 5.7 send NATed traffic through VXLAN with bad checksums",
				"device", d.spec.name, "kernel", b.cfg.KernelRelease)
		}
	}
	if idx != d.index || d.overlay == nil {
		d.index = idx
		d.overlay = kernel.NewOverlay(b.cfg.Handle, idx, kernel.OverlayOptions{
			Family:        d.spec.family,
			DirectRouting: b.cfg.DirectRouting,
			Step:          fdb{h: b.cfg.Handle, link: idx},
		})
	}
	if tp == nil {
		return nil
	}
	start := time.Now()
	if !full && !created && ch.ok {
		return b.applyChange(d, ch)
	}
	st, err := d.overlay.Sync(*tp)
	b.log.Debug("synced peers", "device", d.spec.name, "peers", len(*tp), "took", time.Since(start))
	if st.Changed() && !created && ch.same {
		b.repairs.add(st)
		b.log.Warn("repaired drift", "device", d.spec.name,
			"neigh", st.NeighSet+st.NeighDel, "fdb", st.StepSet+st.StepDel, "route", st.RouteSet+st.RouteDel)
	}
	if err != nil {
		return fmt.Errorf("sync peers on %s: %w", d.spec.name, err)
	}
	return nil
}

// applyChange writes ch on d's device, without reading the kernel.
func (b *Backend) applyChange(d *devState, ch change) error {
	start := time.Now()
	var st kernel.SyncStats
	var err error
	if ch.at != nil {
		st, err = d.overlay.ApplyAt(ch.old, ch.next, ch.at)
	} else {
		st, err = d.overlay.Apply(ch.old, ch.next)
	}
	if err != nil {
		return fmt.Errorf("apply peer changes on %s: %w", d.spec.name, err)
	}
	b.log.Debug("applied peer changes", "device", d.spec.name, "neigh", st.NeighSet+st.NeighDel,
		"fdb", st.StepSet+st.StepDel, "route", st.RouteSet+st.RouteDel, "took", time.Since(start))
	return nil
}

// self reports whether a row describes this node (its own subnets or
// underlay addresses): a route for our own subnet into the tunnel would cut
// off our pods, so such rows are left out. The daemon's table never has
// them; this is a safety net.
func (b *Backend) self(p netip.Prefix, v vtep.Peer) bool {
	return p == b.selfV4 || p == b.selfV6 || v.Addr == b.cfg.Local || v.Addr == b.cfg.LocalIPv6
}

// Repairs counts the kernel entries the backend rewrote because they had
// drifted from a table it had already programmed (deleted or changed by
// someone else), by kind. A recreated device counts once under Device; the
// entries rewritten on it then are not counted again.
type Repairs struct {
	Device, Neigh, FDB, Route uint64
}

type repairCounters struct {
	device, neigh, fdb, route atomic.Uint64
}

func (c *repairCounters) add(st kernel.SyncStats) {
	c.neigh.Add(uint64(st.NeighSet + st.NeighDel))
	c.fdb.Add(uint64(st.StepSet + st.StepDel))
	c.route.Add(uint64(st.RouteSet + st.RouteDel))
}

// Repairs returns the repair counters so far; safe to call at any time.
func (b *Backend) Repairs() Repairs {
	return Repairs{
		Device: b.repairs.device.Load(),
		Neigh:  b.repairs.neigh.Load(),
		FDB:    b.repairs.fdb.Load(),
		Route:  b.repairs.route.Load(),
	}
}

// Stats reports the repair counters and, as frames and drops, the packet
// counters of the backend's devices as the kernel keeps them.
func (b *Backend) Stats() backend.Stats {
	r := b.Repairs()
	st := backend.Stats{Repairs: map[string]uint64{
		"device": r.Device, "neigh": r.Neigh, "fdb": r.FDB, "route": r.Route,
	}}
	drops := map[string]uint64{}
	for _, d := range b.devs {
		l, err := b.cfg.Handle.LinkByName(d.spec.name)
		if err != nil || l.Attrs().Statistics == nil {
			continue
		}
		ls := l.Attrs().Statistics
		st.TxFrames += ls.TxPackets
		st.RxFrames += ls.RxPackets
		drops["tx_dropped"] += ls.TxDropped
		drops["rx_dropped"] += ls.RxDropped
		drops["tx_errors"] += ls.TxErrors
		drops["rx_errors"] += ls.RxErrors
	}
	if b.filtering() {
		if fd, err := FilterDrops(b.cfg.NetNS); err == nil {
			for k, v := range fd {
				drops[k] += v
			}
		}
		st.Repairs["filter"] = b.filter.Repairs()
	}
	st.Drops = drops
	return st
}
