package forward

import (
	"fmt"
	"net"
	"net/netip"
	"reflect"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// nftTables is iptables-nft's table of one family (ip or ip6), written
// through nftables' netlink API in the form the iptables-nft binary writes,
// so that `iptables-nft -S` lists weft's rules as if it had written them:
// every rule ends in a counter and an immediate verdict, an address match
// is a load of the address's prefix bytes compared with them (a whole
// address masked by a bitwise when the prefix ends inside a byte), and no
// rule carries user data. No binary is needed.
type nftTables struct{ fam family }

var _ backend = nftTables{}

func (t nftTables) String() string { return binary(nft, t.fam) }

func (t nftTables) family() nftables.TableFamily {
	if t.fam == 6 {
		return nftables.TableFamilyIPv6
	}
	return nftables.TableFamilyIPv4
}

func (t nftTables) table(name string) *nftables.Table {
	return &nftables.Table{Name: name, Family: t.family()}
}

// chains returns the chains of table by name.
func (t nftTables) chains(conn *nftables.Conn, table string) (map[string]*nftables.Chain, error) {
	all, err := conn.ListChainsOfTableFamily(t.family())
	if err != nil {
		return nil, fmt.Errorf("%s: list nftables chains: %w", t, err)
	}
	out := map[string]*nftables.Chain{}
	for _, c := range all {
		if c.Table.Name == table {
			out[c.Name] = c
		}
	}
	return out, nil
}

func (t nftTables) rules(conn *nftables.Conn, table, chain string) ([]*nftables.Rule, error) {
	rules, err := conn.GetRules(t.table(table), &nftables.Chain{Name: chain, Table: t.table(table)})
	if err != nil {
		return nil, fmt.Errorf("%s: list %s %s: %w", t, table, chain, err)
	}
	return rules, nil
}

// check returns why the chain and jump differ from what program writes.
func (t nftTables) check(n netip.Prefix) (string, error) {
	conn, err := nftables.New()
	if err != nil {
		return "", fmt.Errorf("nftables connection: %w", err)
	}
	chains, err := t.chains(conn, "filter")
	if err != nil {
		return "", err
	}
	if chains[Chain] == nil {
		return "chain missing", nil
	}
	have, err := t.rules(conn, "filter", Chain)
	if err != nil {
		return "", err
	}
	want := acceptRules(n)
	if !slices.EqualFunc(have, want, sameRule) {
		return "rules of " + Chain + " changed", nil
	}
	fwd, err := t.rules(conn, "filter", "FORWARD")
	if err != nil {
		return "", err
	}
	switch c := len(jumps(fwd)); {
	case c == 0:
		return "jump from FORWARD missing", nil
	case c > 1:
		return "jump from FORWARD duplicated", nil
	}
	return "", nil
}

// program writes weft's chain afresh and leaves exactly one jump to it (the
// last), appended to FORWARD unless one is there already, in one
// transaction.
func (t nftTables) program(n netip.Prefix) error {
	conn, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables connection: %w", err)
	}
	fwd, err := t.rules(conn, "filter", "FORWARD")
	if err != nil {
		return err
	}
	tbl := t.table("filter")
	c := conn.AddChain(&nftables.Chain{Name: Chain, Table: tbl}) // a no-op when it exists
	conn.FlushChain(c)
	for _, r := range acceptRules(n) {
		conn.AddRule(&nftables.Rule{Table: tbl, Chain: c, Exprs: r})
	}
	js := jumps(fwd)
	for _, r := range js[:max(len(js)-1, 0)] {
		if err := conn.DelRule(r); err != nil {
			return fmt.Errorf("%s: delete a duplicate jump to %s: %w", t, Chain, err)
		}
	}
	if len(js) == 0 {
		conn.AddRule(&nftables.Rule{Table: tbl, Chain: &nftables.Chain{Name: "FORWARD", Table: tbl}, Exprs: jump(Chain)})
	}
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("%s: write %s and its jump: %w", t, Chain, err)
	}
	return nil
}

