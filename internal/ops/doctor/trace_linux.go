package doctor

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/weft-net/weft/internal/ops/connectivity"
)

// traceTable (with doctor's process id after it) is doctor's own table:
// one prerouting chain, ahead of every other chain on the way in, that
// sets nftrace on the peers' datagrams to the tunnel port (at most
// traceRate a second from each peer). The kernel then reports every
// chain, rule and verdict those datagrams meet, iptables-nft's chains
// included (they are nf_tables chains too). doctor deletes the table when
// the probes end, and deletes those of doctors no longer running before
// it adds its own.
const (
	traceTable = "weft-doctor-trace-"
	traceRate  = 10
	traceEnd   = "end" // the last chain on the forward hook, see install
)

// traceEvent is one trace event of a datagram from src: a rule that
// matched with its verdict, or a base chain's policy.
type traceEvent struct {
	id           uint32     // the kernel's id of the datagram, the same in each event
	src, dst     netip.Addr // from the datagram's network header (or an earlier event of its id)
	family       nftables.TableFamily
	table, chain string
	handle       uint64 // the rule's; 0 for the policy
	verdict      int32  // NF_ACCEPT, NF_DROP (a reject too), or nftables' own codes (jump, continue: negative)
}

// tracer collects the trace events of the datagrams its rule marks.
type tracer struct {
	nft    *nftables.Conn
	table  *nftables.Table
	mon    *netlink.Conn
	mu     sync.Mutex
	events []traceEvent
	lost   error // a read error while collecting (a full socket buffer)
	done   chan struct{}
}

// traceSpec is what the trace marks: UDP to port4 from peers4 and to port6
// from peers6; and ICMP echo replies with id echoID to the addresses in
// replies, which the node forwards (see fwdProbe).
type traceSpec struct {
	peers4, peers6 []netip.Addr
	port4, port6   uint16
	replies        []netip.Addr
	echoID         uint16
}

// startTrace installs the trace rules in the node's namespace and collects
// trace events until stop.
func startTrace(do connectivity.Do, sp traceSpec) (*tracer, error) {
	t := &tracer{done: make(chan struct{})}
	err := do.Run(func() error {
		var err error
		if t.mon, err = netlink.Dial(unix.NETLINK_NETFILTER, nil); err != nil {
			return fmt.Errorf("netfilter netlink socket: %w", err)
		}
		if err = t.mon.JoinGroup(unix.NFNLGRP_NFTRACE); err != nil {
			return fmt.Errorf("join the nftables trace group: %w", err)
		}
		t.bufferEvents()
		if t.nft, err = nftables.New(nftables.AsLasting()); err != nil {
			return err
		}
		t.removeStale()
		return t.install(sp)
	})
	if err != nil {
		t.close(do)
		return nil, err
	}
	go t.collect()
	return t, nil
}

