package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/weft-net/weft/backend/kernel"
	"github.com/weft-net/weft/subnet"
)

// blackholeMetric is the metric of the blackhole route for the node's own
// pod subnet (--ip-blackhole-route): high enough that the bridge's connected
// route for the same subnet, once a pod exists, always wins, so the
// blackhole only catches what no pod answers for.
const blackholeMetric = 0xffff

// blackholes keeps, as flanneld does with --ip-blackhole-route, a blackhole
// route for each of the lease's subnets in the main table: packets for an
// address of this node's subnet that no pod holds are dropped here instead
// of following the default route out of the node. It is repaired like the
// dataplanes' routes, through the shared kernel.Reconciler: a deleted
// blackhole comes back as soon as the kernel reports the deletion, and a
// full check runs every kernel.DefaultResync. weft's blackholes (its
// protocol and metric) for subnets that are no longer this node's are
// removed.
type blackholes struct {
	want []netip.Prefix
	log  *slog.Logger
}

func newBlackholes(lease subnet.Lease, log *slog.Logger) *blackholes {
	b := &blackholes{log: log.With("component", "blackhole")}
	for _, p := range []netip.Prefix{lease.Subnet, lease.IPv6Subnet} {
		if p.IsValid() {
			b.want = append(b.want, p.Masked())
		}
	}
	return b
}

// Run keeps the routes until ctx ends; it leaves them in place then, as
// the dataplanes leave theirs.
func (b *blackholes) Run(ctx context.Context) error {
	h, err := netlink.NewHandle()
	if err != nil {
		return fmt.Errorf("blackhole routes: netlink: %w", err)
	}
	defer h.Close()
	r := kernel.Reconciler{
		Log:    b.log,
		Resync: kernel.DefaultResync,
		Sync:   func(bool) error { return b.sync(h) },
		Drift:  func() kernel.Drift { return kernel.Drift{Route: b.drift} },
	}
	return r.Run(ctx)
}

// drift reports the deletion of one of the wanted blackholes.
func (b *blackholes) drift(u netlink.RouteUpdate) bool {
	if u.Dst == nil || (u.Table != 0 && u.Table != unix.RT_TABLE_MAIN) {
		return false
	}
	ones, _ := u.Dst.Mask.Size()
	dst, _ := netip.AddrFromSlice(u.Dst.IP)
	if !slices.Contains(b.want, netip.PrefixFrom(dst.Unmap(), ones)) {
		return false
	}
	return u.Type == unix.RTM_DELROUTE && u.Route.Type == unix.RTN_BLACKHOLE
}

// sync adds the wanted blackholes that are missing and removes weft's
// other ones.
func (b *blackholes) sync(h *netlink.Handle) error {
	var errs []error
	have := map[netip.Prefix]bool{}
	for _, family := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rs, err := kernel.ListRoutes(h, family, &netlink.Route{Table: unix.RT_TABLE_MAIN, Type: unix.RTN_BLACKHOLE},
			netlink.RT_FILTER_TABLE|netlink.RT_FILTER_TYPE)
		if err != nil {
			return fmt.Errorf("blackhole routes: %w", err)
		}
		for _, r := range rs {
			if r.Dst == nil || r.Protocol != kernel.RouteProtocol || r.Priority != blackholeMetric {
				continue
			}
			ones, _ := r.Dst.Mask.Size()
			dst, _ := netip.AddrFromSlice(r.Dst.IP)
			p := netip.PrefixFrom(dst.Unmap(), ones)
			if slices.Contains(b.want, p) {
				have[p] = true
				continue
			}
			if err := h.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
				errs = append(errs, fmt.Errorf("remove blackhole route %s: %w", p, err))
				continue
			}
			b.log.Info("removed the blackhole route of a subnet no longer this node's", "subnet", p)
		}
	}
	for _, p := range b.want {
		if have[p] {
			continue
		}
		r := &netlink.Route{Dst: kernel.PrefixIPNet(p), Type: unix.RTN_BLACKHOLE,
			Table: unix.RT_TABLE_MAIN, Priority: blackholeMetric, Protocol: kernel.RouteProtocol}
		if err := h.RouteReplace(r); err != nil {
			errs = append(errs, fmt.Errorf("blackhole route %s: %w", p, err))
			continue
		}
		b.log.Info("added the blackhole route (--ip-blackhole-route)", "subnet", p)
	}
	return errors.Join(errs...)
}
