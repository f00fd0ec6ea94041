package tunpath

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

// gsoSender sends runs of datagrams to a peer with UDP GSO from a socket
// of its own, each datagram gathered from the buffer it was read into (one
// iovec per datagram). conn.StdNetBind's Send would copy every datagram of
// a run into the first one's buffer instead.
type gsoSender struct {
	conn *net.UDPConn
	rc   syscall.RawConn
	oob  []byte // a UDP_SEGMENT control message
}

// maxSegments is the most datagrams the kernel takes in one UDP GSO send
// (UDP_MAX_SEGMENTS of older kernels; newer ones take 128).
const maxSegments = 64

// newGSOSender opens the socket on an ephemeral port of local, in the
// current namespace, without DF (as the kernel's VXLAN sends).
func newGSOSender(local netip.Addr) (*gsoSender, error) {
	network := "udp4"
	if local.Is6() {
		network = "udp6"
	}
	pc, err := (&net.ListenConfig{}).ListenPacket(context.Background(), network, netip.AddrPortFrom(local, 0).String())
	if err != nil {
		return nil, fmt.Errorf("send socket on %s: %w", local, err)
	}
	s := &gsoSender{conn: pc.(*net.UDPConn), oob: make([]byte, unix.CmsgSpace(2))}
	if s.rc, err = s.conn.SyscallConn(); err != nil {
		s.conn.Close()
		return nil, err
	}
	var serr error
	err = s.rc.Control(func(fd uintptr) {
		if local.Is6() {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_DONT)
		} else {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DONT)
		}
		if serr == nil {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF, 4<<20)
		}
	})
	if err = errors.Join(err, serr); err != nil {
		s.conn.Close()
		return nil, fmt.Errorf("send socket options: %w", err)
	}
	h := (*unix.Cmsghdr)(unsafe.Pointer(&s.oob[0]))
	h.Level, h.Type = unix.IPPROTO_UDP, unix.UDP_SEGMENT
	h.SetLen(unix.CmsgLen(2))
	return s, nil
}

func (s *gsoSender) close() error { return s.conn.Close() }

// sockaddr is the address to send to a peer's VXLAN port.
func sockaddr(a netip.AddrPort) unix.Sockaddr {
	if a.Addr().Is4() {
		return &unix.SockaddrInet4{Port: int(a.Port()), Addr: a.Addr().As4()}
	}
	return &unix.SockaddrInet6{Port: int(a.Port()), Addr: a.Addr().As16()}
}

// send sends the datagrams of out to to, in order: each run of datagrams
// of one size (the last of a run may be shorter) in one UDP GSO send. It
// returns how many datagrams were not sent and the first error.
func (s *gsoSender) send(out [][]byte, to unix.Sockaddr) (lost int, err error) {
	const maxPayload = 1<<16 - 1 - 8 - 40 // IPv6's; IPv4's is larger by 20
	for len(out) > 0 {
		size, total, k := len(out[0]), len(out[0]), 1
		for k < len(out) && k < maxSegments && len(out[k]) <= size && total+len(out[k]) <= maxPayload {
			total += len(out[k])
			k++
			if len(out[k-1]) < size {
				break
			}
		}
		var oob []byte
		if k > 1 {
			*(*uint16)(unsafe.Pointer(&s.oob[unix.CmsgLen(0)])) = uint16(size)
			oob = s.oob
		}
		var serr error
		werr := s.rc.Write(func(fd uintptr) bool {
			_, serr = unix.SendmsgBuffers(int(fd), out[:k], oob, to, 0)
			return serr != unix.EAGAIN && serr != unix.EINTR
		})
		if e := errors.Join(werr, serr); e != nil {
			lost += k
			if err == nil {
				err = e
			}
		}
		out = out[k:]
	}
	return lost, err
}
