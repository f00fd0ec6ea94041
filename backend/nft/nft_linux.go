package nft

import (
	"fmt"
	"net"
	"net/netip"
	"reflect"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
)

// Table is one of weft's tables as it should be.
type Table struct {
	Name   string
	Family nftables.TableFamily
	Sets   []Set
	Chains []Chain
}

// Set is a named set of addresses. Check compares its key type only;
// Program writes it with Elements.
type Set struct {
	Name     string
	KeyType  nftables.SetDatatype
	Elements []netip.Addr
}

// Chain is a base chain (Hook set) or a regular one, with policy accept.
// A chain on the ingress hook names its Device; Check cannot read a
// chain's device back, so a chain's name should say which it is.
type Chain struct {
	Name     string
	Type     nftables.ChainType
	Hook     *nftables.ChainHook
	Priority *nftables.ChainPriority
	Device   string
	Rules    []Rule
}

// Rule is a rule's expressions and the comment nft(8) shows for it.
type Rule struct {
	Comment string
	Exprs   []expr.Any
}

// Chain returns the chain of t named name, nil if there is none.
func (t Table) Chain(name string) *Chain {
	for i := range t.Chains {
		if t.Chains[i].Name == name {
			return &t.Chains[i]
		}
	}
	return nil
}

// Ref is the table as google/nftables names it.
func (t Table) Ref() *nftables.Table { return &nftables.Table{Name: t.Name, Family: t.Family} }

// Comment is a rule's user data as nft(8) writes a comment, so that `nft
// list table` shows it.
func Comment(s string) []byte { return userdata.AppendString(nil, userdata.TypeComment, s) }

// Dial returns an nftables connection to the namespace at path ("" for the
// current one) and the function that releases it.
func Dial(path string) (*nftables.Conn, func(), error) { return dial(path) }

// dial is Dial with more options for the connection. A path naming the
// calling thread's own namespace is dialed as the current one: entering a
// namespace takes CAP_SYS_ADMIN, which weftd's container does not have.
func dial(path string, opts ...nftables.ConnOption) (*nftables.Conn, func(), error) {
	if path == "" || sameNetNS(path) {
		c, err := nftables.New(opts...)
		if err != nil {
			return nil, nil, fmt.Errorf("nftables connection: %w", err)
		}
		return c, func() {}, nil
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open namespace %s: %w", path, err)
	}
	c, err := nftables.New(append(opts, nftables.WithNetNSFd(fd))...)
	if err != nil {
		unix.Close(fd)
		return nil, nil, fmt.Errorf("nftables connection in %s: %w", path, err)
	}
	return c, func() { unix.Close(fd) }, nil
}

// sameNetNS reports whether path is the calling thread's network
// namespace.
func sameNetNS(path string) bool {
	var a, b unix.Stat_t
	if unix.Stat(path, &a) != nil || unix.Stat("/proc/thread-self/ns/net", &b) != nil {
		return false
	}
	return a.Dev == b.Dev && a.Ino == b.Ino
}

// Check reports whether the kernel's table is exactly as wanted (sets
// compared by key type, not by their elements), and if not why.
func Check(conn *nftables.Conn, want Table) (bool, string, error) {
	tables, err := conn.ListTablesOfFamily(want.Family)
	if err != nil {
		return false, "", fmt.Errorf("list nftables tables: %w", err)
	}
	var t *nftables.Table
	for _, x := range tables {
		if x.Name == want.Name {
			t = x
		}
	}
	if t == nil {
		return false, "table missing", nil
	}
	if len(want.Sets) > 0 {
		if why, err := checkSets(conn, t, want.Sets); why != "" || err != nil {
			return false, why, err
		}
	}
	chains, err := conn.ListChainsOfTableFamily(want.Family)
	if err != nil {
		return false, "", fmt.Errorf("list nftables chains: %w", err)
	}
	n := 0
	for _, c := range chains {
		if c.Table.Name != want.Name {
			continue
		}
		n++
		wc := want.Chain(c.Name)
		if wc == nil || !sameHook(c, wc) {
			return false, "chain " + c.Name + " not weft's", nil
		}
		rules, err := conn.GetRules(t, c)
		if err != nil {
			return false, "", fmt.Errorf("list rules of %s %s: %w", want.Name, c.Name, err)
		}
		if !SameRules(rules, wc.Rules) {
			return false, "rules of chain " + c.Name + " changed", nil
		}
	}
	if n != len(want.Chains) {
		return false, "chain missing", nil
	}
	return true, "", nil
}

func checkSets(conn *nftables.Conn, t *nftables.Table, want []Set) (string, error) {
	sets, err := conn.GetSets(t)
	if err != nil {
		return "", fmt.Errorf("list sets of %s: %w", t.Name, err)
	}
	if len(sets) != len(want) {
		return "sets changed", nil
	}
	for _, w := range want {
		found := false
		for _, s := range sets {
			found = found || s.Name == w.Name && s.KeyType.Name == w.KeyType.Name
		}
		if !found {
			return "set " + w.Name + " missing", nil
		}
	}
	return "", nil
}

