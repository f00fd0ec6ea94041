package uvxlan

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/songgao/water"
	"github.com/vishvananda/netlink"
	"github.com/weft-net/weft/backend/kernel"
	"github.com/weft-net/weft/vtep"
	"golang.org/x/sys/unix"
)

// datapath is what Run opened: the TAP queues, the sockets and the netlink
// handle. The packet loops read the current TAP queue and receive socket
// through atomic pointers, so the reconciler can replace a deleted TAP or a
// failed socket under them without a lock on the packet path.
type datapath struct {
	b         *Backend
	h         *netlink.Handle
	ownHandle bool
	vnet      bool                       // the TAP carries a virtio-net header (offloads on)
	taps      []atomic.Pointer[tapQueue] // one per queue
	tapGen    atomic.Pointer[chan struct{}]
	rxs       []atomic.Pointer[udpSocket] // bound to the VXLAN port, one per queue
	tx        []*udpSocket                // one per source port
	closing   atomic.Bool                 // set by stopReading and close: the loops' errors are expected
	adopted   bool                        // open took over queues or sockets kept by the last run (Config.Files)
	repair    chan struct{}               // a packet loop asks the reconciler for a full sync

	// Owned by the reconciler.
	linkIndex   int
	tapBroken   atomic.Bool // a packet loop lost its TAP queue
	overlay     *kernel.Overlay
	applied     vtep.Table          // the table last programmed, nil before
	programmed  bool                // the device and a table were programmed once
	fastErr     string              // why the fast path is not attached, as last logged
	bridgeErr   string              // why nothing is attached to the pod bridge, as last logged
	bridgeTried int                 // the pod bridge's index at the last sync (0: none)
	fastMapErr  string              // why peers are missing from the fast path's maps, as last logged
	fastTable   *vtep.Table         // the table last written into the fast path's maps
	fastRoutes  map[netip.Addr]bool // peer addresses whose route was checked: true if it leaves elsewhere
	fastFull    time.Time           // when all were last checked again
}

// tapQueue is one open queue of the TAP.
type tapQueue struct {
	rw io.ReadWriteCloser
	rc syscall.RawConn
}

func (t *tapQueue) close() { t.rw.Close() }

// inNS runs f with the calling thread in the namespace at path ("" = here).
func inNS(path string, f func() error) error {
	if path == "" {
		return f()
	}
	return ns.WithNetNSPath(path, func(ns.NetNS) error { return f() })
}

