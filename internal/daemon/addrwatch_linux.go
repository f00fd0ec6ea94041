package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// errUnderlayChanged is the error of an addrWatch that saw the underlay
// change under weftd: the lease, the dataplane and every peer's entries
// name the old device or the old address, so Run starts the node again on
// the new one, in the same process.
var errUnderlayChanged = errors.New("the underlay changed")

// underlayChanged says what changed.
type underlayChanged struct {
	device    string
	recreated bool       // a new device under the old name (new index)
	old, now  netip.Addr // the advertised address and the one in its place; invalid when it stayed
}

func (e *underlayChanged) Error() string {
	what := "the device was replaced by a new one"
	if !e.recreated {
		what = "its address was replaced"
	}
	if e.old.IsValid() {
		what += fmt.Sprintf(", %s is now %s", e.old, e.now)
	}
	return fmt.Sprintf("%v: %s: %s", errUnderlayChanged, e.device, what)
}

func (e *underlayChanged) Unwrap() error { return errUnderlayChanged }

// Timing of addrWatch.
const (
	// addrResync is how often addrWatch checks the device besides on the
	// kernel's notifications: a safety net for notifications lost while
	// the subscription was renewed.
	addrResync = 90 * time.Second
	// addrResubscribe is how long addrWatch waits before it subscribes
	// again after losing its subscription.
	addrResubscribe = time.Second
	// addrGrace is how long the advertised address may be missing while
	// another is present before weftd gives up on it: a network manager that
	// flushes and adds the same address again, or a DHCP client that drops
	// and takes back its lease, takes less.
	addrGrace = 5 * time.Second
)

// addrWatch checks the underlay device whenever the kernel notifies a
// change of a device of that index or name or of an address (and every
// addrResync): that it is still the device weftd started on, and still
// holds the addresses weftd took from it.
type addrWatch struct {
	index        int
	name         string
	want4, want6 netip.Addr // addresses taken from the device; invalid: not watched
	// need4 and need6: the device had an address of that family, which a
	// device recreated under its name must have before weftd uses it.
	need4, need6 bool
	log          *slog.Logger
}

// newAddrWatch watches the underlay u and the addresses of node that came
// from it (not those set by flag or annotation, even when the device holds
// them: the operator chose them, and a new start advertises them again).
func newAddrWatch(u underlayInfo, node Node, log *slog.Logger) addrWatch {
	w := addrWatch{index: u.index, name: u.name, need4: u.ipv4.IsValid(), need6: u.ipv6.IsValid(),
		log: log.With("component", "underlay")}
	if u.picked4 && node.PublicIP.IsValid() && node.PublicIP == u.ipv4 {
		w.want4 = node.PublicIP
	}
	if u.picked6 && node.PublicIPv6.IsValid() && node.PublicIPv6 == u.ipv6 {
		w.want6 = node.PublicIPv6
	}
	return w
}

// Run returns an *underlayChanged (errUnderlayChanged) once the device was
// recreated under its name and holds its addresses again, or once an
// advertised address has been missing for addrGrace while another global
// address of its family is there; nil when ctx ends.
func (w addrWatch) Run(ctx context.Context) error {
	h, err := netlink.NewHandle()
	if err != nil {
		return fmt.Errorf("watch the underlay: netlink: %w", err)
	}
	defer h.Close()
	sub := w.subscribe()
	defer func() { sub.stop() }()
	resync := time.NewTicker(addrResync)
	defer resync.Stop()
	grace := time.NewTimer(addrGrace)
	grace.Stop()
	defer grace.Stop()
	var since time.Time
	var failing string
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-resync.C:
		case <-grace.C:
		case <-sub.wake:
		case err := <-sub.lost:
			sub.stop()
			w.log.Warn("lost the kernel's notifications about the underlay; subscribing again", "err", err, "retryIn", addrResubscribe)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(addrResubscribe):
			}
			sub = w.subscribe() // it wakes a check: changes may have gone unseen
		}
		ch, err := w.check(h)
		switch {
		case err != nil:
			// The device gone, or back without its addresses yet: the
			// dataplane cannot run on it meanwhile, and the operator sees it.
			if err.Error() != failing {
				w.log.Warn("waiting for the underlay", "device", w.name, "err", err)
			}
			failing = err.Error()
			continue
		case ch == nil:
			failing, since = "", time.Time{}
			grace.Stop()
			continue
		case ch.recreated && !ch.old.IsValid():
			return ch
		case since.IsZero():
			since = time.Now()
			grace.Reset(addrGrace)
			w.log.Warn("the advertised underlay address is gone and another is there; waiting for it to come back",
				"device", w.name, "advertised", ch.old, "now", ch.now, "grace", addrGrace)
		}
		if time.Since(since) >= addrGrace {
			return ch
		}
	}
}

