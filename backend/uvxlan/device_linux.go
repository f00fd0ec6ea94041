package uvxlan

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"unsafe"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/songgao/water"
	"github.com/vishvananda/netlink"
	"github.com/weft-net/weft/backend"
	"golang.org/x/sys/unix"
)

// datapath is what Run opened: the TAP, the sockets and the netlink handle.
type datapath struct {
	b         *Backend
	h         *netlink.Handle
	ownHandle bool
	linkIndex int
	taps      []io.ReadWriteCloser // one per queue
	vnet      bool                 // the TAP carries a virtio-net header (offloads on)
	rxs       []*udpSocket         // bound to the VXLAN port, one per queue
	tx        []*udpSocket         // one per source port
	overlay   *backend.Overlay
	closing   atomic.Bool // set by close: the loops' errors are expected
}

// inNS runs f with the calling thread in the namespace at path ("" = here).
func inNS(path string, f func() error) error {
	if path == "" {
		return f()
	}
	return ns.WithNetNSPath(path, func(ns.NetNS) error { return f() })
}

// open creates the TAP, configures the link and opens the sockets.
func (b *Backend) open() (_ *datapath, err error) {
	dp := &datapath{b: b, h: b.cfg.Handle}
	defer func() {
		if err != nil {
			dp.close()
		}
	}()
	if dp.h == nil {
		if dp.h, err = handleIn(b.cfg.NetNS); err != nil {
			return nil, err
		}
		dp.ownHandle = true
	}
	err = inNS(b.cfg.NetNS, func() error {
		if err := dp.openTAP(); err != nil {
			return err
		}
		return dp.openSockets()
	})
	if err != nil {
		return nil, err
	}
	if err := dp.configureLink(); err != nil {
		return nil, err
	}
	b.log.Info("device ready", "offloads", dp.vnet, "local", b.cfg.Local, "port", b.cfg.Port, "mtu", b.cfg.MTU)
	return dp, nil
}

func handleIn(path string) (*netlink.Handle, error) {
	if path == "" {
		h, err := netlink.NewHandle()
		if err != nil {
			return nil, fmt.Errorf("open netlink handle: %w", err)
		}
		return h, nil
	}
	var h *netlink.Handle
	err := inNS(path, func() (err error) {
		h, err = netlink.NewHandle()
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("open netlink handle in %s: %w", path, err)
	}
	return h, nil
}

// openTAP opens (or re-attaches to) the persistent TAP device. The plain
// path uses water, which sets only IFF_TAP|IFF_NO_PI at TUNSETIFF time; the
// offload path needs IFF_VNET_HDR, which water cannot set, so it opens
// /dev/net/tun itself (openVnetTAP).
func (dp *datapath) openTAP() error {
	cfg := dp.b.cfg
	multi := cfg.Queues > 1
	for range cfg.Queues {
		if cfg.Plain {
			wc := water.Config{DeviceType: water.TAP}
			wc.Name = cfg.Name
			wc.Persist = true
			wc.MultiQueue = multi
			ifce, err := water.New(wc)
			if err != nil {
				return fmt.Errorf("open tap %s: %w", cfg.Name, err)
			}
			// water's Interface is not a syscall.Conn; the file inside it is.
			dp.taps = append(dp.taps, ifce.ReadWriteCloser)
			continue
		}
		f, err := openVnetTAP(cfg.Name, multi)
		if err != nil {
			return err
		}
		dp.taps, dp.vnet = append(dp.taps, f), true
	}
	return nil
}

// ifreq is struct ifreq as TUNSETIFF reads it: a name and the flags.
type ifreq struct {
	name  [unix.IFNAMSIZ]byte
	flags uint16
	_     [22]byte
}

// openVnetTAP opens a persistent TAP with a 10-byte virtio-net header in
// front of every frame and TSO/checksum offloads, non-blocking so that the
// Go poller can wake a blocked Read on Close.
func openVnetTAP(name string, multi bool) (*os.File, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open /dev/net/tun: %w", err)
	}
	fail := func(what string, err error) (*os.File, error) {
		unix.Close(fd)
		return nil, fmt.Errorf("open tap %s: %s: %w", name, what, err)
	}
	var req ifreq
	copy(req.name[:], name)
	req.flags = unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR
	if multi {
		req.flags |= unix.IFF_MULTI_QUEUE
	}
	if err := ioctlPtr(fd, unix.TUNSETIFF, unsafe.Pointer(&req)); err != nil {
		return fail("TUNSETIFF", err)
	}
	hdrLen := int32(virtioNetHdrLen)
	if err := ioctlPtr(fd, unix.TUNSETVNETHDRSZ, unsafe.Pointer(&hdrLen)); err != nil {
		return fail("TUNSETVNETHDRSZ", err)
	}
	if err := unix.IoctlSetInt(fd, unix.TUNSETOFFLOAD, unix.TUN_F_CSUM|unix.TUN_F_TSO4|unix.TUN_F_TSO6); err != nil {
		return fail("TUNSETOFFLOAD", err)
	}
	if err := unix.IoctlSetInt(fd, unix.TUNSETPERSIST, 1); err != nil {
		return fail("TUNSETPERSIST", err)
	}
	return os.NewFile(uintptr(fd), "tap:"+name), nil
}

