package wireguard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/weft-net/weft/backend"
	"github.com/weft-net/weft/backend/kernel"
	"github.com/weft-net/weft/vtep"
)

// Backend is the wireguard dataplane (see the package documentation).
type Backend struct {
	cfg             Config
	log             *slog.Logger
	*kernel.Desired // Set, Ready

	running atomic.Bool
	repairs sync.Map // kind → *atomic.Uint64
	kernel  atomic.Bool

	// Owned by Run.
	devs    []*devState
	applied vtep.Table
}

type devState struct {
	spec  deviceSpec
	dev   wgDevice
	index int
	want  map[string]Peer // the peers last set, by key
}

var _ backend.Backend = (*Backend)(nil)

// New validates cfg and returns a backend that creates nothing until Run.
func New(cfg Config, log *slog.Logger) (*Backend, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	b := &Backend{cfg: cfg, log: log.With("component", "wireguard"), Desired: kernel.NewDesired()}
	for _, s := range cfg.specs() {
		b.devs = append(b.devs, &devState{spec: s})
	}
	return b, nil
}

// Kernel reports whether the devices are the kernel's (after the first sync).
func (b *Backend) Kernel() bool { return b.kernel.Load() }

// Run creates the devices, programs the latest table and repairs drift
// until ctx is done. Kernel devices stay when it returns; in-process ones
// go with it.
func (b *Backend) Run(ctx context.Context) error {
	if !b.running.CompareAndSwap(false, true) {
		return errors.New("wireguard backend: already running")
	}
	defer b.running.Store(false)
	defer func() {
		for _, d := range b.devs {
			if d.dev != nil {
				d.dev.Close()
			}
		}
	}()
	r := &kernel.Reconciler{NetNS: b.cfg.NetNS, Log: b.log, Resync: b.cfg.ResyncInterval,
		Kick: b.Kick(), Sync: b.sync, Drift: b.drift}
	if err := r.Run(ctx); err != nil {
		return fmt.Errorf("wireguard backend: %w", err)
	}
	return nil
}

