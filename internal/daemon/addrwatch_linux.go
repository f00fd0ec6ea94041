package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// ErrUnderlayAddrChanged ends weftd when the address it advertises was
// taken from the underlay device and the device now holds another one in
// its place: the lease, the VXLAN device and every peer's entries name the
// old address, and a fresh start advertises the new one.
var ErrUnderlayAddrChanged = errors.New("the underlay address weftd advertises was replaced")

// addrChanged is the error of an addrWatch that saw the address replaced.
type addrChanged struct {
	device   string
	old, now netip.Addr
}

func (e *addrChanged) Error() string {
	return fmt.Sprintf("%v: %s on %s is now %s: exiting so that the service manager starts weftd again with the new address",
		ErrUnderlayAddrChanged, e.old, e.device, e.now)
}

func (e *addrChanged) Unwrap() error { return ErrUnderlayAddrChanged }

// Timing of addrWatch.
const (
	addrCheckEvery = time.Second
	// addrGrace is how long the advertised address may be missing while
	// another is present before weftd gives up on it: a network manager that
	// flushes and adds the same address again, or a DHCP client that drops
	// and takes back its lease, takes less.
	addrGrace = 5 * time.Second
)

// addrWatch checks the underlay device's addresses every addrCheckEvery.
type addrWatch struct {
	index        int
	name         string
	want4, want6 netip.Addr // addresses taken from the device; invalid: not watched
	log          *slog.Logger
}

// newAddrWatch watches the addresses of node that came from the underlay u
// (not those set by flag or annotation, even when the device holds them:
// the operator chose them, and a restart would advertise them again).
func newAddrWatch(u underlayInfo, node Node, log *slog.Logger) addrWatch {
	w := addrWatch{index: u.index, name: u.name, log: log.With("component", "underlay")}
	if u.picked4 && node.PublicIP.IsValid() && node.PublicIP == u.ipv4 {
		w.want4 = node.PublicIP
	}
	if u.picked6 && node.PublicIPv6.IsValid() && node.PublicIPv6 == u.ipv6 {
		w.want6 = node.PublicIPv6
	}
	return w
}

// Run returns ErrUnderlayAddrChanged (wrapped) once an advertised address
// has been missing from the device for addrGrace while another global
// address of its family is there; nil when ctx ends.
func (w addrWatch) Run(ctx context.Context) error {
	if !w.want4.IsValid() && !w.want6.IsValid() {
		return nil
	}
	h, err := netlink.NewHandle()
	if err != nil {
		return fmt.Errorf("watch underlay addresses: netlink: %w", err)
	}
	defer h.Close()
	tick := time.NewTicker(addrCheckEvery)
	defer tick.Stop()
	var since time.Time
	failing := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		old, now, err := w.replaced(h)
		switch {
		case err != nil:
			// The device itself gone (recreated with another index, or
			// removed) is the dataplane's to repair and the operator's to
			// see; the address cannot be compared meanwhile.
			if !failing {
				w.log.Warn("cannot read the underlay addresses", "device", w.name, "err", err)
			}
			failing = true
			continue
		case !old.IsValid():
			failing, since = false, time.Time{}
			continue
		case since.IsZero():
			since = time.Now()
			w.log.Warn("the advertised underlay address is gone and another is there; waiting for it to come back",
				"device", w.name, "advertised", old, "now", now, "grace", addrGrace)
		}
		if time.Since(since) >= addrGrace {
			return &addrChanged{device: w.name, old: old, now: now}
		}
	}
}

// replaced returns an advertised address missing from the device and the
// device's global address of the same family that took its place, when
// there is one. Addresses that are not settled in their place are not
// taken for it: a secondary address (a VIP beside the primary), a
// tentative IPv6 address (duplicate detection still running) and a
// deprecated one.
func (w addrWatch) replaced(h *netlink.Handle) (old, now netip.Addr, err error) {
	l, err := h.LinkByIndex(w.index)
	if err != nil {
		return old, now, err
	}
	addrs, err := h.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		return old, now, err
	}
	for _, want := range []netip.Addr{w.want4, w.want6} {
		if !want.IsValid() {
			continue
		}
		var found, other netip.Addr
		for _, a := range addrs {
			ip, ok := netip.AddrFromSlice(a.IP)
			if !ok {
				continue
			}
			ip = ip.Unmap()
			switch {
			case ip == want:
				found = ip
			case ip.Is4() == want.Is4() && ip.IsGlobalUnicast() && !other.IsValid() &&
				a.Flags&(unix.IFA_F_SECONDARY|unix.IFA_F_TENTATIVE|unix.IFA_F_DEPRECATED) == 0:
				other = ip
			}
		}
		if !found.IsValid() && other.IsValid() {
			return want, other, nil
		}
	}
	return old, now, nil
}
