package flow

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/mdlayher/netlink"
	"github.com/ti-mo/conntrack"
	"github.com/ti-mo/netfilter"
	"golang.org/x/sys/unix"
)

// Conntrack turns conntrack's events of the pods' connections into
// flows: new (the kernel confirmed the connection, so the policy allowed
// its first packet) and close (the entry was destroyed), with the
// connection's counts when the kernel keeps them (nf_conntrack_acct).
// Connections that were dropped never become events: the kernel confirms
// an entry only once its first packet has passed every hook.
//
// Every connection of the namespace costs its events (a socket read and a
// decoding each, pods' or not), so Run reads at most Rate of them a
// second: past that it stops reading until the second is over, and a
// node's connection rate cannot raise weftd's work past Rate events a
// second. It goes on listening meanwhile, so that the kernel keeps
// tracking events for the connections opened then (it does so only for
// connections opened while someone listens, nf_conntrack_events=2) and
// their close still comes; what does not fit in the socket's buffer
// during the pause is dropped by the kernel, and Run, told so at its next
// read, counts it in Lost and reads on. Once the socket overflowed, the
// kernel adds no event to it until Run has read every event it holds, so
// under a lasting flood the flows Run reads are about as old as its
// buffer is long (a second or more at Rate). Paused says how long Run did
// not read.
type Conntrack struct {
	// NetNS is a file descriptor of the network namespace to read in (0:
	// the current one).
	NetNS int
	// Pods are the pod networks: connections with neither end in them are
	// left out.
	Pods []netip.Prefix
	// Accounting says the kernel counts bytes and packets
	// (nf_conntrack_acct is 1 in the namespace); without it closed flows
	// have no Counts.
	Accounting bool
	// Rate is the most events Run reads in a second (0: no limit).
	Rate int
	// ReadBuffer is the socket's receive buffer (0: 1 MiB): what waits
	// for Run while it falls behind or pauses.
	ReadBuffer int
	Log        *slog.Logger

	lost atomic.Uint64

	mu         sync.Mutex
	pauses     uint64
	paused     time.Duration // of the pauses that ended
	pauseStart time.Time     // of the current pause; zero: none
}

// DefaultRate is the Rate weftd gives its reader: 1,000 events a second,
// the flows a second its ring keeps.
const DefaultRate = 1000

// Paused is how many times Run stopped reading because a second's Rate
// of events was spent, and for how long in all, the current pause
// included.
func (c *Conntrack) Paused() (uint64, time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	d := c.paused
	if !c.pauseStart.IsZero() {
		d += time.Since(c.pauseStart)
	}
	return c.pauses, d
}

// Lost is how many times the kernel said the event socket overflowed:
// events of that moment are missing.
func (c *Conntrack) Lost() uint64 { return c.lost.Load() }

// Run hands the pods' connection events to sink until ctx is done. It
// reads them in batches: it waits for an event, reads every one waiting,
// and lets BatchEvery pass before it waits again, so that a steady stream
// of connections wakes it once a batch, not once an event. When the
// socket's buffer overflowed it counts the loss and reads on; when a
// second's Rate is spent it reads nothing more until the second is over.
// It returns the error of a socket it cannot open or read.
func (c *Conntrack) Run(ctx context.Context, sink func(Flow)) error {
	s, err := c.open()
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { s.conn.Close() })
	defer func() {
		if stop() {
			s.conn.Close()
		}
	}()
	w := &window{rate: c.Rate}
	// Events Run could not read or decode (the kernel sends none such):
	// the first is logged as a warning, the rest at debug level.
	var notRead uint64
	logNotRead := func(n uint64, err error) {
		level := slog.LevelDebug
		if notRead == 0 {
			level = slog.LevelWarn
		}
		notRead += n
		c.logger().Log(ctx, level, "conntrack events not read", "err", err, "events", n, "so far", notRead)
	}
	for {
		msgs, full, err := s.receive()
		for _, m := range msgs {
			if !w.take(time.Now()) {
				if c.pause(ctx, w.end()); ctx.Err() != nil {
					return nil
				}
				w.take(time.Now()) // the first of the next second's
			}
			var ev conntrack.Event
			if err := ev.Unmarshal(m); err != nil {
				logNotRead(1, err)
				continue
			}
			if f, ok := c.flowOf(ev); ok {
				sink(f)
			}
		}
		if s.unread > 0 {
			logNotRead(s.unread, errors.New("too long for the buffer, or not netlink messages"))
			s.unread = 0
		}
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, unix.ENOBUFS):
			if c.lost.Add(1) == 1 {
				c.logger().Warn("conntrack events lost: weftd's socket was full (counted from now on)")
			}
			continue
		case err != nil:
			return fmt.Errorf("conntrack events: %w", err)
		case full:
			continue // more wait: no pause between
		}
		t := time.NewTimer(BatchEvery)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// BatchEvery is how long Run lets events gather before it reads them
