package uvxlan

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// socketBuffer is the send and receive buffer of every socket. The default
// (212 KB) overflows under a single TCP stream, and every overflow is a
// retransmit.
const socketBuffer = 4 << 20

// udpSocket is a UDP socket driven through raw syscalls on the Go poller.
type udpSocket struct {
	conn *net.UDPConn
	rc   syscall.RawConn
}

// Socket roles: the receive socket on the VXLAN port, or a send socket
// that never reads (what reaches its ephemeral port just fills its small
// default receive buffer and is dropped).
const (
	roleSend = iota
	roleRecv
	roleRecvGRO
)

// listenUDP opens a UDP socket on local in the current namespace: without
// DF (IP_PMTUDISC_DONT, as kernel VXLAN sends), with a 4 MB send buffer
// and, for receiving, a 4 MB receive buffer and UDP GRO if asked.
// With reusePort, several sockets share local (SO_REUSEPORT).
func listenUDP(local netip.AddrPort, role int, reusePort bool) (*udpSocket, error) {
	network := "udp4"
	if local.Addr().Is6() {
		network = "udp6"
	}
	lc := net.ListenConfig{}
	if reusePort {
		lc.Control = func(_, _ string, c syscall.RawConn) error {
			var serr error
			err := c.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1) })
			return errors.Join(err, serr)
		}
	}
	pc, err := lc.ListenPacket(context.Background(), network, netip.AddrPort.String(local))
	if err != nil {
		return nil, fmt.Errorf("listen udp %s: %w", local, err)
	}
	conn := pc.(*net.UDPConn)
	s := &udpSocket{conn: conn}
	if s.rc, err = conn.SyscallConn(); err != nil {
		conn.Close()
		return nil, fmt.Errorf("listen udp %s: %w", local, err)
	}
	var serr error
	err = s.rc.Control(func(fd uintptr) { serr = setSockOpts(int(fd), local.Addr().Is6(), role) })
	if err = errors.Join(err, serr); err != nil {
		conn.Close()
		return nil, fmt.Errorf("set options of udp %s: %w", local, err)
	}
	return s, nil
}

func setSockOpts(fd int, ipv6 bool, role int) error {
	var err error
	if ipv6 {
		err = unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_DONT)
	} else {
		err = unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DONT)
	}
	if err != nil {
		return fmt.Errorf("clear df: %w", err)
	}
	// The FORCE variants pass net.core.[rw]mem_max; they need CAP_NET_ADMIN.
	if role != roleSend && unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, socketBuffer) != nil {
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, socketBuffer)
	}
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, socketBuffer) != nil {
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, socketBuffer)
	}
	if role == roleRecvGRO {
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_UDP, unix.UDP_GRO, 1); err != nil {
			return fmt.Errorf("enable udp gro: %w", err)
		}
	}
	return nil
}

func (s *udpSocket) close() { s.conn.Close() }

// mmsghdr is struct mmsghdr of recvmmsg(2).
type mmsghdr struct {
	hdr unix.Msghdr
	len uint32
	_   [4]byte
}

// recvBatch is a reusable recvmmsg(2) call: buffers, source addresses and
// control messages for up to len(bufs) datagrams.
type recvBatch struct {
	msgs  []mmsghdr
	iovs  []unix.Iovec
	names []unix.RawSockaddrInet6
	bufs  [][]byte
	oob   [][]byte
	n     int
	err   error
	calls uint64 // system calls made, for the loop counters
}

func newRecvBatch(count, size int) *recvBatch {
	r := &recvBatch{
		msgs:  make([]mmsghdr, count),
		iovs:  make([]unix.Iovec, count),
		names: make([]unix.RawSockaddrInet6, count),
		bufs:  make([][]byte, count),
		oob:   make([][]byte, count),
	}
	for i := range count {
		r.bufs[i] = make([]byte, size)
		r.oob[i] = make([]byte, unix.CmsgSpace(2)+unix.CmsgSpace(4))
		r.iovs[i].Base = &r.bufs[i][0]
		r.iovs[i].SetLen(size)
		h := &r.msgs[i].hdr
		h.Iov = &r.iovs[i]
		h.SetIovlen(1)
		h.Name = (*byte)(unsafe.Pointer(&r.names[i]))
		h.Control = &r.oob[i][0]
	}
	return r
}

// read fills the batch from fd without blocking. It reports false when
// nothing was queued (EAGAIN); else r.n datagrams are in the batch, or
// r.err says why none could be read. A batch that is not full means the
// kernel found the queue empty after the last datagram, or that receiving
// the next one failed: Linux keeps that error for the next call without a
// wake-up, so the loop sees it with the next datagram. (These sockets are
// unconnected and do not ask for ICMP errors, which leaves faults.)
func (r *recvBatch) read(fd uintptr) bool {
	for i := range r.msgs {
		h := &r.msgs[i].hdr
		h.Namelen = unix.SizeofSockaddrInet6
		h.SetControllen(len(r.oob[i]))
		h.Flags = 0
	}
	for {
		r.calls++
		n, _, e := unix.Syscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&r.msgs[0])), uintptr(len(r.msgs)), 0, 0, 0)
		switch e {
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		case 0:
			r.n, r.err = int(n), nil
		default:
			r.n, r.err = 0, e
		}
		return true
	}
}

