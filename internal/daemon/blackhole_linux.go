package daemon

import (
	"errors"
	"fmt"
	"net/netip"

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

// addBlackholes adds, as flanneld does with --ip-blackhole-route, a blackhole
// route for each of the lease's subnets: packets for an address of this
// node's subnet that no pod holds are dropped here instead of following the
// default route out of the node.
func addBlackholes(lease subnet.Lease) error {
	var errs []error
	for _, p := range []netip.Prefix{lease.Subnet, lease.IPv6Subnet} {
		if !p.IsValid() {
			continue
		}
		r := &netlink.Route{Dst: kernel.PrefixIPNet(p.Masked()), Type: unix.RTN_BLACKHOLE,
			Table: unix.RT_TABLE_MAIN, Priority: blackholeMetric, Protocol: kernel.RouteProtocol}
		if err := netlink.RouteReplace(r); err != nil {
			errs = append(errs, fmt.Errorf("blackhole route %s: %w", p.Masked(), err))
		}
	}
	return errors.Join(errs...)
}