func (t *tracer) install(sp traceSpec) error {
	t.table = t.nft.AddTable(&nftables.Table{Name: traceTable + strconv.Itoa(os.Getpid()), Family: nftables.TableFamilyINet})
	ch := t.nft.AddChain(&nftables.Chain{Name: "trace", Table: t.table, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityRef(math.MinInt32 + 1)})
	for _, f := range []struct {
		peers         []netip.Addr
		port          uint16
		proto         byte
		key           nftables.SetDatatype
		offset, bytes uint32
	}{{sp.peers4, sp.port4, unix.NFPROTO_IPV4, nftables.TypeIPAddr, 12, 4}, {sp.peers6, sp.port6, unix.NFPROTO_IPV6, nftables.TypeIP6Addr, 8, 16}} {
		if len(f.peers) == 0 {
			continue
		}
		peers, err := t.addrSet(fmt.Sprintf("peers%d", f.proto), f.key, f.peers)
		if err != nil {
			return err
		}
		// rate holds each peer's own limit, so that one peer's traffic
		// does not use up the others' share.
		rate := &nftables.Set{Table: t.table, Name: fmt.Sprintf("rate%d", f.proto), KeyType: f.key, Dynamic: true, HasTimeout: true, Timeout: time.Minute}
		if err := t.nft.AddSet(rate, nil); err != nil {
			return err
		}
		t.mark(ch, &expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{f.proto}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: f.offset, Len: f.bytes},
			&expr.Lookup{SourceRegister: 1, SetName: peers.Name, SetID: peers.ID},
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 2},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 2, Data: []byte{unix.IPPROTO_UDP}},
			&expr.Payload{DestRegister: 2, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 2, Data: binary.BigEndian.AppendUint16(nil, f.port)},
			&expr.Dynset{SrcRegKey: 1, SetName: rate.Name, SetID: rate.ID, Operation: unix.NFT_DYNSET_OP_UPDATE,
				Exprs: []expr.Any{&expr.Limit{Type: expr.LimitTypePkts, Rate: traceRate, Unit: expr.LimitTimeSecond, Burst: traceRate}}})
	}
	if len(sp.replies) > 0 {
		// The ICMP echo replies with id echoID to the addresses in
		// replies; chain end, empty and last on the forward hook, says by
		// its policy's event that a reply passed every other chain there,
		// iptables-legacy's included.
		replies, err := t.addrSet("replies", nftables.TypeIPAddr, sp.replies)
		if err != nil {
			return err
		}
		t.mark(ch, &expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_ICMP}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
			&expr.Lookup{SourceRegister: 1, SetName: replies.Name, SetID: replies.ID},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0}}, // echo reply
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 4, Len: 2},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, sp.echoID)})
		t.nft.AddChain(&nftables.Chain{Name: traceEnd, Table: t.table, Type: nftables.ChainTypeFilter,
			Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityRef(math.MaxInt32)})
	}
	if err := t.nft.Flush(); err != nil {
		return fmt.Errorf("install table inet %s: %w", t.table.Name, err)
	}
	return nil
}

// addrSet adds a set of addrs to doctor's table.
func (t *tracer) addrSet(name string, key nftables.SetDatatype, addrs []netip.Addr) (*nftables.Set, error) {
	set := &nftables.Set{Table: t.table, Name: name, KeyType: key}
	elems := make([]nftables.SetElement, len(addrs))
	for i, a := range addrs {
		elems[i].Key = a.AsSlice()
	}
	return set, t.nft.AddSet(set, elems)
}

// mark adds a rule to ch that sets nftrace on the packets match selects.
func (t *tracer) mark(ch *nftables.Chain, match ...expr.Any) {
	t.nft.AddRule(&nftables.Rule{Table: t.table, Chain: ch, Exprs: append(match,
		&expr.Immediate{Register: 1, Data: []byte{1}},
		&expr.Meta{Key: expr.MetaKeyNFTRACE, SourceRegister: true, Register: 1})})
}

// collect reads trace events until the socket's deadline or close.
func (t *tracer) collect() {
	defer close(t.done)
	addrs := map[uint32][2]netip.Addr{}
	for {
		msgs, err := t.mon.Receive()
		if err != nil {
			var ne interface{ Timeout() bool }
			if errors.As(err, &ne) && ne.Timeout() {
				return
			}
			if errors.Is(err, unix.ENOBUFS) {
				t.mu.Lock()
				t.lost = err
				t.mu.Unlock()
				continue
			}
			return // closed
		}
		for _, m := range msgs {
			e, ok := decodeTrace(m)
			if e.src.IsValid() {
				addrs[e.id] = [2]netip.Addr{e.src, e.dst} // the first event of each base chain carries the headers
			}
			if a := addrs[e.id]; ok { // doctor's own chain too: a datagram met no other
				e.src, e.dst = a[0], a[1]
				t.mu.Lock()
				t.events = append(t.events, e)
				t.mu.Unlock()
			}
		}
	}
}

