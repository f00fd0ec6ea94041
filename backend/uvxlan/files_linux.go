package uvxlan

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Files keeps open files across restarts of the process, for example in a
// service manager's file descriptor store (internal/fdstore). The backend
// stores each TAP queue and receive socket it opens under a name that
// starts with the device name, takes them back at the next start, and
// releases the names of its device it no longer uses. Implementations are
// safe for concurrent use.
type Files interface {
	// Take returns the file stored under name by an earlier process and
	// hands it to the caller, or nil.
	Take(name string) *os.File
	// Keep stores a duplicate of fd under name, replacing the file stored
	// under that name before. The caller keeps fd.
	Keep(name string, fd int) error
	// Release drops what is stored under name.
	Release(name string) error
	// Unclaimed lists the names stored by an earlier process that nobody
	// took yet.
	Unclaimed() []string
}

func (c *Config) tapFileName(q int) string { return c.Name + "-tap" + strconv.Itoa(q) }
func (c *Config) rxFileName(q int) string  { return c.Name + "-rx" + strconv.Itoa(q) }

// keep stores fd under name, logging a failure: the dataplane works
// without the store, it only loses its queues on the next restart.
func (b *Backend) keep(name string, rc syscall.RawConn) {
	if b.cfg.Files == nil {
		return
	}
	var kerr error
	err := rc.Control(func(fd uintptr) { kerr = b.cfg.Files.Keep(name, int(fd)) })
	if err = errors.Join(err, kerr); err != nil {
		b.log.Warn("cannot keep the file for the next restart", "name", name, "err", err)
	}
}

// notReusing logs a stored file that does not fit; forget drops it.
func (b *Backend) notReusing(name string, why error) {
	b.log.Warn("not reusing the file kept from the last run", "name", name, "reason", why)
}

// forget drops what the store holds under name before a new file takes
// its place: a single-queue TAP accepts one attached file, and a kept
// socket on the port would be refused the port (or, with port sharing,
// take a share of the datagrams nobody reads). The store closes its copy
// asynchronously, so the opening that follows uses retryBusy.
func (b *Backend) forget(name string) {
	if b.cfg.Files == nil {
		return
	}
	if err := b.cfg.Files.Release(name); err != nil {
		b.log.Warn("cannot release the kept file", "name", name, "err", err)
	}
}

// releaseUnused releases the stored files of this device that this
// configuration does not use (queues beyond Queues).
func (b *Backend) releaseUnused() {
	if b.cfg.Files == nil {
		return
	}
	for _, n := range b.cfg.Files.Unclaimed() {
		rest, ok := strings.CutPrefix(n, b.cfg.Name+"-")
		if ok && (strings.HasPrefix(rest, "tap") || strings.HasPrefix(rest, "rx")) {
			b.notReusing(n, errors.New("queue not configured"))
			b.forget(n)
		}
	}
}

// reuseOrOpen returns the file kept under name when adopt accepts it
// (reporting true), or else drops what is kept, opens a new one and keeps
// it for the next run.
func reuseOrOpen[T any](b *Backend, name string, adopt func(*os.File) (T, error), open func() (T, error), rc func(T) syscall.RawConn) (T, bool, error) {
	if b.cfg.Files != nil {
		if f := b.cfg.Files.Take(name); f != nil {
			v, err := adopt(f)
			if err == nil {
				return v, true, nil
			}
			b.notReusing(name, err)
		}
		b.forget(name)
	}
	v, err := retryBusy(open)
	if err != nil {
		return v, false, err
	}
	b.keep(name, rc(v))
	return v, false, nil
}

// adoptTAP checks that f, a TAP queue kept from the last run, is attached
// to our device with the flags this configuration opens it with, and
// returns it as a queue.
func (dp *datapath) adoptTAP(f *os.File, multi bool) (*tapQueue, error) {
	defer f.Close()
	sc, err := f.SyscallConn()
	if err != nil {
		return nil, err
	}
	var dup int
	var cerr error
	err = sc.Control(func(fd uintptr) { dup, cerr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0) })
	if err = errors.Join(err, cerr); err != nil {
		return nil, fmt.Errorf("dup: %w", err)
	}
	if err := dp.checkTAP(dup, multi); err != nil {
		unix.Close(dup)
		return nil, err
	}
	if err := unix.SetNonblock(dup, true); err != nil {
		unix.Close(dup)
		return nil, fmt.Errorf("set non-blocking: %w", err)
	}
	nf := os.NewFile(uintptr(dup), "tap:"+dp.b.cfg.Name)
	q := &tapQueue{rw: nf}
	if q.rc, err = nf.SyscallConn(); err != nil {
		nf.Close()
		return nil, err
	}
	return q, nil
}

