package uvxlan

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/weft-net/weft/backend"
	"github.com/weft-net/weft/vtep"
)

// errLoad marks an error of attach's loading the programs.
var errLoad = errors.New("load the fast path's programs")

// underlayIndex returns the index of the device that holds addr, which
// must be an Ethernet device that sends somewhere: the programs read and
// write an Ethernet header there, and a loopback or dummy device would
// swallow what they send. The device of index last is asked first.
func underlayIndex(h *netlink.Handle, addr netip.Addr, last int) (int, error) {
	var addrs []netlink.Addr
	if last != 0 {
		if l, err := h.LinkByIndex(last); err == nil {
			addrs, _ = h.AddrList(l, netlink.FAMILY_V4)
		}
		if !slices.ContainsFunc(addrs, func(a netlink.Addr) bool { ip, _ := netip.AddrFromSlice(a.IP); return ip.Unmap() == addr }) {
			addrs = nil
		}
	}
	if addrs == nil {
		var err error
		if addrs, err = h.AddrList(nil, netlink.FAMILY_V4); err != nil {
			return 0, fmt.Errorf("list addresses: %w", err)
		}
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); !ok || ip.Unmap() != addr {
			continue
		}
		l, err := h.LinkByIndex(a.LinkIndex)
		if err != nil {
			return 0, fmt.Errorf("device of %s: %w", addr, err)
		}
		at := l.Attrs()
		switch {
		case at.EncapType != "ether":
			return 0, fmt.Errorf("%s, which holds %s, is not an Ethernet device (%s)", at.Name, addr, at.EncapType)
		case l.Type() == "dummy" || at.Flags&net.FlagLoopback != 0:
			return 0, fmt.Errorf("%s, which holds %s, is a %s device: the route to the peers leaves elsewhere", at.Name, addr, l.Type())
		}
		return a.LinkIndex, nil
	}
	return 0, fmt.Errorf("no device holds %s", addr)
}

// fastParams are the programs' immediates for this datapath.
func (dp *datapath) fastParams() (progParams, error) {
	cfg := dp.b.cfg
	u, err := underlayIndex(dp.h, cfg.Local, dp.b.fast.params.underlay)
	if err != nil {
		return progParams{}, err
	}
	return progParams{local: cfg.Local, vni: cfg.VNI, port: cfg.Port, mac: cfg.MAC, mtu: cfg.MTU,
		tap: dp.linkIndex, underlay: u}, nil
}

// openFastPath creates the fast path's maps for New; where that fails the
// backend runs without it.
func (b *Backend) openFastPath() {
	if !b.cfg.Local.Is4() {
		b.log.Info("the fast path carries IPv4 only; this IPv6 backend runs without it")
		return
	}
	probe := b.cfg.haveTCX
	if probe == nil {
		probe = haveTCX
	}
	// Without tcx (before Linux 6.6) the programs can never attach; the
	// maps would only keep the receive sockets from asking for UDP GRO.
	if err := probe(); err != nil {
		b.log.Warn("fast path unavailable: the kernel cannot attach tc programs by tcx (Linux 6.6 and later); using the userspace path only", "err", err)
		return
	}
	f, err := newFastPath()
	if err != nil {
		b.log.Warn("fast path unavailable; using the userspace path only", "err", err)
		return
	}
	b.fast = f
	runtime.AddCleanup(b, func(f *fastPath) { f.closeMaps() }, f)
}

// syncFastPeers is part of the reconciler's sync: it writes the latest
// table into the fast path's maps, so that Set never waits for them. A
// peer that cannot be written (the maps are full) takes the userspace
// path; the reason is logged when it changes.
func (dp *datapath) syncFastPeers(t vtep.Table) {
	b := dp.b
	if b.fast == nil {
		return
	}
	failed, err := b.fast.setTable(t, b.cfg.AllowForeignSources)
	if err == nil {
		dp.fastMapErr = ""
		return
	}
	b.ctr.fastMapErrors.Add(1)
	if msg := fmt.Sprint(failed, err); msg != dp.fastMapErr {
		dp.fastMapErr = msg
		b.log.Warn("fast path: some peers take the userspace path", "entries", failed, "err", err)
	}
}

// addFastStats adds the fast path's counters to s: its frames to TxFrames
// and RxFrames, and each counter to Events; EventFastUnavailable where
// Config.FastPath is set but an IPv4 backend's fast path could not be
// opened.
func (b *Backend) addFastStats(s backend.Stats) backend.Stats {
	if b.fast == nil {
		if b.cfg.FastPath && b.cfg.Local.Is4() {
			s.Events[EventFastUnavailable] = 1
		}
		return s
	}
	c := b.fast.counters()
	s.TxFrames += c[fastTxFrames]
	s.RxFrames += c[fastRxFrames]
	s.Events[EventFastTxFrames] = c[fastTxFrames]
	s.Events[EventFastTxBytes] = c[fastTxBytes]
	s.Events[EventFastRxFrames] = c[fastRxFrames]
	s.Events[EventFastRxBytes] = c[fastRxBytes]
	s.Events[EventFastErrors] = c[fastErrors]
	s.Events[EventFastDemoted] = c[fastDemoted]
	s.Events[EventFastBridgePassed] = c[fastBridgePassed]
	s.Events[EventFastAttaches] = b.ctr.fastAttaches.Load()
	s.Events[EventFastMapErrors] = b.ctr.fastMapErrors.Load()
	s.Events[EventFastLoadErrors] = b.ctr.fastLoadErrors.Load()
	b.fast.mu.Lock()
	s.Events[EventFastOffDevice] = uint64(len(b.fast.off))
	b.fast.mu.Unlock()
	return s
}

