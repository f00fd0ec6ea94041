package flow

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/mdlayher/netlink"
	"github.com/ti-mo/netfilter"
	"golang.org/x/sys/unix"
)

// NFLOG's message types, configuration attributes and commands, and the
// attributes of a logged packet (linux/netfilter/nfnetlink_log.h). The
// netlink framing and attribute decoding are ti-mo/netfilter's.
const (
	nfulnlMsgPacket = 0
	nfulnlMsgConfig = 1

	nfulaCfgCmd   = 1
	nfulaCfgMode  = 2
	nfulnlCmdBind = 1
	nfulnlCopyPkt = 2
	nfulaPayload  = 9
	nfulaPrefix   = 10
)

// SnapLen is how much of each logged packet NFLog asks for: the IP and
// transport headers.
const SnapLen = 128

// NFLog reads the packets weft's policy table logs to an NFLOG group and
// turns those whose prefix LogPrefix wrote into drop flows.
type NFLog struct {
	Group uint16
	// NetNS is a file descriptor of the network namespace to read in (0:
	// the current one).
	NetNS int
	// ReadBuffer is the socket's receive buffer (0: 1 MiB). When weftd
	// falls behind, the kernel drops what does not fit: Lost counts the
	// times it said so.
	ReadBuffer int
	Log        *slog.Logger

	lost atomic.Uint64
}

// Lost is how many times the kernel said logged packets were dropped
// because the socket's buffer was full.
func (n *NFLog) Lost() uint64 { return n.lost.Load() }

// Run binds the group and hands each drop to sink until ctx is done.
// Only one socket in a namespace can bind a group.
func (n *NFLog) Run(ctx context.Context, sink func(Flow)) error {
	conn, err := netfilter.Dial(&netlink.Config{NetNS: n.NetNS})
	if err != nil {
		return fmt.Errorf("nflog group %d: %w", n.Group, err)
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer func() {
		if stop() {
			conn.Close()
		}
	}()
	if err := conn.SetReadBuffer(cmp0(n.ReadBuffer, 1<<20)); err != nil {
		return fmt.Errorf("nflog group %d: read buffer: %w", n.Group, err)
	}
	if err := n.bind(conn); err != nil {
		return err
	}
	for {
		msgs, err := conn.Receive()
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, unix.ENOBUFS) {
			if n.lost.Add(1) == 1 && n.Log != nil {
				n.Log.Warn("nflog: the kernel dropped logged packets, weftd's socket was full (counted from now on)", "group", n.Group)
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("nflog group %d: receive: %w", n.Group, err)
		}
		for _, m := range msgs {
			if f, ok := n.decode(m); ok {
				sink(f)
			}
		}
	}
}

func cmp0(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}

// bind binds the group to the socket and asks for SnapLen bytes of each
// packet.
func (n *NFLog) bind(conn *netfilter.Conn) error {
	h := netfilter.Header{SubsystemID: netfilter.NFSubsysULOG, MessageType: nfulnlMsgConfig,
		Flags: netlink.Request | netlink.Acknowledge, Family: netfilter.ProtoUnspec, ResourceID: n.Group}
	mode := make([]byte, 6) // __be32 copy_range, __u8 copy_mode, pad
	copy(mode, netfilter.Uint32Bytes(SnapLen))
	mode[4] = nfulnlCopyPkt
	for _, a := range [][]netfilter.Attribute{
		{{Type: nfulaCfgCmd, Data: []byte{nfulnlCmdBind}}},
		{{Type: nfulaCfgMode, Data: mode}},
	} {
		msg, err := netfilter.MarshalNetlink(h, a)
		if err != nil {
			return fmt.Errorf("nflog group %d: %w", n.Group, err)
		}
		if _, err := conn.Query(msg); err != nil {
			return fmt.Errorf("nflog group %d: bind: %w", n.Group, err)
		}
	}
	return nil
}

// decode is the drop flow of one logged packet; ok is false for a message
// that is not a packet weft's table logged.
func (n *NFLog) decode(m netlink.Message) (Flow, bool) {
	h, attrs, err := netfilter.UnmarshalNetlink(m)
	if err != nil || h.SubsystemID != netfilter.NFSubsysULOG || h.MessageType != nfulnlMsgPacket {
		return Flow{}, false
	}
	f := Flow{Time: time.Now(), Event: EventDrop, Verdict: Dropped}
	var prefix string
	var payload []byte
	for _, a := range attrs {
		switch a.Type {
		case nfulaPrefix:
			prefix = strings.TrimRight(string(a.Data), "\x00")
		case nfulaPayload:
			payload = a.Data
		}
	}
	dir, pols, more, ok := ParseLogPrefix(prefix)
	if !ok || !fromPacket(&f, payload) {
		return Flow{}, false
	}
	f.Direction, f.Policies, f.MorePolicies = dir, pols, more
	return f, true
}
