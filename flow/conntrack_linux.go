package flow

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
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
	Log        *slog.Logger

	lost atomic.Uint64
}

// Lost is how many times the event socket overflowed (and was opened
// again): events of that moment are missing.
func (c *Conntrack) Lost() uint64 { return c.lost.Load() }

// Run hands the pods' connection events to sink until ctx is done. When
// the socket's buffer overflows it counts the loss and listens again; it
// returns the error of a socket it cannot open.
func (c *Conntrack) Run(ctx context.Context, sink func(Flow)) error {
	log := c.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	for {
		conn, errs, events, err := c.open()
		if err != nil {
			return err
		}
		err = c.read(ctx, errs, events, sink)
		closeDraining(conn, errs, events)
		if ctx.Err() != nil {
			return nil
		}
		c.lost.Add(1)
		log.Warn("conntrack events lost; listening again", "err", err)
	}
}

// open listens for new and destroyed connections.
func (c *Conntrack) open() (*conntrack.Conn, chan error, chan conntrack.Event, error) {
	conn, err := conntrack.Dial(&netlink.Config{NetNS: c.NetNS})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("conntrack events: %w", err)
	}
	if err := conn.SetReadBuffer(1 << 20); err != nil {
		conn.Close()
		return nil, nil, nil, fmt.Errorf("conntrack events: read buffer: %w", err)
	}
	events := make(chan conntrack.Event, 256)
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

// read hands events to sink until ctx is done or the socket fails.
func (c *Conntrack) read(ctx context.Context, errs chan error, events chan conntrack.Event, sink func(Flow)) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errs:
			return fmt.Errorf("conntrack events: %w", err)
		case ev := <-events:
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
