package kubeprobe

import (
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"

	"github.com/weft-net/weft/internal/ops/inspect"
)

// VTEPAddr returns the IPv4 address of the overlay device in this network
// namespace (weft's or flanneld's, see inspect.FindDevice): the address
// the other nodes reach this one on over the overlay.
func VTEPAddr() (netip.Addr, error) {
	h, err := netlink.NewHandle()
	if err != nil {
		return netip.Addr{}, fmt.Errorf("netlink: %w", err)
	}
	defer h.Close()
	d, err := inspect.FindDevice(h, "")
	if err != nil {
		return netip.Addr{}, err
	}
	for _, a := range d.Addrs {
		if a.Addr().Is4() {
			return a.Addr(), nil
		}
	}
	return netip.Addr{}, fmt.Errorf("%s has no IPv4 address", d.Name)
}
