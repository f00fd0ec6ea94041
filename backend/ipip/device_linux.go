package ipip

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/weft-net/weft/backend/kernel"
)

// DeviceName is the tunnel device's name, Flannel's.
const DeviceName = "flannel.ipip"

// Overhead is what the outer IPv4 header takes off the underlay MTU.
const Overhead = 20

// deviceSpec is the tunnel device as it must be.
type deviceSpec struct {
	local netip.Addr   // underlay IPv4 address, the tunnel's local end
	addr  netip.Prefix // <subnet>.0/32
	mtu   int
}

// compatible reports whether an existing device can be adopted: an IPIP
// tunnel from our local address to any remote. MTU, state and address are
// fixed in place.
func (s deviceSpec) compatible(l netlink.Link) bool {
	t, ok := l.(*netlink.Iptun)
	if !ok {
		return false
	}
	local, _ := netip.AddrFromSlice(t.Local)
	remote, _ := netip.AddrFromSlice(t.Remote)
	return local.Unmap() == s.local && (!remote.IsValid() || remote.Unmap().IsUnspecified())
}

// ensureDevice makes the device exist, compatible, with the right MTU, up,
// and holding exactly its IPv4 address. It returns the device's index and
// whether it had to create it.
func ensureDevice(h *netlink.Handle, s deviceSpec, log *slog.Logger) (int, bool, error) {
	l, err := h.LinkByName(DeviceName)
	var notFound netlink.LinkNotFoundError
	switch {
	case errors.As(err, &notFound):
		l = nil
	case err != nil:
		return 0, false, fmt.Errorf("find device %s: %w", DeviceName, err)
	}
	if l != nil && !s.compatible(l) {
		log.Warn("recreating incompatible device", "device", DeviceName, "type", l.Type(), "want_local", s.local)
		if err := h.LinkDel(l); err != nil {
			return 0, false, fmt.Errorf("delete incompatible device %s: %w", DeviceName, err)
		}
		l = nil
	}
	created := false
	if l == nil {
		la := netlink.NewLinkAttrs()
		la.Name, la.MTU = DeviceName, s.mtu
		if err := h.LinkAdd(&netlink.Iptun{LinkAttrs: la, Local: s.local.AsSlice()}); err != nil {
			if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
				return 0, false, fmt.Errorf("create device %s: %w (does the kernel have IPIP? CONFIG_NET_IPIP, modprobe ipip)", DeviceName, err)
			}
			return 0, false, fmt.Errorf("create device %s: %w", DeviceName, err)
		}
		if l, err = h.LinkByName(DeviceName); err != nil {
			return 0, false, fmt.Errorf("find created device %s: %w", DeviceName, err)
		}
		created = true
		log.Info("created device", "device", DeviceName, "local", s.local, "mtu", s.mtu)
	}
	if err := fixDevice(h, l, s); err != nil {
		return 0, created, err
	}
	return l.Attrs().Index, created, nil
}

// fixDevice sets the MTU, state and address where they differ.
func fixDevice(h *netlink.Handle, l netlink.Link, s deviceSpec) error {
	a := l.Attrs()
	if a.MTU != s.mtu {
		if err := h.LinkSetMTU(l, s.mtu); err != nil {
			return fmt.Errorf("set mtu of %s to %d: %w", DeviceName, s.mtu, err)
		}
	}
	if a.Flags&net.FlagUp == 0 {
		if err := h.LinkSetUp(l); err != nil {
			return fmt.Errorf("set %s up: %w", DeviceName, err)
		}
	}
	addrs, err := kernel.ListAddrs(h, l, netlink.FAMILY_V4)
	if err != nil {
		return err
	}
	found := false
	for _, a := range addrs {
		ip, _ := netip.AddrFromSlice(a.IP)
		ones, _ := a.Mask.Size()
		if p := netip.PrefixFrom(ip.Unmap(), ones); p == s.addr {
			found = true
			continue
		}
		if err := h.AddrDel(l, &a); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			return fmt.Errorf("delete stale address %s from %s: %w", a.IPNet, DeviceName, err)
		}
	}
	if found {
		return nil
	}
	if err := h.AddrReplace(l, &netlink.Addr{IPNet: kernel.PrefixIPNet(s.addr)}); err != nil {
		return fmt.Errorf("add address %s to %s: %w", s.addr, DeviceName, err)
	}
	return nil
}

// RemoveDevice deletes the tunnel device in h's namespace, and with it every
// route through it. The daemon calls it when a node switches to another
// backend. A missing device, or one of another type, is left alone.
func RemoveDevice(h *netlink.Handle) error {
	l, err := h.LinkByName(DeviceName)
	var notFound netlink.LinkNotFoundError
	if errors.As(err, &notFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("find device %s: %w", DeviceName, err)
	}
	if _, ok := l.(*netlink.Iptun); !ok {
		return nil
	}
	if err := h.LinkDel(l); err != nil {
		return fmt.Errorf("delete device %s: %w", DeviceName, err)
	}
	return nil
}