// subscription is addrWatch's subscription to link and address
// notifications: wake has a value after a notification that concerns the
// watch (and once at the start), lost an error once the subscription
// failed.
type subscription struct {
	wake <-chan struct{}
	lost <-chan error
	stop func()
}

// subscribe subscribes to link and address notifications in the calling
// thread's namespace. A failure to subscribe is reported on lost.
func (w addrWatch) subscribe() subscription {
	wake, lost := make(chan struct{}, 1), make(chan error, 2)
	wake <- struct{}{}
	done := make(chan struct{})
	links, addrs := make(chan netlink.LinkUpdate, 16), make(chan netlink.AddrUpdate, 16)
	onErr := func(err error) {
		select {
		case lost <- err:
		default:
		}
	}
	if err := netlink.LinkSubscribeWithOptions(links, done, netlink.LinkSubscribeOptions{ErrorCallback: onErr}); err != nil {
		close(links)
		onErr(fmt.Errorf("subscribe to link notifications: %w", err))
	}
	if err := netlink.AddrSubscribeWithOptions(addrs, done, netlink.AddrSubscribeOptions{ErrorCallback: onErr}); err != nil {
		close(addrs)
		onErr(fmt.Errorf("subscribe to address notifications: %w", err))
	}
	forwarded := make(chan struct{})
	go func() {
		defer close(forwarded)
		for links != nil || addrs != nil {
			select {
			case u, ok := <-links:
				if !ok {
					links = nil
					continue
				}
				if u.Attrs().Index != w.index && u.Attrs().Name != w.name {
					continue
				}
			case _, ok := <-addrs:
				if !ok {
					addrs = nil
					continue
				}
			}
			select {
			case wake <- struct{}{}:
			default:
			}
		}
	}()
	var once sync.Once
	return subscription{wake: wake, lost: lost, stop: func() {
		once.Do(func() { close(done); <-forwarded })
	}}
}

// check returns what changed (nil: nothing), or an error while the device
// is gone or, recreated, lacks an address of a family it had.
func (w addrWatch) check(h *netlink.Handle) (*underlayChanged, error) {
	l, err := h.LinkByIndex(w.index)
	if err == nil {
		addrs, err := h.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return nil, err
		}
		if old, now := w.replacement(addrs); old.IsValid() {
			return &underlayChanged{device: w.name, old: old, now: now}, nil
		}
		return nil, nil
	}
	if !errors.As(err, &netlink.LinkNotFoundError{}) {
		return nil, err
	}
	if l, err = h.LinkByName(w.name); err != nil {
		return nil, fmt.Errorf("device gone: %w", err)
	}
	addrs, err := h.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		return nil, err
	}
	for _, fam := range []struct {
		need bool
		is4  bool
	}{{w.need4, true}, {w.need6, false}} {
		if fam.need && !hasSettled(addrs, fam.is4) {
			return nil, fmt.Errorf("device recreated (index %d, was %d), waiting for its addresses", l.Attrs().Index, w.index)
		}
	}
	old, now := w.replacement(addrs)
	return &underlayChanged{device: w.name, recreated: true, old: old, now: now}, nil
}

// replacement returns an advertised address missing from addrs and the
// global address of the same family that took its place, when there is
// one. Addresses that are not settled in their place are not taken for it
// (settled).
func (w addrWatch) replacement(addrs []netlink.Addr) (old, now netip.Addr) {
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
			case ip.Is4() == want.Is4() && settled(a) && !other.IsValid():
				other = ip
			}
		}
		if !found.IsValid() && other.IsValid() {
			return want, other
		}
	}
	return old, now
}

// settled reports whether a is a global address in its place: not a
// secondary address (a VIP beside the primary), a tentative IPv6 address
// (duplicate detection still running) or a deprecated one.
func settled(a netlink.Addr) bool {
	ip, ok := netip.AddrFromSlice(a.IP)
	return ok && ip.Unmap().IsGlobalUnicast() &&
		a.Flags&(unix.IFA_F_SECONDARY|unix.IFA_F_TENTATIVE|unix.IFA_F_DEPRECATED) == 0
}

// hasSettled reports whether addrs hold a settled address of the
// family (IPv4 when is4).
func hasSettled(addrs []netlink.Addr, is4 bool) bool {
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap().Is4() == is4 && settled(a) {
			return true
		}
	}
	return false
}