// open creates the TAP, configures the link and opens the sockets.
func (b *Backend) open() (_ *datapath, err error) {
	dp := &datapath{b: b, h: b.cfg.Handle, vnet: !b.cfg.Plain, repair: make(chan struct{}, 1),
		taps: make([]atomic.Pointer[tapQueue], b.cfg.Queues), rxs: make([]atomic.Pointer[udpSocket], b.cfg.Queues)}
	gen := make(chan struct{})
	dp.tapGen.Store(&gen)
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
		qs, err := dp.openTAP()
		if err != nil {
			return err
		}
		dp.swapTAP(qs)
		return dp.openSockets()
	})
	if err != nil {
		return nil, err
	}
	if _, err := dp.configureLink(); err != nil {
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

// openTAP opens (or re-attaches to) the persistent TAP device, one file per
// queue. The plain path uses water, which sets only IFF_TAP|IFF_NO_PI at
// TUNSETIFF time; the offload path needs IFF_VNET_HDR, which water cannot
// set, so it opens /dev/net/tun itself (openVnetTAP).
func (dp *datapath) openTAP() (_ []*tapQueue, err error) {
	cfg := dp.b.cfg
	multi := cfg.Queues > 1
	var qs []*tapQueue
	defer func() {
		if err != nil {
			for _, q := range qs {
				q.close()
			}
		}
	}()
	for i := range cfg.Queues {
		q, adopted, err := reuseOrOpen(dp.b, cfg.tapFileName(i),
			func(f *os.File) (*tapQueue, error) { return dp.adoptTAP(f, multi) },
			func() (*tapQueue, error) { return openTAPQueue(cfg, multi) },
			func(q *tapQueue) syscall.RawConn { return q.rc })
		if err != nil {
			return nil, err
		}
		qs = append(qs, q)
		dp.adopted = dp.adopted || adopted
	}
	return qs, nil
}

// openTAPQueue opens one queue of the TAP.
func openTAPQueue(cfg Config, multi bool) (*tapQueue, error) {
	var rw io.ReadWriteCloser
	if cfg.Plain {
		wc := water.Config{DeviceType: water.TAP}
		wc.Name = cfg.Name
		wc.Persist = true
		wc.MultiQueue = multi
		ifce, err := water.New(wc)
		if err != nil {
			return nil, fmt.Errorf("open tap %s: %w", cfg.Name, err)
		}
		rw = ifce.ReadWriteCloser
	} else {
		f, err := openVnetTAP(cfg.Name, multi)
		if err != nil {
			return nil, err
		}
		rw = f
	}
	q := &tapQueue{rw: rw}
	// water's Interface is not a syscall.Conn; the file inside it is.
	sc, ok := rw.(syscall.Conn)
	if !ok {
		rw.Close()
		return nil, fmt.Errorf("open tap %s: %T is not a syscall.Conn", cfg.Name, rw)
	}
	var err error
	if q.rc, err = sc.SyscallConn(); err != nil {
		rw.Close()
		return nil, fmt.Errorf("open tap %s: %w", cfg.Name, err)
	}
	return q, nil
}

// swapTAP puts new TAP queues in place, closes the old ones and wakes the
// egress loops waiting for them.
func (dp *datapath) swapTAP(qs []*tapQueue) {
	for i, q := range qs {
		if old := dp.taps[i].Swap(q); old != nil {
			old.close()
		}
	}
	dp.tapBroken.Store(false)
	gen := make(chan struct{})
	close(*dp.tapGen.Swap(&gen))
}

// waitTAP blocks until the TAP queue q is no longer old (the reconciler
// replaced it) or the loops stop (stopReading, close); it reports whether
// to go on. Whoever replaces a queue or sets closing then closes the
// channel in tapGen, so both are checked after it is loaded.
func (dp *datapath) waitTAP(q int, old *tapQueue) bool {
	for {
		gen := *dp.tapGen.Load()
		if dp.closing.Load() {
			return false
		}
		if dp.taps[q].Load() != old {
			return true
		}
		<-gen
	}
}

// lostTAP is called by a packet loop whose TAP queue failed: it asks the
// reconciler for a full sync, which opens the device again.
func (dp *datapath) lostTAP(q int, err error) {
	if !dp.tapBroken.Swap(true) {
		dp.b.log.Warn("tap queue failed; reopening the device", "queue", q, "err", err)
	}
	dp.askRepair()
}

func (dp *datapath) askRepair() {
	select {
	case dp.repair <- struct{}{}:
	default:
	}
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

// linkFix says what configureLink had to put back.
type linkFix struct {
	link    bool // MAC, MTU or up state
	address bool
}

// configureLink sets the TAP's MAC, MTU and address and brings it up,
// writing only what differs, and reports what it changed.
func (dp *datapath) configureLink() (linkFix, error) {
	var fix linkFix
	cfg := dp.b.cfg
	l, err := dp.h.LinkByName(cfg.Name)
	if err != nil {
		return fix, fmt.Errorf("find %s: %w", cfg.Name, err)
	}
	dp.linkIndex = l.Attrs().Index
	if !equalMAC(l.Attrs().HardwareAddr, cfg.MAC[:]) {
		fix.link = true
		if err := dp.h.LinkSetHardwareAddr(l, cfg.MAC.HardwareAddr()); err != nil {
			return fix, fmt.Errorf("set mac of %s: %w", cfg.Name, err)
		}
	}
	if l.Attrs().MTU != cfg.MTU {
		fix.link = true
		if err := dp.h.LinkSetMTU(l, cfg.MTU); err != nil {
			return fix, fmt.Errorf("set mtu of %s: %w", cfg.Name, err)
		}
	}
	if fix.address, err = dp.ensureAddrs(l); err != nil {
		return fix, err
	}
	if l.Attrs().Flags&net.FlagUp == 0 {
		fix.link = true
		// No IPv6 link-local address: it would only make the kernel send
		// router solicitations and MLD reports that no peer can take.
		if err := dp.h.LinkSetIP6AddrGenMode(l, 1 /* IN6_ADDR_GEN_MODE_NONE */); err != nil {
			dp.b.log.Warn("disable ipv6 link-local address", "err", err)
		}
		if err := dp.h.LinkSetUp(l); err != nil {
			return fix, fmt.Errorf("set %s up: %w", cfg.Name, err)
		}
	}
	return fix, nil
}

// ensureAddrs puts <Subnet>.0/32 (<IPv6Subnet>::/128) on the TAP unless it
// is there, and reports whether it added one.
func (dp *datapath) ensureAddrs(l netlink.Link) (bool, error) {
	cfg := dp.b.cfg
	have, err := dp.h.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		return false, fmt.Errorf("list addresses of %s: %w", cfg.Name, err)
	}
	added := false
	for _, p := range []netip.Prefix{cfg.Subnet, cfg.IPv6Subnet} {
		if !p.IsValid() {
			continue
		}
		a := subnetAddr(p)
		want := &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(a.BitLen(), a.BitLen())}
		if slices.ContainsFunc(have, func(h netlink.Addr) bool { return h.IPNet.String() == want.String() }) {
			continue
		}
		addr := &netlink.Addr{IPNet: want}
		if a.Is6() {
			addr.Flags = unix.IFA_F_NODAD
		}
		if err := dp.h.AddrReplace(l, addr); err != nil {
			return added, fmt.Errorf("add %s to %s: %w", a, cfg.Name, err)
		}
		added = true
	}
	return added, nil
}

