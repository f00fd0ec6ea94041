package vxlan

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/weft-net/weft/backend/kernel"
	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/vtep"
)

// deviceSpec is the VXLAN device of one address family.
type deviceSpec struct {
	name     string
	family   int
	vni      int
	port     int
	underlay int
	local    netip.Addr
	addr     netip.Prefix // <subnet>.0/32 or <subnet>::/128
	mac      subnet.MAC
	mtu      int
	gbp      bool
	learning bool
	add      func(netlink.Link) error // creates the device; nil: the handle's LinkAdd
}

// ErrNoDriver is returned, wrapped, when the kernel refuses to create a
// VXLAN device because it has no driver for the kind: rtnetlink asks for
// the module (rtnl-link-vxlan), and when none loads (not installed, as on
// Ubuntu without linux-modules-extra, or a kernel built without modules)
// answers EOPNOTSUPP, "Unknown device type". Other errors (EPERM without
// CAP_NET_ADMIN, EEXIST, EINVAL for bad attributes, ENODEV for a missing
// underlay) say nothing about the driver and are not this.
var ErrNoDriver = errors.New("the kernel has no VXLAN driver")

// noDriver wraps err with ErrNoDriver when it is the kernel's answer for a
// link kind it has no driver for.
func noDriver(err error) error {
	if errors.Is(err, unix.EOPNOTSUPP) {
		return fmt.Errorf("%w: %w", ErrNoDriver, err)
	}
	return err
}

// compatible reports whether an existing device can be adopted as s: the
// attributes the kernel cannot change on a live device, or that identify it,
// agree. MTU and MAC are fixed in place instead.
func (s deviceSpec) compatible(v *netlink.Vxlan) bool {
	src, _ := netip.AddrFromSlice(v.SrcAddr)
	return v.VxlanId == s.vni && v.Port == s.port && v.VtepDevIndex == s.underlay &&
		src.Unmap() == s.local && v.GBP == s.gbp && v.Learning == s.learning
}

func (s deviceSpec) link(mtu int) *netlink.Vxlan {
	la := netlink.NewLinkAttrs()
	la.Name = s.name
	la.MTU = mtu
	la.HardwareAddr = s.mac.HardwareAddr()
	return &netlink.Vxlan{
		LinkAttrs:    la,
		VxlanId:      s.vni,
		VtepDevIndex: s.underlay,
		SrcAddr:      s.local.AsSlice(),
		Port:         s.port,
		Learning:     s.learning,
		GBP:          s.gbp,
	}
}

// ensureDevice makes the device exist, compatible, with the right MAC and
// MTU, up, and holding exactly its address of its family. It adopts a
// compatible device as it is. It returns the device's index and whether it
// had to create it.
func ensureDevice(h *netlink.Handle, s deviceSpec, log *slog.Logger) (int, bool, error) {
	l, err := h.LinkByName(s.name)
	var notFound netlink.LinkNotFoundError
	switch {
	case errors.As(err, &notFound):
		l = nil
	case err != nil:
		return 0, false, fmt.Errorf("find device %s: %w", s.name, err)
	}
	if l != nil {
		if v, ok := l.(*netlink.Vxlan); !ok || !s.compatible(v) {
			log.Warn("recreating incompatible device", "device", s.name, "type", l.Type())
			if err := h.LinkDel(l); err != nil {
				return 0, false, fmt.Errorf("delete incompatible device %s: %w", s.name, err)
			}
			l = nil
		}
	}
	created := false
	if l == nil {
		if l, err = createDevice(h, s, log); err != nil {
			return 0, false, err
		}
		created = true
	}
	if err := fixDevice(h, l, s); err != nil {
		return 0, created, err
	}
	return l.Attrs().Index, created, nil
}

func createDevice(h *netlink.Handle, s deviceSpec, log *slog.Logger) (netlink.Link, error) {
	if err := removeConflicts(h, s, log); err != nil {
		return nil, err
	}
	mtu := s.mtu
	if mtu == 0 {
		u, err := h.LinkByIndex(s.underlay)
		if err != nil {
			return nil, fmt.Errorf("find underlay link %d: %w", s.underlay, err)
		}
		mtu = vtep.OverlayMTU(u.Attrs().MTU, s.family == netlink.FAMILY_V6)
	}
	add := s.add
	if add == nil {
		add = h.LinkAdd
	}
	if err := add(s.link(mtu)); err != nil {
		return nil, fmt.Errorf("create device %s: %w", s.name, noDriver(err))
	}
	l, err := h.LinkByName(s.name)
	if err != nil {
		return nil, fmt.Errorf("find created device %s: %w", s.name, err)
	}
	log.Info("created device", "device", s.name, "vni", s.vni, "port", s.port, "local", s.local, "mac", s.mac, "mtu", mtu)
	return l, nil
}