// checkTAP reads the device name and flags of the TAP queue fd and puts
// its offload settings back.
func (dp *datapath) checkTAP(fd int, multi bool) error {
	var req ifreq
	if err := ioctlPtr(fd, unix.TUNGETIFF, unsafe.Pointer(&req)); err != nil {
		return fmt.Errorf("TUNGETIFF: %w (the device is gone)", err)
	}
	name := unix.ByteSliceToString(req.name[:])
	want := uint16(unix.IFF_TAP | unix.IFF_NO_PI)
	if dp.vnet {
		want |= unix.IFF_VNET_HDR
	}
	if multi {
		want |= unix.IFF_MULTI_QUEUE
	}
	const mask = unix.IFF_TAP | unix.IFF_TUN | unix.IFF_NO_PI | unix.IFF_VNET_HDR | unix.IFF_MULTI_QUEUE
	switch {
	case name != dp.b.cfg.Name:
		return fmt.Errorf("attached to %s", name)
	case req.flags&mask != want:
		return fmt.Errorf("opened with flags %#x, this configuration needs %#x", req.flags&mask, want)
	}
	if !dp.vnet {
		return nil
	}
	hdrLen := int32(virtioNetHdrLen)
	if err := ioctlPtr(fd, unix.TUNSETVNETHDRSZ, unsafe.Pointer(&hdrLen)); err != nil {
		return fmt.Errorf("TUNSETVNETHDRSZ: %w", err)
	}
	if err := unix.IoctlSetInt(fd, unix.TUNSETOFFLOAD, unix.TUN_F_CSUM|unix.TUN_F_TSO4|unix.TUN_F_TSO6); err != nil {
		return fmt.Errorf("TUNSETOFFLOAD: %w", err)
	}
	return nil
}

// adoptRx checks that f, a receive socket kept from the last run, is a
// UDP socket bound to our address and port with the port sharing this
// configuration needs, and returns it with this configuration's options.
func (dp *datapath) adoptRx(f *os.File) (*udpSocket, error) {
	defer f.Close()
	pc, err := net.FilePacketConn(f)
	if err != nil {
		return nil, err
	}
	conn, ok := pc.(*net.UDPConn)
	if !ok {
		pc.Close()
		return nil, fmt.Errorf("a %T, not a UDP socket", pc)
	}
	s := &udpSocket{conn: conn}
	fail := func(err error) (*udpSocket, error) { conn.Close(); return nil, err }
	cfg := dp.b.cfg
	want := netip.AddrPortFrom(cfg.Local, uint16(cfg.Port))
	if got := conn.LocalAddr().(*net.UDPAddr).AddrPort(); got.Addr().Unmap() != want.Addr() || got.Port() != want.Port() {
		return fail(fmt.Errorf("bound to %s, not %s", got, want))
	}
	if s.rc, err = conn.SyscallConn(); err != nil {
		return fail(err)
	}
	role := roleRecv
	if dp.rxGRO() {
		role = roleRecvGRO
	}
	var serr error
	err = s.rc.Control(func(fd uintptr) {
		var share int
		if share, serr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT); serr == nil && (share != 0) != (cfg.Queues > 1) {
			serr = fmt.Errorf("port sharing %v, this configuration needs %v", share != 0, cfg.Queues > 1)
			return
		}
		if role != roleRecvGRO && serr == nil {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_UDP, unix.UDP_GRO, 0)
		}
		if serr == nil {
			serr = setSockOpts(int(fd), cfg.Local.Is6(), role)
		}
	})
	if err = errors.Join(err, serr); err != nil {
		return fail(err)
	}
	return s, nil
}

// retryBusy runs open until it succeeds, fails with something other than
// EBUSY or EADDRINUSE, or two seconds pass: after a kept file is released,
// the store may still hold the device queue or the port for a moment.
func retryBusy[T any](open func() (T, error)) (T, error) {
	deadline := time.Now().Add(2 * time.Second)
	for {
		v, err := open()
		if err == nil || !(errors.Is(err, unix.EBUSY) || errors.Is(err, unix.EADDRINUSE)) || time.Now().After(deadline) {
			return v, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}