// again. A flow's time is when Run read it: up to this much after the
// kernel's event, unless Run paused or the socket overflowed (see
// Conntrack).
const BatchEvery = 10 * time.Millisecond

// pause waits, not reading, until the window ends or ctx is done, and
// counts it; the first pause is logged.
func (c *Conntrack) pause(ctx context.Context, until time.Time) {
	start := time.Now()
	c.mu.Lock()
	c.pauseStart = start
	c.pauses++
	first := c.pauses == 1
	c.mu.Unlock()
	if first {
		c.logger().Warn("more conntrack events than weftd reads in a second: not reading them for the rest of each such second (flows the socket cannot hold meanwhile are lost)",
			"rate", c.Rate)
	}
	t := time.NewTimer(until.Sub(start))
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
	c.mu.Lock()
	c.paused += time.Since(start)
	c.pauseStart = time.Time{}
	c.mu.Unlock()
}

func (c *Conntrack) logger() *slog.Logger {
	if c.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return c.Log
}

// window counts the events of the current second against a rate.
type window struct {
	rate  int
	start time.Time
	n     int
}

// take counts one event at now and says whether the second's rate still
// allows it.
func (w *window) take(now time.Time) bool {
	if w.rate <= 0 {
		return true
	}
	if now.Sub(w.start) >= time.Second {
		w.start, w.n = now, 0
	}
	w.n++
	return w.n <= w.rate
}

// end is when the current second is over.
func (w *window) end() time.Time { return w.start.Add(time.Second) }

// eventSocket is a netlink socket subscribed to conntrack's events, read
// through its file descriptor: one recvmsg an event, no goroutine of its
// own.
type eventSocket struct {
	conn *netlink.Conn
	raw  syscall.RawConn
	buf  []byte
	msgs []netlink.Message
	// unread counts the datagrams receive could not read since Run took
	// the last count: longer than the room left (truncated) or not netlink
	// messages.
	unread uint64
}

// The room an event needs in eventSocket's buffer (an event's datagram
// is a few hundred bytes), and the buffer's size: about a hundred events
// a read.
const (
	maxEvent       = 4 << 10
	eventBufferLen = 32 << 10
)

// open subscribes to new and destroyed connections.
func (c *Conntrack) open() (*eventSocket, error) {
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: c.NetNS})
	if err != nil {
		return nil, fmt.Errorf("conntrack events: %w", err)
	}
	s := &eventSocket{conn: conn, buf: make([]byte, eventBufferLen)}
	if err := conn.SetReadBuffer(cmp.Or(c.ReadBuffer, 1<<20)); err != nil {
		conn.Close()
		return nil, fmt.Errorf("conntrack events: read buffer: %w", err)
	}
	for _, g := range []netfilter.NetlinkGroup{netfilter.GroupCTNew, netfilter.GroupCTDestroy} {
		if err := conn.JoinGroup(uint32(g)); err != nil {
			conn.Close()
			return nil, fmt.Errorf("conntrack events: join %v: %w", g, err)
		}
	}
	if s.raw, err = conn.SyscallConn(); err != nil {
		conn.Close()
		return nil, fmt.Errorf("conntrack events: %w", err)
	}
	return s, nil
}