// removeConflicts deletes VXLAN devices under other names that use our VNI
// and port with a local address of our family (flannel.1 left by flanneld):
// the kernel refuses a second such device.
func removeConflicts(h *netlink.Handle, s deviceSpec, log *slog.Logger) error {
	links, err := kernel.ListLinks(h)
	if err != nil {
		return err
	}
	for _, l := range links {
		v, ok := l.(*netlink.Vxlan)
		if !ok || v.Name == s.name || v.VxlanId != s.vni || v.Port != s.port {
			continue
		}
		src, _ := netip.AddrFromSlice(v.SrcAddr)
		if src.IsValid() && src.Unmap().Is4() != s.local.Is4() {
			continue
		}
		log.Warn("removing a device that uses our VNI and port", "device", v.Name, "vni", v.VxlanId, "port", v.Port)
		if err := h.LinkDel(l); err != nil {
			return fmt.Errorf("delete conflicting device %s: %w", v.Name, err)
		}
	}
	return nil
}

// fixDevice sets the MAC, MTU, state and address of an existing device where
// they differ; it changes nothing that is already right.
func fixDevice(h *netlink.Handle, l netlink.Link, s deviceSpec) error {
	a := l.Attrs()
	if subnet.MAC(a.HardwareAddr) != s.mac || len(a.HardwareAddr) != 6 {
		if err := h.LinkSetHardwareAddr(l, s.mac.HardwareAddr()); err != nil {
			return fmt.Errorf("set mac of %s: %w", s.name, err)
		}
	}
	if s.mtu != 0 && a.MTU != s.mtu {
		if err := h.LinkSetMTU(l, s.mtu); err != nil {
			return fmt.Errorf("set mtu of %s: %w", s.name, err)
		}
	}
	if a.Flags&net.FlagUp == 0 {
		if err := h.LinkSetUp(l); err != nil {
			return fmt.Errorf("set %s up: %w", s.name, err)
		}
	}
	return ensureAddr(h, l, s)
}

// ensureAddr puts s.addr on the device and removes the other global
// addresses of its family (a previous subnet of this node).
func ensureAddr(h *netlink.Handle, l netlink.Link, s deviceSpec) error {
	addrs, err := kernel.ListAddrs(h, l, s.family)
	if err != nil {
		return err
	}
	found := false
	for _, a := range addrs {
		ip, _ := netip.AddrFromSlice(a.IP)
		ones, _ := a.Mask.Size()
		p := netip.PrefixFrom(ip.Unmap(), ones)
		switch {
		case p == s.addr:
			found = true
		case ip.IsLinkLocalUnicast():
		default:
			if err := h.AddrDel(l, &a); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
				return fmt.Errorf("delete stale address %s from %s: %w", p, s.name, err)
			}
		}
	}
	if found {
		return nil
	}
	addr := &netlink.Addr{IPNet: kernel.PrefixIPNet(s.addr)}
	if s.family == netlink.FAMILY_V6 {
		addr.Flags = unix.IFA_F_NODAD
	}
	if err := h.AddrReplace(l, addr); err != nil {
		return fmt.Errorf("add address %s to %s: %w", s.addr, s.name, err)
	}
	return nil
}

// RemoveDevices deletes the VXLAN devices with the default names for vni
// (weft.<vni> and weft-v6.<vni>) in h's namespace, and with them every
// neighbour, FDB entry and route on them. The daemon calls it when a node
// switches to another backend. Missing devices are not an error.
func RemoveDevices(h *netlink.Handle, vni int) error {
	if vni == 0 {
		vni = DefaultVNI
	}
	var errs []error
	for _, name := range []string{DeviceName(vni, false), DeviceName(vni, true)} {
		l, err := h.LinkByName(name)
		var notFound netlink.LinkNotFoundError
		if errors.As(err, &notFound) {
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("find device %s: %w", name, err))
			continue
		}
		if _, ok := l.(*netlink.Vxlan); !ok {
			continue
		}
		if err := h.LinkDel(l); err != nil {
			errs = append(errs, fmt.Errorf("delete device %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// RemovePortHolders deletes every kernel VXLAN device in the namespace of h
// whose UDP port is port, whatever its VNI or name (flannel.<VNI> left by
// flanneld, weft's own weft.<VNI>): the kernel opens one socket on that
// port for them, which a userspace dataplane needs. Each removal is logged.
func RemovePortHolders(h *netlink.Handle, port int, log *slog.Logger) error {
	links, err := h.LinkList()
	if err != nil {
		return fmt.Errorf("list devices: %w", err)
	}
	var errs []error
	for _, l := range links {
		v, ok := l.(*netlink.Vxlan)
		if !ok || v.Port != port {
			continue
		}
		log.Warn("removing a kernel vxlan device that holds the vxlan port", "device", v.Name, "vni", v.VxlanId, "port", v.Port)
		if err := h.LinkDel(l); err != nil {
			errs = append(errs, fmt.Errorf("delete device %s: %w", v.Name, err))
		}
	}
	return errors.Join(errs...)
}
