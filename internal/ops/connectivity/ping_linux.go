package connectivity

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"
)

// ErrNoReply is returned when no echo reply came back in time.
var ErrNoReply = errors.New("no reply")

// FragNeededError is returned for a DF probe that a hop (or the local
// VXLAN device) refused because it is larger than the path MTU.
type FragNeededError struct {
	MTU int // the MTU the refusing hop announced; 0 when unknown
}

func (e *FragNeededError) Error() string {
	if e.MTU == 0 {
		return "fragmentation needed (DF set), path MTU unknown"
	}
	return fmt.Sprintf("fragmentation needed (DF set): path MTU %d", e.MTU)
}

// Pinger sends ICMPv4 echo requests from a raw socket opened in a network
// namespace. Each Pinger has a random identifier, so several may run in
// one namespace at once. Its methods are not safe for concurrent use.
type Pinger struct {
	conn *net.IPConn
	id   uint16
	seq  uint16
	buf  []byte
}

var pingerCount atomic.Uint32

// NewPinger opens the socket inside the namespace that do enters.
func NewPinger(do Do) (*Pinger, error) {
	var c net.PacketConn
	err := do.Run(func() error {
		var err error
		c, err = net.ListenPacket("ip4:icmp", "0.0.0.0")
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("icmp socket: %w", err)
	}
	var r [2]byte
	rand.Read(r[:])
	id := binary.BigEndian.Uint16(r[:]) ^ uint16(pingerCount.Add(1))
	return &Pinger{conn: c.(*net.IPConn), id: id, buf: make([]byte, 65536)}, nil
}

// Close closes the socket.
func (p *Pinger) Close() error { return p.conn.Close() }

// setDF turns path MTU discovery on (DF set, never fragmented) or back to
// the kernel's default for the socket.
func (p *Pinger) setDF(on bool) error {
	rc, err := p.conn.SyscallConn()
	if err != nil {
		return err
	}
	v := unix.IP_PMTUDISC_DONT
	if on {
		v = unix.IP_PMTUDISC_PROBE // DF set, and the kernel's cached PMTU is not applied locally
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, v)
	}); err != nil {
		return err
	}
	return serr
}

// Ping sends one echo request of size bytes (the whole IP packet, at least
// 28) to dst, with DF set when df is true, and waits up to timeout for the
// reply. It returns the round trip.
func (p *Pinger) Ping(dst netip.Addr, size int, df bool, timeout time.Duration) (time.Duration, error) {
	if !dst.Is4() {
		return 0, fmt.Errorf("ping %s: only IPv4 is probed", dst)
	}
	if err := p.setDF(df); err != nil {
		return 0, fmt.Errorf("ping %s: set DF: %w", dst, err)
	}
	p.seq++
	data := make([]byte, max(size-28, 8))
	copy(data, "weft-probe")
	msg := icmp.Message{Type: ipv4.ICMPTypeEcho, Body: &icmp.Echo{ID: int(p.id), Seq: int(p.seq), Data: data}}
	b, err := msg.Marshal(nil)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	if _, err := p.conn.WriteTo(b, &net.IPAddr{IP: dst.AsSlice()}); err != nil {
		if errors.Is(err, syscall.EMSGSIZE) {
			return 0, &FragNeededError{}
		}
		return 0, fmt.Errorf("ping %s: %w", dst, err)
	}
	return p.await(dst, start, timeout)
}

// await reads until the matching reply, an ICMP error about the request,
// or the timeout.
func (p *Pinger) await(dst netip.Addr, start time.Time, timeout time.Duration) (time.Duration, error) {
	if err := p.conn.SetReadDeadline(start.Add(timeout)); err != nil {
		return 0, err
	}
	for {
		n, from, err := p.conn.ReadFrom(p.buf)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return 0, ErrNoReply
			}
			return 0, fmt.Errorf("ping %s: %w", dst, err)
		}
		rm, err := icmp.ParseMessage(1, p.buf[:n])
		if err != nil {
			continue
		}
		switch body := rm.Body.(type) {
		case *icmp.Echo:
			if rm.Type == ipv4.ICMPTypeEchoReply && body.ID == int(p.id) && body.Seq == int(p.seq) && from.String() == dst.String() {
				return time.Since(start), nil
			}
		case *icmp.DstUnreach:
			if rm.Type == ipv4.ICMPTypeDestinationUnreachable && p.aboutOurs(body.Data, dst) {
				if rm.Code == 4 {
					return 0, &FragNeededError{MTU: int(binary.BigEndian.Uint16(p.buf[6:8]))}
				}
				return 0, fmt.Errorf("ping %s: destination unreachable (code %d) from %s", dst, rm.Code, from)
			}
		}
	}
}

// aboutOurs reports whether an ICMP error quotes our echo request to dst.
func (p *Pinger) aboutOurs(quoted []byte, dst netip.Addr) bool {
	if len(quoted) < 20 {
		return false
	}
	ihl := int(quoted[0]&0x0f) * 4
	if len(quoted) < ihl+8 || netip.AddrFrom4([4]byte(quoted[16:20])) != dst {
		return false
	}
	icmpHdr := quoted[ihl:]
	return icmpHdr[0] == 8 && binary.BigEndian.Uint16(icmpHdr[4:6]) == p.id && binary.BigEndian.Uint16(icmpHdr[6:8]) == p.seq
}

// Stats is the outcome of several echo requests.
type Stats struct {
	Sent, Received int
	Min, Avg, Max  time.Duration
	Err            error // the last error, when some were lost
}

// Loss is the fraction of requests without a reply, 0 to 1.
func (s Stats) Loss() float64 {
	if s.Sent == 0 {
		return 1
	}
	return float64(s.Sent-s.Received) / float64(s.Sent)
}

// PingN sends count echo requests of size bytes to dst, one after another,
// each waiting up to timeout.
func (p *Pinger) PingN(dst netip.Addr, count, size int, df bool, timeout time.Duration) Stats {
	var s Stats
	var sum time.Duration
	for range count {
		s.Sent++
		rtt, err := p.Ping(dst, size, df, timeout)
		if err != nil {
			s.Err = err
			continue
		}
		s.Received++
		sum += rtt
		if s.Min == 0 || rtt < s.Min {
			s.Min = rtt
		}
		s.Max = max(s.Max, rtt)
	}
	if s.Received > 0 {
		s.Avg = sum / time.Duration(s.Received)
	}
	return s
}