// syncFast is part of the reconciler's sync: it attaches the fast path's
// programs for the current TAP and underlay device, again when a device
// was replaced or a program detached, and logs when that fails (once per
// different reason). Programs the kernel refused to load are counted and
// loaded again at the next sync. Meanwhile the userspace path carries
// everything.
func (dp *datapath) syncFast() {
	f := dp.b.fast
	if f == nil {
		return
	}
	p, err := dp.fastParams()
	var changed bool
	if err == nil {
		err = inNS(dp.b.cfg.NetNS, func() (err error) { changed, err = f.attach(p); return err })
	}
	if err != nil {
		if errors.Is(err, errLoad) {
			dp.b.ctr.fastLoadErrors.Add(1)
		}
		if msg := err.Error(); msg != dp.fastErr {
			dp.fastErr = msg
			dp.b.log.Warn("fast path not attached; the userspace path carries everything", "err", err)
		}
		f.detach()
		// Until a sync attaches them (for good without tcx): the peers may as well
		// hand this node to their userspace paths.
		dp.b.noUDPGSO.Store(false)
		return
	}
	dp.b.noUDPGSO.Store(true)
	if changed {
		if dp.b.ctr.fastAttaches.Add(1) > 1 {
			dp.b.ctr.fastRepairs.Add(1)
		}
		dp.fastErr = ""
		dp.fastRoutes = nil // the underlay may be another device: check again
		dp.b.log.Info("fast path attached", "tap_index", p.tap, "underlay_index", p.underlay)
	}
}

// checkFastRoutes is part of the reconciler's sync: it leaves to the
// userspace path the peers whose route (from Local) does not leave through
// the underlay device, since the egress program sends through that device
// only. New peer addresses are checked at the next sync, all of them again
// on a full sync at most once a minute; one whose route cannot be found is
// left out and asked again at the next sync.
func (dp *datapath) checkFastRoutes(full bool) {
	f := dp.b.fast
	if f == nil || !f.attached {
		return
	}
	t, prev := f.latest()
	if dp.fastRoutes == nil || (full && time.Since(dp.fastFull) > time.Minute) {
		dp.fastRoutes, dp.fastFull = map[netip.Addr]bool{}, time.Now()
	}
	opts := &netlink.RouteGetOptions{SrcAddr: dp.b.cfg.Local.AsSlice()}
	off := map[netip.Addr]bool{}
	for _, v := range t {
		a := v.Addr.Unmap()
		if !a.Is4() {
			continue
		}
		elsewhere, ok := dp.fastRoutes[a]
		if !ok {
			rs, err := dp.h.RouteGetWithOptions(a.AsSlice(), opts)
			elsewhere = err != nil || len(rs) == 0 || rs[0].LinkIndex != f.params.underlay
			if err == nil {
				dp.fastRoutes[a] = elsewhere
			}
		}
		if elsewhere {
			off[a] = true
		}
	}
	if maps.Equal(off, prev) {
		return
	}
	if len(off) > 0 {
		dp.b.log.Warn("fast path: peers whose route leaves through another device take the userspace path", "peers", len(off))
	}
	if failed, err := f.setOff(off); err != nil {
		dp.b.ctr.fastMapErrors.Add(1)
		dp.b.log.Warn("fast path: some peers take the userspace path", "entries", failed, "err", err)
	}
}

// detachFast removes the fast path's programs when Run ends: the userspace
// path (or the queues kept for the next run) takes over.
func (dp *datapath) detachFast() {
	if f := dp.b.fast; f != nil {
		f.detach()
	}
}

// rxGRO reports whether the receive sockets ask for UDP GRO: not with the
// fast path, also while its programs are not attached. On a device that
// does GRO (a NIC) it would merge a peer's datagrams before the ingress
// program sees them, and merged ones can only take the userspace path,
// behind single ones of the same flows that took the fast path. (Turning
// it on and off with the programs would lose what a kept socket queued
// across a restart: the kernel marks merged datagrams only for a socket
// that still asks.)
func (dp *datapath) rxGRO() bool { return dp.vnet && dp.b.fast == nil }

// haveTCX reports whether the kernel attaches tc programs by tcx: an error
// wrapping ebpf.ErrNotSupported when it does not. It attaches a program
// that does nothing to an interface index that cannot exist, which a
// kernel with tcx refuses with ENODEV. Where the probe cannot even be
// loaded (no CAP_BPF), it cannot tell, and says nil: creating the maps
// then fails with the reason.
func haveTCX() error {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, License: "Apache-2.0",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()}})
	if err != nil {
		return nil
	}
	defer prog.Close()
	l, err := link.AttachTCX(link.TCXOptions{Interface: math.MaxInt32, Program: prog, Attach: ebpf.AttachTCXIngress})
	switch {
	case err == nil:
		l.Close()
		return nil
	case errors.Is(err, ebpf.ErrNotSupported):
		return err
	default: // ENODEV, or an answer that says nothing of tcx
		return nil
	}
}