// full reports whether the last read filled every buffer of the batch.
func (r *recvBatch) full() bool { return r.n == len(r.msgs) }

// datagram returns the payload of message i, its source address and the
// UDP GRO segment size (0 when the kernel did not coalesce). trunc reports
// a datagram larger than the buffer.
func (r *recvBatch) datagram(i int) (pkt []byte, src netip.Addr, seg int, trunc bool) {
	m := &r.msgs[i]
	switch r.names[i].Family {
	case unix.AF_INET:
		src = netip.AddrFrom4((*unix.RawSockaddrInet4)(unsafe.Pointer(&r.names[i])).Addr)
	case unix.AF_INET6:
		src = netip.AddrFrom16(r.names[i].Addr).Unmap()
	}
	return r.bufs[i][:m.len], src, groSize(r.oob[i][:m.hdr.Controllen]), m.hdr.Flags&unix.MSG_TRUNC != 0
}

// groSize returns the UDP_GRO segment size from control messages, or 0.
func groSize(oob []byte) int {
	for len(oob) >= unix.SizeofCmsghdr {
		h, data, rest, err := unix.ParseOneSocketControlMessage(oob)
		if err != nil {
			return 0
		}
		if h.Level == unix.IPPROTO_UDP && h.Type == unix.UDP_GRO && len(data) >= 2 {
			return int(*(*uint16)(unsafe.Pointer(&data[0])))
		}
		oob = rest
	}
	return 0
}

// sender is a reusable sendmsg(2) call, optionally with UDP_SEGMENT.
type sender struct {
	buf   []byte
	to    unix.Sockaddr
	oob   []byte // a UDP_SEGMENT control message, or empty
	seg   []byte // backing store of oob
	err   error
	fn    func(fd uintptr) bool
	calls uint64 // system calls made, for the loop counters
}

func newSender() *sender {
	s := &sender{seg: make([]byte, unix.CmsgSpace(2))}
	s.fn = s.write
	return s
}

// setSegment makes the next send a UDP GSO send cut into size-byte
// datagrams (0: a single datagram).
func (s *sender) setSegment(size int) {
	if size == 0 {
		s.oob = nil
		return
	}
	h := (*unix.Cmsghdr)(unsafe.Pointer(&s.seg[0]))
	h.Level, h.Type = unix.IPPROTO_UDP, unix.UDP_SEGMENT
	h.SetLen(unix.CmsgLen(2))
	*(*uint16)(unsafe.Pointer(&s.seg[unix.CmsgLen(0)])) = uint16(size)
	s.oob = s.seg
}

func (s *sender) write(fd uintptr) bool {
	s.calls++
	_, err := unix.SendmsgN(int(fd), s.buf, s.oob, s.to, 0)
	if err == unix.EAGAIN || err == unix.EINTR {
		return false
	}
	s.err = err
	return true
}

// send sends s.buf to s.to.
func (u *udpSocket) send(s *sender) error {
	if err := u.rc.Write(s.fn); err != nil {
		return err
	}
	return s.err
}

// gatherSender is a reusable sendmsg(2) call whose datagram is gathered
// from up to len(iovs) pieces, optionally with UDP_SEGMENT: the segments of
// a TSO super-frame leave with their headers from a small buffer and their
// payload from where the TAP read put it, without a copy in between.
type gatherSender struct {
	msg   unix.Msghdr
	iovs  []unix.Iovec
	n     int
	seg   []byte // backing store of the UDP_SEGMENT control message
	err   error
	fn    func(fd uintptr) bool
	calls uint64 // system calls made, for the loop counters
}

func newGatherSender(pieces int) *gatherSender {
	g := &gatherSender{iovs: make([]unix.Iovec, pieces), seg: make([]byte, unix.CmsgSpace(2))}
	h := (*unix.Cmsghdr)(unsafe.Pointer(&g.seg[0]))
	h.Level, h.Type = unix.IPPROTO_UDP, unix.UDP_SEGMENT
	h.SetLen(unix.CmsgLen(2))
	g.msg.Iov = &g.iovs[0]
	g.fn = g.write
	return g
}

// reset starts a datagram to p.
func (g *gatherSender) reset(p *peer) {
	g.n = 0
	g.msg.Name = (*byte)(unsafe.Pointer(&p.raw))
	g.msg.Namelen = p.rawLen
}

