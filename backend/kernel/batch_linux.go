package kernel

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// BatchWriter writes many neighbour, FDB and route changes over a netlink socket
// of its own without waiting for each acknowledgement: it sends a window of
// requests in one sendmsg, then reads the answers (each failure, and the
// acknowledgement of the window's last request), so thousands of peers cost
// a few dozen system calls instead of two per entry. The kernel handles the
// requests of a window in order, exactly as it would one at a time; Write
// returns only when every request of the batch is handled, so a caller that
// must order two kinds of change (a neighbour before its route) writes them
// as two batches.
//
// A BatchWriter is not safe for concurrent use.
type BatchWriter struct {
	s   *nl.NetlinkSocket
	seq uint32
}

// batchWindow is how many requests are in flight at once: their failures
// (each answered by an skb of under 1 KB; successes are not answered, see
// window) must fit the socket's receive buffer, which OpenBatchWriter raises but
// which may stay at the usual 208 KB default when the process may not raise
// it.
const batchWindow = 128

// OpenBatchWriter opens a BatchWriter in the network namespace at nsPath ("" is the
// namespace of the calling process) and checks that it sees the link with
// index link as h does (same name and address), so that it never writes
// into another namespace than h's.
func OpenBatchWriter(h *netlink.Handle, nsPath string, link int) (*BatchWriter, error) {
	ns := netns.None()
	if nsPath != "" {
		var err error
		if ns, err = netns.GetFromPath(nsPath); err != nil {
			return nil, fmt.Errorf("open netlink batch: %w", err)
		}
		defer ns.Close()
	}
	s, err := nl.GetNetlinkSocketAt(ns, netns.None(), unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("open netlink batch: %w", err)
	}
	p := &BatchWriter{s: s}
	// Room for a window of acknowledgements, each a small message of its
	// own; root may go beyond rmem_max.
	_ = s.SetReceiveBufferSize(4<<20, true)
	_ = s.SetReceiveTimeout(&unix.Timeval{Sec: 10})
	if err := p.sameLink(h, link); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// sameLink checks that the batch writer's namespace holds link as h's does.
func (p *BatchWriter) sameLink(h *netlink.Handle, link int) error {
	want, err := h.LinkByIndex(link)
	if err != nil {
		return fmt.Errorf("open netlink batch: link %d: %w", link, err)
	}
	req := nl.NewNetlinkRequest(unix.RTM_GETLINK, unix.NLM_F_ACK)
	req.AddData(&nl.IfInfomsg{IfInfomsg: unix.IfInfomsg{Family: unix.AF_UNSPEC, Index: int32(link)}})
	msgs, err := p.exchange(req)
	if err != nil {
		return fmt.Errorf("open netlink batch: link %d: %w", link, err)
	}
	name, addr := linkNameAddr(msgs)
	if name != want.Attrs().Name || addr.String() != want.Attrs().HardwareAddr.String() {
		return fmt.Errorf("open netlink batch: link %d is %q (%s) in the batch writer's namespace but %q (%s) in the handle's: not the same namespace",
			link, name, addr, want.Attrs().Name, want.Attrs().HardwareAddr)
	}
	return nil
}

// exchange sends one request and returns its answers, for the check above.
func (p *BatchWriter) exchange(req *nl.NetlinkRequest) ([][]byte, error) {
	p.seq++
	req.Seq = p.seq
	if err := p.s.Send(req); err != nil {
		return nil, err
	}
	var out [][]byte
	for {
		msgs, _, err := p.s.Receive()
		if err != nil {
			return nil, err
		}
		for _, m := range msgs {
			if m.Header.Seq != p.seq {
				continue
			}
			if m.Header.Type == unix.NLMSG_ERROR {
				if e := ackErrno(m.Data); e != 0 {
					return nil, e
				}
				return out, nil
			}
			out = append(out, m.Data)
		}
	}
}

// linkNameAddr reads IFLA_IFNAME and IFLA_ADDRESS of an RTM_NEWLINK answer.
func linkNameAddr(msgs [][]byte) (string, net.HardwareAddr) {
	if len(msgs) == 0 || len(msgs[0]) < unix.SizeofIfInfomsg {
		return "", nil
	}
	attrs, err := nl.ParseRouteAttr(msgs[0][unix.SizeofIfInfomsg:])
	if err != nil {
		return "", nil
	}
	var name string
	var addr net.HardwareAddr
	for _, a := range attrs {
		switch a.Attr.Type {
		case unix.IFLA_IFNAME:
			name = string(trimNUL(a.Value))
		case unix.IFLA_ADDRESS:
			addr = net.HardwareAddr(a.Value)
		}
	}
	return name, addr
}

func trimNUL(b []byte) []byte {
	for len(b) > 0 && b[len(b)-1] == 0 {
		b = b[:len(b)-1]
	}
	return b
}

// ackErrno is the error code of an NLMSG_ERROR payload (0: success).
func ackErrno(data []byte) syscall.Errno {
	if len(data) < 4 {
		return syscall.EINVAL
	}
	return syscall.Errno(-int32(binary.NativeEndian.Uint32(data[:4])))
}

// Close closes the socket.
func (p *BatchWriter) Close() { p.s.Close() }

// Write sends reqs, a window at a time, and waits for every answer. It
// returns, in order, each request's error (nil for success) and an error
// when the exchange itself failed (then the results are incomplete).
func (p *BatchWriter) Write(reqs []*nl.NetlinkRequest) ([]error, error) {
	res := make([]error, len(reqs))
	for start := 0; start < len(reqs); start += batchWindow {
		end := min(start+batchWindow, len(reqs))
		if err := p.window(reqs[start:end], res[start:end]); err != nil {
			return res, err
		}
	}
	return res, nil
}

// window sends reqs in one sendmsg and collects their outcomes. Only the
// last request asks for an acknowledgement: the kernel answers a request
// without NLM_F_ACK only when it fails, and handles the requests of one
// message in order, so the last one's acknowledgement says that all are
// done and every failure before it has been reported. That saves the
// kernel an answer per success (most of a window).
func (p *BatchWriter) window(reqs []*nl.NetlinkRequest, res []error) error {
	first := p.seq + 1
	var buf []byte
	for i, r := range reqs {
		p.seq++
		r.Seq = p.seq
		r.Flags &^= unix.NLM_F_ACK
		if i == len(reqs)-1 {
			r.Flags |= unix.NLM_F_ACK
		}
		buf = append(buf, r.Serialize()...)
	}
	if err := unix.Sendto(p.s.GetFd(), buf, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("netlink batch: send: %w", err)
	}
	for {
		msgs, _, err := p.s.Receive()
		if err != nil {
			return fmt.Errorf("netlink batch: receive: %w", err)
		}
		for _, m := range msgs {
			i := int(m.Header.Seq - first)
			if m.Header.Type != unix.NLMSG_ERROR || m.Header.Seq < first || i >= len(reqs) {
				continue
			}
			if e := ackErrno(m.Data); e != 0 {
				res[i] = e
			}
			if i == len(reqs)-1 {
				return nil
			}
		}
	}
}

// LazyBatchWriter opens a BatchWriter on first use, for the overlay and its step to
// share; when it cannot be opened, Get returns nil ever after and callers
// write one request at a time. The batch's socket is closed when nothing
// refers to the BatchWriter any more (its file's finalizer does it), never while
// someone holds the *BatchWriter that Get returned.
type LazyBatchWriter struct {
	h     *netlink.Handle
	ns    string
	link  int
	tried bool
	p     *BatchWriter
	err   error
}

// NewLazyBatchWriter returns a LazyBatchWriter for OpenBatchWriter(h, nsPath, link).
func NewLazyBatchWriter(h *netlink.Handle, nsPath string, link int) *LazyBatchWriter {
	return &LazyBatchWriter{h: h, ns: nsPath, link: link}
}

// Get returns the batch writer, or nil when l is nil or the batch writer cannot be opened
// (Err says why).
func (l *LazyBatchWriter) Get() *BatchWriter {
	if l == nil {
		return nil
	}
	if !l.tried {
		l.tried = true
		l.p, l.err = OpenBatchWriter(l.h, l.ns, l.link)
	}
	return l.p
}

// Err is why the batch writer could not be opened, if it could not.
func (l *LazyBatchWriter) Err() error { return l.err }

// Requests of the overlay's kinds, as netlink.Handle's NeighSet, NeighDel,
// RouteReplace and RouteDel build them.

// NeighRequest is `ip neigh replace` (set) or `ip neigh del` of n.
func NeighRequest(n *netlink.Neigh, set bool) *nl.NetlinkRequest {
	typ, flags := unix.RTM_DELNEIGH, 0
	if set {
		typ, flags = unix.RTM_NEWNEIGH, unix.NLM_F_CREATE|unix.NLM_F_REPLACE
	}
	req := nl.NewNetlinkRequest(typ, flags)
	req.AddData(&netlink.Ndmsg{Family: uint8(n.Family), Index: uint32(n.LinkIndex),
		State: uint16(n.State), Type: uint8(n.Type), Flags: uint8(n.Flags)})
	ip := n.IP.To4()
	if ip == nil {
		ip = n.IP.To16()
	}
	req.AddData(nl.NewRtAttr(unix.NDA_DST, ip))
	if n.HardwareAddr != nil {
		req.AddData(nl.NewRtAttr(unix.NDA_LLADDR, n.HardwareAddr))
	}
	return req
}

// RouteRequest is `ip route replace` (set) or `ip route del` of r: a
// unicast route in a table below 256 with a destination, a gateway or an
// output link (or both), and optionally flags, a scope, a protocol and a
// metric.
func RouteRequest(r *netlink.Route, set bool) (*nl.NetlinkRequest, error) {
	if r.Dst == nil || r.Gw == nil && r.LinkIndex <= 0 || r.Table >= 256 {
		return nil, errors.New("netlink batch: route needs a destination and a gateway or a link, in a main table")
	}
	var req *nl.NetlinkRequest
	var msg *nl.RtMsg
	if set {
		req, msg = nl.NewNetlinkRequest(unix.RTM_NEWROUTE, unix.NLM_F_CREATE|unix.NLM_F_REPLACE), nl.NewRtMsg()
	} else {
		req, msg = nl.NewNetlinkRequest(unix.RTM_DELROUTE, 0), nl.NewRtDelMsg()
	}
	dst, gw := r.Dst.IP.To4(), r.Gw.To4()
	msg.Family = unix.AF_INET
	if dst == nil {
		dst, gw, msg.Family = r.Dst.IP.To16(), r.Gw.To16(), unix.AF_INET6
	}
	if gw == nil && r.Gw != nil {
		return nil, errors.New("netlink batch: route and gateway of different families")
	}
	ones, _ := r.Dst.Mask.Size()
	msg.Dst_len = uint8(ones)
	if r.Table > 0 {
		msg.Table = uint8(r.Table)
	}
	msg.Flags = uint32(r.Flags)
	msg.Scope = uint8(r.Scope)
	if r.Protocol > 0 {
		msg.Protocol = uint8(r.Protocol)
	}
	req.AddData(msg)
	req.AddData(nl.NewRtAttr(unix.RTA_DST, dst))
	if gw != nil {
		req.AddData(nl.NewRtAttr(unix.RTA_GATEWAY, gw))
	}
	if r.Priority > 0 {
		req.AddData(nl.NewRtAttr(unix.RTA_PRIORITY, nl.Uint32Attr(uint32(r.Priority))))
	}
	if r.LinkIndex > 0 {
		req.AddData(nl.NewRtAttr(unix.RTA_OIF, nl.Uint32Attr(uint32(r.LinkIndex))))
	}
	return req, nil
}