// SameRules reports whether the kernel's rules are exactly the wanted ones:
// same comments and same expressions, in order (see the package doc).
func SameRules(have []*nftables.Rule, want []Rule) bool {
	if len(have) != len(want) {
		return false
	}
	for i, r := range have {
		c, _ := userdata.GetString(r.UserData, userdata.TypeComment)
		if c != want[i].Comment || len(r.Exprs) != len(want[i].Exprs) {
			return false
		}
		for j, e := range r.Exprs {
			if !sameExpr(e, want[i].Exprs[j]) {
				return false
			}
		}
	}
	return true
}

func sameExpr(have, want expr.Any) bool {
	switch w := want.(type) {
	case *expr.Counter:
		_, ok := have.(*expr.Counter)
		return ok
	case *expr.Lookup:
		h, ok := have.(*expr.Lookup)
		return ok && h.SetName == w.SetName && h.SourceRegister == w.SourceRegister && h.Invert == w.Invert &&
			h.IsDestRegSet == w.IsDestRegSet && h.DestRegister == w.DestRegister
	}
	return reflect.DeepEqual(have, want)
}

func sameHook(c *nftables.Chain, w *Chain) bool {
	if w.Hook == nil {
		return c.Hooknum == nil
	}
	return c.Type == w.Type && c.Hooknum != nil && *c.Hooknum == *w.Hook &&
		c.Priority != nil && *c.Priority == *w.Priority &&
		(c.Policy == nil || *c.Policy == nftables.ChainPolicyAccept)
}

// Program replaces the table in one transaction: add (a no-op if it
// exists), delete, then create it anew with its sets, chains and rules.
func Program(conn *nftables.Conn, want Table) error {
	t := want.Ref()
	conn.AddTable(t)
	conn.DelTable(t)
	conn.AddTable(t)
	for _, s := range want.Sets {
		set := &nftables.Set{Table: t, Name: s.Name, KeyType: s.KeyType}
		if err := AddSet(conn, set, Elements(s.Elements)); err != nil {
			return fmt.Errorf("program nftables set %s: %w", s.Name, err)
		}
	}
	for _, cs := range want.Chains {
		ch := &nftables.Chain{Name: cs.Name, Table: t}
		if cs.Hook != nil {
			policy := nftables.ChainPolicyAccept
			ch.Type, ch.Hooknum, ch.Priority, ch.Policy, ch.Device = cs.Type, cs.Hook, cs.Priority, &policy, cs.Device
		}
		c := conn.AddChain(ch)
		for _, r := range cs.Rules {
			conn.AddRule(&nftables.Rule{Table: t, Chain: c, Exprs: r.Exprs, UserData: Comment(r.Comment)})
		}
	}
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("program nftables table %s: %w", want.Name, err)
	}
	return nil
}

// elementsPerMessage bounds the elements of one netlink message. The
// attribute that lists them has a 16-bit length, which 4,096 IPv4
// elements (16 bytes each) overflow; the kernel then reads the list cut
// short, silently, and adds or deletes only what it read.
const elementsPerMessage = 1024

// AddSet queues on conn the creation of set with els, the elements in
// messages of at most elementsPerMessage (conn.AddSet would put them all
// in one). Where an interval's start and end fall into two messages, the
// transaction still holds both.
func AddSet(conn *nftables.Conn, set *nftables.Set, els []nftables.SetElement) error {
	if err := conn.AddSet(set, nil); err != nil {
		return err
	}
	for c := range slices.Chunk(els, elementsPerMessage) {
		if err := conn.SetAddElements(set, c); err != nil {
			return err
		}
	}
	return nil
}

// QueueElements queues on conn the addition (add false: the deletion) of
// addrs to set, in messages of at most elementsPerMessage elements, for
// the next Flush to write in one transaction.
func QueueElements(conn *nftables.Conn, set *nftables.Set, addrs []netip.Addr, add bool) error {
	op := conn.SetAddElements
	if !add {
		op = conn.SetDeleteElements
	}
	for as := range slices.Chunk(addrs, elementsPerMessage) {
		if err := op(set, Elements(as)); err != nil {
			return err
		}
	}
	return nil
}

// Elements are addresses as set elements.
func Elements(addrs []netip.Addr) []nftables.SetElement {
	out := make([]nftables.SetElement, len(addrs))
	for i, a := range addrs {
		out[i] = nftables.SetElement{Key: a.AsSlice()}
	}
	return out
}

// Match matches packets whose source (or destination, dst) address is in
// p: a load of the whole address, a mask and a compare.
func Match(p netip.Prefix, dst bool) []expr.Any {
	off, size := AddrOffset(p.Addr().Is6(), dst)
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: size},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: size,
			Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen()), Xor: make([]byte, size)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: p.Masked().Addr().AsSlice()},
	}
}

// NotMatch matches packets whose source (or destination) is outside p.
func NotMatch(p netip.Prefix, dst bool) []expr.Any {
	m := Match(p, dst)
	m[len(m)-1].(*expr.Cmp).Op = expr.CmpOpNeq
	return m
}

// AddrOffset is the offset and length of the source (or destination)
// address in an IPv4 (or IPv6) header.
func AddrOffset(ipv6, dst bool) (off, size uint32) {
	off, size = 12, 4
	if ipv6 {
		off, size = 8, 16
	}
	if dst {
		off += size
	}
	return off, size
}

// Concat joins the parts of a rule.
func Concat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}