func (b *Backend) sync(bool) error {
	tp := b.Table()
	var errs []error
	for _, d := range b.devs {
		if err := b.syncDevice(d, tp); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 || tp == nil {
		return errors.Join(errs...)
	}
	b.applied = *tp
	if b.MarkReady() {
		b.log.Info("dataplane ready", "peers", len(*tp), "kernel", b.kernel.Load())
	}
	return nil
}

// syncDevice makes one device, its address, its route and its peers match.
func (b *Backend) syncDevice(d *devState, tp *vtep.Table) error {
	created, err := b.ensureDevice(d)
	if err != nil {
		return err
	}
	if err := b.ensureAddrRoutes(d, created); err != nil {
		return err
	}
	if tp == nil {
		return nil
	}
	want := map[string]Peer{}
	for _, p := range b.cfg.peersFor(d.spec, *tp) {
		want[p.Key] = p
	}
	have, err := d.dev.Peers()
	if err != nil {
		return err
	}
	var set []Peer
	var remove []string
	for k := range have {
		if _, ok := want[k]; !ok {
			remove = append(remove, k)
		}
	}
	for k, p := range want {
		h, ok := have[k]
		last, had := d.want[k]
		if !ok || !slices.Equal(h.AllowedIPs, p.AllowedIPs) || !had || last.Endpoint != p.Endpoint {
			set = append(set, p)
		}
	}
	if len(set)+len(remove) == 0 {
		d.want = want
		return nil
	}
	slices.Sort(remove)
	if !created && d.want != nil && maps.EqualFunc(d.want, want, samePeer) {
		b.repaired("peer", uint64(len(set)+len(remove)))
		b.log.Warn("repaired drift", "device", d.spec.name, "peers", len(set)+len(remove))
	}
	if err := d.dev.Configure(b.cfg, nil, 0, set, remove); err != nil {
		return err
	}
	for _, p := range set {
		b.log.Info("peer set", "device", d.spec.name, "key", p.Key, "endpoint", p.Endpoint, "allowedIPs", p.AllowedIPs)
	}
	for _, k := range remove {
		b.log.Info("peer removed", "device", d.spec.name, "key", k)
	}
	d.want = want
	return nil
}

func samePeer(a, b Peer) bool {
	return a.Key == b.Key && a.Endpoint == b.Endpoint && slices.Equal(a.AllowedIPs, b.AllowedIPs)
}

// ensureDevice makes sure the device exists (re-creating it when it was
// deleted or its TUN lost) and is up with the right MTU.
func (b *Backend) ensureDevice(d *devState) (bool, error) {
	h := b.cfg.Handle
	l, err := h.LinkByName(d.spec.name)
	if err == nil && d.dev != nil && l.Attrs().Index == d.index {
		if l.Attrs().MTU != b.cfg.MTU {
			if err := h.LinkSetMTU(l, b.cfg.MTU); err != nil {
				return false, fmt.Errorf("set MTU of %s: %w", d.spec.name, err)
			}
		}
		return false, h.LinkSetUp(l)
	}
	if d.dev != nil {
		b.repaired("device", 1)
		b.log.Warn("device gone; re-creating it", "device", d.spec.name)
		d.dev.Close()
		d.dev, d.want = nil, nil
	}
	dev, kernel, err := openDevice(h, b.cfg.NetNS, d.spec.name, b.cfg.MTU, b.cfg.Kernel, b.log)
	if err != nil {
		return false, err
	}
	b.kernel.Store(kernel)
	key := b.cfg.PrivateKey
	if err := dev.Configure(b.cfg, &key, d.spec.port, nil, nil); err != nil {
		dev.Close()
		return false, err
	}
	if l, err = h.LinkByName(d.spec.name); err != nil {
		dev.Close()
		return false, fmt.Errorf("find %s: %w", d.spec.name, err)
	}
	if err := h.LinkSetMTU(l, b.cfg.MTU); err != nil {
		dev.Close() // else its socket keeps the port, and the next attempt fails
		return false, fmt.Errorf("set MTU of %s: %w", d.spec.name, err)
	}
	if err := h.LinkSetUp(l); err != nil {
		dev.Close()
		return false, fmt.Errorf("set %s up: %w", d.spec.name, err)
	}
	d.dev, d.index = dev, l.Attrs().Index
	b.log.Info("device ready", "device", d.spec.name, "kernel", kernel, "port", d.spec.port, "mtu", b.cfg.MTU)
	return true, nil
}

// ensureAddrRoutes puts the device's address and the cluster routes back.
func (b *Backend) ensureAddrRoutes(d *devState, created bool) error {
	h := b.cfg.Handle
	link, err := h.LinkByIndex(d.index)
	if err != nil {
		return fmt.Errorf("find %s: %w", d.spec.name, err)
	}
	have, err := kernel.ListAddrs(h, link, netlink.FAMILY_ALL)
	if err != nil {
		return err
	}
	for _, a := range d.spec.addrs {
		if slices.ContainsFunc(have, func(x netlink.Addr) bool {
			ip, _ := netip.AddrFromSlice(x.IP)
			return ip.Unmap() == a.Addr()
		}) {
			continue
		}
		if !created {
			b.repaired("address", 1)
		}
		if err := h.AddrReplace(link, &netlink.Addr{IPNet: kernel.PrefixIPNet(a)}); err != nil {
			return fmt.Errorf("address %s on %s: %w", a, d.spec.name, err)
		}
	}
	for _, p := range d.spec.routes {
		rs, err := kernel.ListRoutes(h, netlink.FAMILY_ALL, &netlink.Route{Dst: kernel.PrefixIPNet(p), Table: unix.RT_TABLE_MAIN},
			netlink.RT_FILTER_DST|netlink.RT_FILTER_TABLE)
		if err != nil {
			return err
		}
		if slices.ContainsFunc(rs, func(r netlink.Route) bool { return r.LinkIndex == d.index && r.Gw == nil }) {
			continue
		}
		if !created {
			b.repaired("route", 1)
		}
		r := &netlink.Route{Dst: kernel.PrefixIPNet(p), LinkIndex: d.index, Scope: netlink.SCOPE_LINK,
			Table: unix.RT_TABLE_MAIN, Protocol: kernel.RouteProtocol}
		if err := h.RouteReplace(r); err != nil {
			return fmt.Errorf("route %s dev %s: %w", p, d.spec.name, err)
		}
	}
	return nil
}

// drift: any change of a device, a lost address, a route through it gone.
func (b *Backend) drift() kernel.Drift {
	idx := map[int]bool{}
	names := map[string]bool{}
	for _, d := range b.devs {
		idx[d.index], names[d.spec.name] = true, true
	}
	return kernel.Drift{
		Link: func(u netlink.LinkUpdate) bool {
			return idx[int(u.Index)] || u.Link != nil && names[u.Link.Attrs().Name]
		},
		Addr: func(u netlink.AddrUpdate) bool { return !u.NewAddr && idx[u.LinkIndex] },
		Route: func(u netlink.RouteUpdate) bool {
			return u.Type == unix.RTM_DELROUTE && idx[u.LinkIndex]
		},
	}
}

func (b *Backend) repaired(kind string, n uint64) {
	c, _ := b.repairs.LoadOrStore(kind, new(atomic.Uint64))
	c.(*atomic.Uint64).Add(n)
}

// Stats reports repairs and the devices' packet counters.
func (b *Backend) Stats() backend.Stats {
	st := backend.Stats{Repairs: map[string]uint64{}, Drops: map[string]uint64{}}
	b.repairs.Range(func(k, v any) bool {
		st.Repairs[k.(string)] = v.(*atomic.Uint64).Load()
		return true
	})
	for _, s := range b.cfg.specs() {
		l, err := b.cfg.Handle.LinkByName(s.name)
		if err != nil || l.Attrs().Statistics == nil {
			continue
		}
		ls := l.Attrs().Statistics
		st.TxFrames += ls.TxPackets
		st.RxFrames += ls.RxPackets
		st.Drops["tx_dropped"] += ls.TxDropped
		st.Drops["rx_dropped"] += ls.RxDropped
	}
	return st
}
