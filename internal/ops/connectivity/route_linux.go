package connectivity

import (
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
)

// linkMTU is the MTU of the device that the namespace do enters routes
// dst through: the largest packet a socket there sends to dst unfragmented,
// and so the size of the DF probe.
func linkMTU(do Do, dst netip.Addr) (int, error) {
	var mtu int
	err := do.Run(func() error {
		h, err := netlink.NewHandle()
		if err != nil {
			return err
		}
		defer h.Close()
		rs, err := h.RouteGet(dst.AsSlice())
		if err != nil {
			return err
		}
		if len(rs) == 0 {
			return fmt.Errorf("no route")
		}
		l, err := h.LinkByIndex(rs[0].LinkIndex)
		if err != nil {
			return err
		}
		mtu = l.Attrs().MTU
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("MTU of the route to %s: %w", dst, err)
	}
	return mtu, nil
}