// bufferEvents makes the trace socket's receive buffer room for the
// events of a burst (SO_RCVBUFFORCE, as root; else as much as
// net.core.rmem_max allows), so that they are not lost while collect
// waits for the scheduler.
func (t *tracer) bufferEvents() {
	const size = 4 << 20
	if rc, err := t.mon.SyscallConn(); err == nil {
		var serr error
		if err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, size) }); err == nil && serr == nil {
			return
		}
	}
	_ = t.mon.SetReadBuffer(size)
}

// removeStale deletes the trace tables of doctors no longer running.
func (t *tracer) removeStale() {
	tables, _ := t.nft.ListTablesOfFamily(nftables.TableFamilyINet)
	for _, tab := range tables {
		pid, ok := strings.CutPrefix(tab.Name, traceTable)
		if _, err := os.Stat("/proc/" + pid); ok && pid != "" && errors.Is(err, fs.ErrNotExist) {
			t.nft.DelTable(tab)
		}
	}
	_ = t.nft.Flush()
}

// stop reads the events already queued, removes the trace table (in
// do's namespace) and returns what it collected.
func (t *tracer) stop(do connectivity.Do) ([]traceEvent, error) {
	_ = t.mon.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	<-t.done
	t.close(do)
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.events, t.lost
}

func (t *tracer) close(do connectivity.Do) {
	if t.table != nil {
		_ = do.Run(func() error {
			t.nft.DelTable(t.table)
			return t.nft.Flush()
		})
	}
	if t.nft != nil {
		_ = t.nft.CloseLasting()
	}
	if t.mon != nil {
		_ = t.mon.Close()
	}
}

// decodeTrace decodes an NFT_MSG_TRACE message (after its nfgenmsg, whose
// family is the chain's table's) with the attributes doctor reports; ok
// is false for other messages and for events that are neither a rule's
// verdict nor a policy.
func decodeTrace(m netlink.Message) (traceEvent, bool) {
	if m.Header.Type != netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_TRACE) || len(m.Data) < 4 {
		return traceEvent{}, false
	}
	e := traceEvent{family: nftables.TableFamily(m.Data[0])}
	ad, err := netlink.NewAttributeDecoder(m.Data[4:])
	if err != nil {
		return e, false
	}
	ad.ByteOrder = binary.BigEndian
	var typ, nfproto, policy uint32
	var network []byte
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_TRACE_TABLE:
			e.table = ad.String()
		case unix.NFTA_TRACE_CHAIN:
			e.chain = ad.String()
		case unix.NFTA_TRACE_RULE_HANDLE:
			e.handle = ad.Uint64()
		case unix.NFTA_TRACE_ID:
			e.id = ad.Uint32()
		case unix.NFTA_TRACE_TYPE:
			typ = ad.Uint32()
		case unix.NFTA_TRACE_NFPROTO:
			nfproto = ad.Uint32()
		case unix.NFTA_TRACE_POLICY:
			policy = ad.Uint32()
		case unix.NFTA_TRACE_NETWORK_HEADER:
			network = ad.Bytes()
		case unix.NFTA_TRACE_VERDICT:
			ad.Nested(func(nad *netlink.AttributeDecoder) error {
				for nad.Next() {
					if nad.Type() == unix.NFTA_VERDICT_CODE {
						e.verdict = int32(nad.Uint32())
					}
				}
				return nil
			})
		}
	}
	if ad.Err() != nil {
		return e, false
	}
	switch {
	case nfproto == unix.NFPROTO_IPV4 && len(network) >= 20:
		e.src, e.dst = netip.AddrFrom4([4]byte(network[12:16])), netip.AddrFrom4([4]byte(network[16:20]))
	case nfproto == unix.NFPROTO_IPV6 && len(network) >= 40:
		e.src, e.dst = netip.AddrFrom16([16]byte(network[8:24])), netip.AddrFrom16([16]byte(network[24:40]))
	}
	switch typ {
	case unix.NFT_TRACETYPE_POLICY:
		e.verdict, e.handle = int32(policy), 0
	case unix.NFT_TRACETYPE_RULE:
		if e.verdict >= 0 {
			e.verdict &= 0xff // NF_DROP may carry an errno above
		}
	default:
		return e, false
	}
	return e, true
}
