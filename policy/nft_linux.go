package policy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Table is the nftables table (family ip) that holds the policy rules.
const Table = "weft-policy"

// Program replaces the policy table in the namespace at netns ("" for the
// current one) by the one plan describes, in one nftables transaction: the
// kernel switches from the old rules to the new ones at once.
func Program(netns string, plan Plan) error {
	conn, closeNS, err := dial(netns)
	if err != nil {
		return err
	}
	defer closeNS()
	t := &nftables.Table{Name: Table, Family: nftables.TableFamilyIPv4}
	conn.AddTable(t) // so that the delete below finds it
	conn.DelTable(t)
	conn.AddTable(t)
	if err := build(conn, t, plan); err != nil {
		return err
	}
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("program nftables table %s: %w", Table, err)
	}
	return nil
}

// Remove deletes the policy table, if it is there.
func Remove(netns string) error {
	conn, closeNS, err := dial(netns)
	if err != nil {
		return err
	}
	defer closeNS()
	t := &nftables.Table{Name: Table, Family: nftables.TableFamilyIPv4}
	conn.AddTable(t)
	conn.DelTable(t)
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("remove nftables table %s: %w", Table, err)
	}
	return nil
}

// build adds the chains, sets and rules of plan to t, in conn's batch:
//
//	forward (hook forward): ct state established,related accept
//	                        ip saddr @egress-isolated jump egress
//	                        ip daddr @ingress-isolated jump ingress
//	egress:  one rule per allowing rule, verdict return; then drop
//	ingress: one rule per allowing rule, verdict accept; then drop
func build(conn *nftables.Conn, t *nftables.Table, plan Plan) error {
	fwd := conn.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter})
	egress := conn.AddChain(&nftables.Chain{Name: "egress", Table: t})
	ingress := conn.AddChain(&nftables.Chain{Name: "ingress", Table: t})
	egIso, err := addrSet(conn, t, "egress-isolated", plan.EgressIsolated)
	if err != nil {
		return err
	}
	inIso, err := addrSet(conn, t, "ingress-isolated", plan.IngressIsolated)
	if err != nil {
		return err
	}
	add := func(c *nftables.Chain, note string, exprs ...[]expr.Any) {
		var all []expr.Any
		for _, e := range exprs {
			all = append(all, e...)
		}
		conn.AddRule(&nftables.Rule{Table: t, Chain: c, Exprs: all, UserData: userdata.AppendString(nil, userdata.TypeComment, note)})
	}
	add(fwd, "weft: replies and related traffic", ctEstablished(), verdict(expr.VerdictAccept))
	add(fwd, "weft: from pods isolated for egress", lookup(field(saddr), egIso), jump("egress"))
	add(fwd, "weft: to pods isolated for ingress", lookup(field(daddr), inIso), jump("ingress"))
	for i, r := range plan.Rules {
		c, v := ingress, verdict(expr.VerdictAccept)
		if r.Egress {
			c, v = egress, verdict(expr.VerdictReturn)
		}
		sets, err := ruleSets(conn, t, fmt.Sprintf("r%d", i), r)
		if err != nil {
			return fmt.Errorf("%s: %w", r.Name, err)
		}
		for _, m := range sets.matches(r) {
			add(c, "weft: "+r.Name, m, v)
		}
	}
	add(egress, "weft: no policy allows it", []expr.Any{&expr.Counter{}}, verdict(expr.VerdictDrop))
	add(ingress, "weft: no policy allows it", []expr.Any{&expr.Counter{}}, verdict(expr.VerdictDrop))
	return nil
}

type ruleSetsOf struct{ local, peers, ports, named *nftables.Set }

// ruleSets adds the sets one rule needs.
func ruleSets(conn *nftables.Conn, t *nftables.Table, prefix string, r Rule) (ruleSetsOf, error) {
	var s ruleSetsOf
	var err error
	if r.Egress || r.AllPorts {
		if s.local, err = addrSet(conn, t, prefix+"-local", r.Local); err != nil {
			return s, err
		}
	}
	if !r.AnyPeer && (!r.Egress || r.AllPorts) {
		if s.peers, err = rangeSet(conn, t, prefix+"-peers", r.Peers); err != nil {
			return s, err
		}
	}
	if !r.AllPorts {
		if s.ports, err = portSet(conn, t, prefix+"-ports", r.Ports); err != nil {
			return s, err
		}
		if len(r.NamedPorts) > 0 {
			if s.named, err = portSet(conn, t, prefix+"-named", r.NamedPorts); err != nil {
				return s, err
			}
		}
	}
	return s, nil
}

// matches is the match expressions of r's nftables rules (one or two).
func (s ruleSetsOf) matches(r Rule) [][]expr.Any {
	var peer []expr.Any
	if s.peers != nil {
		if r.Egress {
			peer = lookup(field(daddr), s.peers)
		} else {
			peer = lookup(field(saddr), s.peers)
		}
	}
	if !r.Egress {
		if r.AllPorts {
			return [][]expr.Any{join(peer, lookup(field(daddr), s.local))}
		}
		return [][]expr.Any{join(peer, lookup(destPort(), s.ports))}
	}
	src := lookup(field(saddr), s.local)
	if r.AllPorts {
		return [][]expr.Any{join(src, peer)}
	}
	out := [][]expr.Any{join(src, lookup(destPort(), s.ports))}
	if s.named != nil {
		out = append(out, join(src, lookup(destPort(), s.named)))
	}
	return out
}

func join(a, b []expr.Any) []expr.Any { return append(append([]expr.Any{}, a...), b...) }