// receive waits until an event waits, then reads the events waiting
// until none is left or the buffer is full (full: more may wait). The
// messages are valid until the next receive. An error (ENOBUFS: the
// kernel dropped events) comes with the events read before it.
func (s *eventSocket) receive() (msgs []netlink.Message, full bool, err error) {
	s.msgs = s.msgs[:0]
	off := 0
	var rerr error
	err = s.raw.Read(func(fd uintptr) bool {
		for len(s.buf)-off >= maxEvent {
			n, _, flags, _, err := unix.Recvmsg(int(fd), s.buf[off:], nil, unix.MSG_DONTWAIT)
			switch {
			case err == unix.EINTR:
				continue
			case err == unix.EAGAIN:
				return off > 0 // none read yet: wait for one
			case err != nil:
				rerr = err
				return true
			case flags&unix.MSG_TRUNC != 0:
				s.unread++
				continue
			}
			if s.parse(s.buf[off:off+n]) != nil {
				s.unread++
				continue
			}
			off += n
		}
		full = true
		return true
	})
	if err == nil {
		err = rerr
	}
	return s.msgs, full, err
}

// parse appends the netlink messages of one datagram to s.msgs; on an
// error it appends none.
func (s *eventSocket) parse(b []byte) error {
	n := len(s.msgs)
	for len(b) > 0 {
		if len(b) < unix.NLMSG_HDRLEN {
			s.msgs = s.msgs[:n]
			return fmt.Errorf("a datagram's %d trailing bytes", len(b))
		}
		l := min(int(binary.NativeEndian.Uint32(b)+unix.NLMSG_ALIGNTO-1) & ^(unix.NLMSG_ALIGNTO-1), len(b))
		var m netlink.Message
		if err := m.UnmarshalBinary(b[:l]); err != nil {
			s.msgs = s.msgs[:n]
			return fmt.Errorf("an event: %w", err)
		}
		s.msgs = append(s.msgs, m)
		b = b[l:]
	}
	return nil
}

// flowOf is the flow of a pod connection's event.
func (c *Conntrack) flowOf(ev conntrack.Event) (Flow, bool) {
	if ev.Flow == nil {
		return Flow{}, false
	}
	t := ev.Flow.TupleOrig
	in := func(a netip.Addr) bool {
		return slices.ContainsFunc(c.Pods, func(p netip.Prefix) bool { return p.Contains(a) })
	}
	if !in(t.IP.SourceAddress) && !in(t.IP.DestinationAddress) {
		return Flow{}, false
	}
	f := Flow{Time: time.Now(), Verdict: Allowed, Proto: ProtoName(t.Proto.Protocol),
		Src: t.IP.SourceAddress.Unmap(), Dst: t.IP.DestinationAddress.Unmap(),
		SrcPort: t.Proto.SourcePort, DstPort: t.Proto.DestinationPort}
	r := ev.Flow.TupleReply
	if ev.Flow.Status.SrcNAT() && r.IP.DestinationAddress.IsValid() {
		f.Masqueraded, f.MasqueradedAs = true, r.IP.DestinationAddress.Unmap()
	}
	if ev.Flow.Status.DstNAT() && r.IP.SourceAddress.IsValid() {
		f.Service = netip.AddrPortFrom(f.Dst, f.DstPort)
		f.Dst, f.DstPort = r.IP.SourceAddress.Unmap(), r.Proto.SourcePort
	}
	switch ev.Type {
	case conntrack.EventNew:
		f.Event = EventNew
	case conntrack.EventDestroy:
		f.Event = EventClose
		if c.Accounting {
			o, r := ev.Flow.CountersOrig, ev.Flow.CountersReply
			f.Counts = &Counts{OrigBytes: o.Bytes, OrigPackets: o.Packets, ReplyBytes: r.Bytes, ReplyPackets: r.Packets}
		}
	default:
		return Flow{}, false
	}
	return f, true
}