// removeChain deletes the rules of parent that jump or go to chain, then
// chain itself, in one transaction. It reports whether chain existed.
func (t nftTables) removeChain(table, parent, chain string) (bool, error) {
	conn, err := nftables.New()
	if err != nil {
		return false, fmt.Errorf("nftables connection: %w", err)
	}
	chains, err := t.chains(conn, table)
	if err != nil {
		return false, err
	}
	c := chains[chain]
	if c == nil {
		return false, nil
	}
	rules, err := t.rules(conn, table, parent)
	if err != nil {
		return true, err
	}
	for _, r := range rules {
		if goesTo(r, chain) {
			if err := conn.DelRule(r); err != nil {
				return true, fmt.Errorf("%s: delete a jump to %s: %w", t, chain, err)
			}
		}
	}
	conn.FlushChain(c)
	conn.DelChain(c)
	if err := conn.Flush(); err != nil {
		return true, fmt.Errorf("%s: delete %s %s: %w", t, table, chain, err)
	}
	return true, nil
}

// acceptRules are the expressions iptables-nft writes for the rules of
// Rules(n): -s n -j ACCEPT, -d n -j ACCEPT.
func acceptRules(n netip.Prefix) [][]expr.Any {
	return [][]expr.Any{
		append(addrMatch(n, false), &expr.Counter{}, &expr.Verdict{Kind: expr.VerdictAccept}),
		append(addrMatch(n, true), &expr.Counter{}, &expr.Verdict{Kind: expr.VerdictAccept}),
	}
}

// jump is iptables-nft's `-j chain` with no match.
func jump(chain string) []expr.Any {
	return []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictJump, Chain: chain}}
}

// addrMatch is iptables-nft's -s n (or -d n, dst): a prefix that ends on a
// byte boundary loads and compares only its bytes (none for a /0, which
// matches every packet); any other loads the whole address and masks it.
func addrMatch(n netip.Prefix, dst bool) []expr.Any {
	off, size := uint32(12), uint32(4)
	if n.Addr().Is6() {
		off, size = 8, 16
	}
	if dst {
		off += size
	}
	addr := n.Masked().Addr().AsSlice()
	if n.Bits() == 0 {
		return nil
	}
	if n.Bits()%8 == 0 {
		l := uint32(n.Bits() / 8)
		return []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: l},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: addr[:l]},
		}
	}
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: size},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: size,
			Mask: net.CIDRMask(n.Bits(), n.Addr().BitLen()), Xor: make([]byte, size)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: addr},
	}
}

// sameRule reports whether the kernel's rule has exactly the wanted
// expressions (counters equal whatever they counted) and no user data.
func sameRule(have *nftables.Rule, want []expr.Any) bool {
	if len(have.UserData) != 0 || len(have.Exprs) != len(want) {
		return false
	}
	for i, e := range have.Exprs {
		if _, ok := want[i].(*expr.Counter); ok {
			if _, ok := e.(*expr.Counter); !ok {
				return false
			}
			continue
		}
		if !reflect.DeepEqual(e, want[i]) {
			return false
		}
	}
	return true
}

// jumps are the rules that are exactly `-j WEFT-FWD`.
func jumps(rules []*nftables.Rule) []*nftables.Rule {
	want := jump(Chain)
	var out []*nftables.Rule
	for _, r := range rules {
		if sameRule(r, want) {
			out = append(out, r)
		}
	}
	return out
}

// goesTo reports whether the rule jumps or goes to chain, whatever else it
// matches.
func goesTo(r *nftables.Rule, chain string) bool {
	return slices.ContainsFunc(r.Exprs, func(e expr.Any) bool {
		v, ok := e.(*expr.Verdict)
		return ok && (v.Kind == expr.VerdictJump || v.Kind == expr.VerdictGoto) && v.Chain == chain
	})
}