func addrSet(conn *nftables.Conn, t *nftables.Table, name string, addrs []netip.Addr) (*nftables.Set, error) {
	s := &nftables.Set{Table: t, Name: name, KeyType: nftables.TypeIPAddr}
	els := make([]nftables.SetElement, 0, len(addrs))
	for _, a := range addrs {
		els = append(els, nftables.SetElement{Key: a.AsSlice()})
	}
	if err := conn.AddSet(s, els); err != nil {
		return nil, fmt.Errorf("set %s: %w", name, err)
	}
	return s, nil
}

// rangeSet is an interval set of the ranges rs (sorted, disjoint): each
// range is its first address and, unless it reaches the end of the
// address space, the address after its last marked as an interval end.
func rangeSet(conn *nftables.Conn, t *nftables.Table, name string, rs []Range) (*nftables.Set, error) {
	s := &nftables.Set{Table: t, Name: name, KeyType: nftables.TypeIPAddr, Interval: true}
	var els []nftables.SetElement
	for _, r := range rs {
		els = append(els, nftables.SetElement{Key: r.First.AsSlice()})
		if last := u32(r.Last); last != ^uint32(0) {
			els = append(els, nftables.SetElement{Key: addr(last + 1).AsSlice(), IntervalEnd: true})
		}
	}
	if err := conn.AddSet(s, els); err != nil {
		return nil, fmt.Errorf("set %s: %w", name, err)
	}
	return s, nil
}

// portSet is a set of ip daddr . meta l4proto . th dport ranges.
func portSet(conn *nftables.Conn, t *nftables.Table, name string, es []PortEntry) (*nftables.Set, error) {
	s := &nftables.Set{Table: t, Name: name, Interval: true, Concatenation: true,
		KeyType: nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetProto, nftables.TypeInetService)}
	els := make([]nftables.SetElement, 0, len(es))
	for _, e := range es {
		els = append(els, nftables.SetElement{Key: portKey(e.Addr.First, e.Proto, e.First), KeyEnd: portKey(e.Addr.Last, e.Proto, e.Last)})
	}
	if err := conn.AddSet(s, els); err != nil {
		return nil, fmt.Errorf("set %s: %w", name, err)
	}
	return s, nil
}

// portKey is a key of the concatenation: each field in 4 bytes.
func portKey(a netip.Addr, proto uint8, port uint16) []byte {
	k := make([]byte, 12)
	copy(k, a.AsSlice())
	k[4] = proto
	binary.BigEndian.PutUint16(k[8:], port)
	return k
}

const (
	saddr = 12 // offsets in the IPv4 header
	daddr = 16
)

// field loads the IPv4 address at offset off into register 1.
func field(off uint32) []expr.Any {
	return []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: 4}}
}

// destPort loads ip daddr . meta l4proto . th dport into registers 1, 9, 10.
func destPort() []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: daddr, Len: 4},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 9},
		&expr.Payload{DestRegister: 10, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
	}
}

func lookup(load []expr.Any, s *nftables.Set) []expr.Any {
	return append(load, &expr.Lookup{SourceRegister: 1, SetName: s.Name, SetID: s.ID})
}

func ctEstablished() []expr.Any {
	mask := binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED)
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
	}
}

func verdict(k expr.VerdictKind) []expr.Any { return []expr.Any{&expr.Verdict{Kind: k}} }
func jump(chain string) []expr.Any {
	return []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: chain}}
}

// sendBuffer is the socket buffer size (send and receive) of the nftables
// connection: one transaction goes in one sendmsg, which the default
// buffer (wmem_default, about 200 KiB) limits to some thousand pods, and
// the kernel's answers to it come back at once; nft(8) raises both too.
const sendBuffer = 64 << 20

func bigBuffer(c *netlink.Conn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return fmt.Errorf("nftables socket: %w", err)
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = errors.Join(unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, sendBuffer),
			unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, sendBuffer))
	}); err != nil {
		return fmt.Errorf("nftables socket: %w", err)
	}
	if serr != nil {
		return fmt.Errorf("nftables socket send buffer: %w", serr)
	}
	return nil
}

// dial returns an nftables connection to the namespace at path ("" for the
// current one) and the function that releases it.
func dial(path string) (*nftables.Conn, func(), error) {
	buf := nftables.WithSockOptions(bigBuffer)
	if path == "" {
		c, err := nftables.New(buf)
		if err != nil {
			return nil, nil, fmt.Errorf("nftables connection: %w", err)
		}
		return c, func() {}, nil
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open namespace %s: %w", path, err)
	}
	c, err := nftables.New(nftables.WithNetNSFd(fd), buf)
	if err != nil {
		unix.Close(fd)
		return nil, nil, fmt.Errorf("nftables connection in %s: %w", path, err)
	}
	return c, func() { unix.Close(fd) }, nil
}

// CheckBridgeNetfilter returns an error unless bridged IPv4 traffic passes
// the forward hook in this namespace (br_netfilter with
// net.bridge.bridge-nf-call-iptables=1): without it, traffic between two
// pods of one node crosses the cni0 bridge unseen by the policy rules.
func CheckBridgeNetfilter() error {
	b, err := os.ReadFile("/proc/sys/net/bridge/bridge-nf-call-iptables")
	if errors.Is(err, os.ErrNotExist) {
		return errors.New("br_netfilter is not loaded, so traffic between pods of this node would bypass network policy " +
			"(modprobe br_netfilter; sysctl net.bridge.bridge-nf-call-iptables=1), or run with --network-policy=false")
	}
	if err != nil {
		return fmt.Errorf("network policy: %w", err)
	}
	if len(b) == 0 || b[0] != '1' {
		return errors.New("net.bridge.bridge-nf-call-iptables is 0, so traffic between pods of this node would bypass network policy " +
			"(sysctl net.bridge.bridge-nf-call-iptables=1), or run with --network-policy=false")
	}
	return nil
}