// add appends b (not empty) to the datagram.
func (g *gatherSender) add(b []byte) {
	g.iovs[g.n].Base = &b[0]
	g.iovs[g.n].SetLen(len(b))
	g.n++
}

// segment makes the datagram a UDP GSO send cut into size-byte datagrams
// (0: a single datagram).
func (g *gatherSender) segment(size int) {
	if size == 0 {
		g.msg.Control = nil
		g.msg.SetControllen(0)
		return
	}
	*(*uint16)(unsafe.Pointer(&g.seg[unix.CmsgLen(0)])) = uint16(size)
	g.msg.Control = &g.seg[0]
	g.msg.SetControllen(len(g.seg))
}

func (g *gatherSender) write(fd uintptr) bool {
	g.calls++
	g.msg.SetIovlen(g.n)
	_, _, e := unix.Syscall(unix.SYS_SENDMSG, fd, uintptr(unsafe.Pointer(&g.msg)), 0)
	return syscallDone(e, &g.err)
}

// syscallDone turns the result of a non-blocking system call made in a
// RawConn callback into the callback's answer: false to wait until the
// file is ready and call again (EAGAIN, EINTR), else true with *err set to
// the call's error or nil.
func syscallDone(e unix.Errno, err *error) bool {
	if e == unix.EAGAIN || e == unix.EINTR {
		return false
	}
	*err = nil
	if e != 0 {
		*err = e
	}
	return true
}

// send sends the datagram gathered in g.
func (u *udpSocket) sendGather(g *gatherSender) error {
	if err := u.rc.Write(g.fn); err != nil {
		return err
	}
	return g.err
}

// rawSockaddr returns ap as the raw socket address sendmmsg takes, and its length.
func rawSockaddr(ap netip.AddrPort) (unix.RawSockaddrInet6, uint32) {
	var raw unix.RawSockaddrInet6
	port := (*[2]byte)(unsafe.Pointer(&raw.Port)) // network byte order
	port[0], port[1] = byte(ap.Port()>>8), byte(ap.Port())
	if ap.Addr().Is4() {
		r4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(&raw))
		r4.Family = unix.AF_INET
		r4.Addr = ap.Addr().As4()
		return raw, unix.SizeofSockaddrInet4
	}
	raw.Family = unix.AF_INET6
	raw.Addr = ap.Addr().As16()
	return raw, unix.SizeofSockaddrInet6
}

// sendBatch is a reusable sendmmsg(2) call: up to len(msgs) datagrams, all
// through one socket, each to its own peer.
type sendBatch struct {
	msgs  []mmsghdr
	iovs  []unix.Iovec
	n     int        // datagrams queued
	sock  *udpSocket // the socket they leave from
	off   int        // datagrams done (sent or failed) by the call in progress
	fail  int        // datagrams the kernel refused
	err   error      // the last refusal
	fn    func(fd uintptr) bool
	calls uint64 // system calls made, for the loop counters
}

func newSendBatch(count int) *sendBatch {
	b := &sendBatch{msgs: make([]mmsghdr, count), iovs: make([]unix.Iovec, count)}
	for i := range b.msgs {
		b.msgs[i].hdr.Iov = &b.iovs[i]
		b.msgs[i].hdr.SetIovlen(1)
	}
	b.fn = b.write
	return b
}

// add queues pkt for p; the caller flushes first when the batch is full.
func (b *sendBatch) add(pkt []byte, p *peer) {
	b.iovs[b.n].Base = &pkt[0]
	b.iovs[b.n].SetLen(len(pkt))
	h := &b.msgs[b.n].hdr
	h.Name = (*byte)(unsafe.Pointer(&p.raw))
	h.Namelen = p.rawLen
	b.n++
}

func (b *sendBatch) full() bool { return b.n == len(b.msgs) }

func (b *sendBatch) write(fd uintptr) bool {
	for b.off < b.n {
		b.calls++
		n, _, e := unix.Syscall6(unix.SYS_SENDMMSG, fd, uintptr(unsafe.Pointer(&b.msgs[b.off])), uintptr(b.n-b.off), 0, 0, 0)
		switch e {
		case 0:
			b.off += int(n)
		case unix.EAGAIN:
			return false
		case unix.EINTR:
		default: // the datagram at off was refused; go on with the next
			b.err = e
			b.fail++
			b.off++
		}
	}
	return true
}

// flush sends the queued datagrams and empties the batch. It returns how
// many were sent and the last error.
func (b *sendBatch) flush() (int, error) {
	if b.n == 0 {
		return 0, nil
	}
	b.off, b.fail, b.err = 0, 0, nil
	err := b.sock.rc.Write(b.fn)
	sent := b.off - b.fail
	b.n, b.sock = 0, nil
	if err != nil {
		return sent, err
	}
	return sent, b.err
}
