package flow

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mdlayher/netlink"
	"github.com/ti-mo/conntrack"
	"github.com/ti-mo/netfilter"
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
// read, counts it in Lost and listens again. Paused says how long Run did
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

// Lost is how many times the event socket overflowed (and was opened
// again): events of that moment are missing.
func (c *Conntrack) Lost() uint64 { return c.lost.Load() }

// Run hands the pods' connection events to sink until ctx is done. When
// the socket's buffer overflows it counts the loss and listens again; when
// a second's Rate is spent it reads nothing more until the second is
// over. It returns the error of a socket it cannot open.
func (c *Conntrack) Run(ctx context.Context, sink func(Flow)) error {
	w := &window{rate: c.Rate}
	for {
		conn, errs, events, err := c.open()
		if err != nil {
			return err
		}
		err = c.read(ctx, errs, events, sink, w)
		closeDraining(conn, errs, events)
		if ctx.Err() != nil {
			return nil
		}
		c.lost.Add(1)
		c.logger().Warn("conntrack events lost; listening again", "err", err)
	}
}

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

// open listens for new and destroyed connections.
func (c *Conntrack) open() (*conntrack.Conn, chan error, chan conntrack.Event, error) {
	conn, err := conntrack.Dial(&netlink.Config{NetNS: c.NetNS})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("conntrack events: %w", err)
	}
	if err := conn.SetReadBuffer(cmp.Or(c.ReadBuffer, 1<<20)); err != nil {
		conn.Close()
		return nil, nil, nil, fmt.Errorf("conntrack events: read buffer: %w", err)
	}
	// A short queue: the library decodes ahead of the reader at most
	// this many events, which a pause keeps waiting.
	events := make(chan conntrack.Event, 16)
	errs, err := conn.Listen(events, 1, []netfilter.NetlinkGroup{netfilter.GroupCTNew, netfilter.GroupCTDestroy})
	if err != nil {
		conn.Close()
		return nil, nil, nil, fmt.Errorf("conntrack events: %w", err)
	}
	return conn, errs, events, nil
}

// closeDraining closes conn, which waits for its worker, while taking
// what the worker may still be sending.
func closeDraining(conn *conntrack.Conn, errs chan error, events chan conntrack.Event) {
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-events:
			case <-errs:
			case <-done:
				return
			}
		}
	}()
	conn.Close()
	close(done)
}

// read hands events to sink until ctx is done or the socket fails; past
// the window's rate it pauses until the window ends.
func (c *Conntrack) read(ctx context.Context, errs chan error, events chan conntrack.Event, sink func(Flow), w *window) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errs:
			return fmt.Errorf("conntrack events: %w", err)
		case ev := <-events:
			if !w.take(time.Now()) {
				if c.pause(ctx, w.end()); ctx.Err() != nil {
					return nil
				}
				w.take(time.Now()) // the first of the next second's
			}
			if f, ok := c.flowOf(ev); ok {
				sink(f)
			}
		}
	}
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