func ioctlPtr(fd int, req uint, p unsafe.Pointer) error {
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(req), uintptr(p)); e != 0 {
		return e
	}
	return nil
}

// configureLink sets the TAP's MAC, MTU and address and brings it up.
func (dp *datapath) configureLink() error {
	cfg := dp.b.cfg
	l, err := dp.h.LinkByName(cfg.Name)
	if err != nil {
		return fmt.Errorf("find %s: %w", cfg.Name, err)
	}
	dp.linkIndex = l.Attrs().Index
	if !equalMAC(l.Attrs().HardwareAddr, cfg.MAC[:]) {
		if err := dp.h.LinkSetHardwareAddr(l, cfg.MAC.HardwareAddr()); err != nil {
			return fmt.Errorf("set mac of %s: %w", cfg.Name, err)
		}
	}
	if l.Attrs().MTU != cfg.MTU {
		if err := dp.h.LinkSetMTU(l, cfg.MTU); err != nil {
			return fmt.Errorf("set mtu of %s: %w", cfg.Name, err)
		}
	}
	for _, p := range []netip.Prefix{cfg.Subnet, cfg.IPv6Subnet} {
		if !p.IsValid() {
			continue
		}
		a := subnetAddr(p)
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(a.BitLen(), a.BitLen())}}
		if a.Is6() {
			addr.Flags = unix.IFA_F_NODAD
		}
		if err := dp.h.AddrReplace(l, addr); err != nil {
			return fmt.Errorf("add %s to %s: %w", a, cfg.Name, err)
		}
	}
	if l.Attrs().Flags&net.FlagUp == 0 {
		// No IPv6 link-local address: it would only make the kernel send
		// router solicitations and MLD reports that no peer can take.
		if err := dp.h.LinkSetIP6AddrGenMode(l, 1 /* IN6_ADDR_GEN_MODE_NONE */); err != nil {
			dp.b.log.Warn("disable ipv6 link-local address", "err", err)
		}
	}
	if err := dp.h.LinkSetUp(l); err != nil {
		return fmt.Errorf("set %s up: %w", cfg.Name, err)
	}
	return nil
}

func equalMAC(a net.HardwareAddr, b []byte) bool { return string(a) == string(b) }

// close releases what open acquired. The device itself stays (persistent).
func (dp *datapath) close() {
	dp.closing.Store(true)
	for _, t := range dp.taps {
		t.Close()
	}
	for _, s := range dp.rxs {
		s.close()
	}
	for _, s := range dp.tx {
		s.close()
	}
	if dp.ownHandle && dp.h != nil {
		dp.h.Close()
	}
}

// RemoveDevice deletes the TAP device of the userspace backend for vni (named
// DeviceName(vni)) in the namespace of h, with its address, neighbours and
// routes. The daemon calls it when a node switches back to the kernel
// backend. A missing device is not an error; a device of that name that is
// not a TAP is left alone and reported.
func RemoveDevice(h *netlink.Handle, vni int) error {
	return RemoveDeviceNamed(h, DeviceName(vni))
}

// RemoveDeviceNamed is RemoveDevice for a device with a non-default name.
func RemoveDeviceNamed(h *netlink.Handle, name string) error {
	l, err := h.LinkByName(name)
	if err != nil {
		var notFound netlink.LinkNotFoundError
		if errors.As(err, &notFound) {
			return nil
		}
		return fmt.Errorf("remove %s: %w", name, err)
	}
	if _, ok := l.(*netlink.Tuntap); !ok {
		return fmt.Errorf("remove %s: is a %s device, not a tap", name, l.Type())
	}
	if err := h.LinkDel(l); err != nil {
		return fmt.Errorf("remove %s: %w", name, err)
	}
	return nil
}