func equalMAC(a net.HardwareAddr, b []byte) bool { return string(a) == string(b) }

// stopReading makes the packet loops return once they have handled what
// they read: it sets closing and a read deadline in the past on the TAP
// queues and receive sockets, which wakes loops that wait and fails their
// next read, and wakes the egress loops waiting for a lost TAP (waitTAP).
// What they have not read stays in the queues. It is called once, before
// close, with the reconciler stopped.
func (dp *datapath) stopReading() {
	dp.closing.Store(true)
	// close closes the channel in tapGen when it runs: put a fresh one in
	// its place.
	fresh := make(chan struct{})
	close(*dp.tapGen.Swap(&fresh))
	past := time.Unix(1, 0)
	for i := range dp.taps {
		if q := dp.taps[i].Load(); q != nil {
			if d, ok := q.rw.(interface{ SetReadDeadline(time.Time) error }); ok {
				d.SetReadDeadline(past) // a TAP without deadlines is stopped by close
			}
		}
	}
	for i := range dp.rxs {
		if s := dp.rxs[i].Load(); s != nil {
			s.conn.SetReadDeadline(past)
		}
	}
}

// close releases what open acquired. The device itself stays (persistent).
func (dp *datapath) close() {
	dp.closing.Store(true)
	// The send sockets first: closing a file waits for the calls using it,
	// and the egress loop sends from inside its TAP read callback, so a
	// send that waits for room must fail before the TAP can close.
	for _, s := range dp.tx {
		s.close()
	}
	for i := range dp.taps {
		if q := dp.taps[i].Load(); q != nil {
			q.close()
		}
	}
	if gen := dp.tapGen.Load(); gen != nil {
		close(*gen)
	}
	for i := range dp.rxs {
		if s := dp.rxs[i].Load(); s != nil {
			s.close()
		}
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
