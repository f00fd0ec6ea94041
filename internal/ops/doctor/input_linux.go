package doctor

import (
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/weft-net/weft/internal/ops/inspect"
	"github.com/weft-net/weft/subnet"
)

// tunnelPort is the UDP port the overlay's packets arrive on, by backend
// type; ok is false for backends without one (host-gw and the others).
func tunnelPort(cfg *subnet.Config) (port int, name string, ok bool) {
	switch cfg.Backend.Type {
	case subnet.BackendTypeVXLAN, subnet.BackendTypeUVXLAN:
		return cfg.Backend.Port, "VXLAN", true
	case subnet.BackendTypeWireGuard:
		return cfg.Backend.ListenPort, "WireGuard", true
	}
	return 0, "", false
}

// portVerdict is what an input chain does with the overlay's UDP
// datagrams: accept, drop (by a rule, named in rule, or by the policy), or
// nothing said (the next hook or the default accept).
type portVerdict struct {
	chain  dropChain
	drops  bool
	rule   string // the rule that decided, in nft's words; "" for the policy
	policy bool   // the chain's policy is drop
}

// checkInput looks for nftables chains on the input hook (native ones and
// iptables-nft's INPUT) that drop the overlay's UDP port: a rule that drops
// or rejects datagrams to it, or a policy drop that no rule before it
// overrides with an accept of the port from every peer (or of everything,
// see portRule). Such a chain
// drops every VXLAN or WireGuard datagram from the peers, whatever weft
// programs: a failure. With uvxlan's fast path attached it drops only the
// datagrams of peers on the userspace path (the fast path takes the others
// before netfilter): a warning. iptables-legacy's INPUT is not read.
func checkInput(s *state) {
	if s.Config == nil {
		return
	}
	port, what, ok := tunnelPort(s.Config)
	if !ok {
		return
	}
	var found []portVerdict
	err := s.hookChains(nftables.ChainHookInput, func(c *nftables.Conn, ch *nftables.Chain) error {
		if ch.Type != nftables.ChainTypeFilter || ch.Table.Family == nftables.TableFamilyIPv6 {
			return nil
		}
		v := portVerdict{chain: dropChain{family: ch.Table.Family, table: ch.Table.Name, name: ch.Name},
			policy: ch.Policy != nil && *ch.Policy == nftables.ChainPolicyDrop}
		decided, err := chainVerdict(c, ch.Table, ch.Name, uint16(port), &v, 0)
		if err != nil {
			return err
		}
		if !decided && v.policy {
			v.drops = true
		}
		if v.drops {
			found = append(found, v)
		}
		return nil
	})
	if err != nil {
		s.r.add("firewall/input", Warn, "", "read nftables chains: %v", err)
		return
	}
	sc := s.inputDropScope(what)
	for _, v := range found {
		fam := strings.Fields(v.chain.String())[1]
		fix := fmt.Sprintf("nft insert rule %s %s %s udp dport %d accept", fam, v.chain.table, v.chain.name, port)
		if v.chain.table == "filter" && v.chain.name == "INPUT" {
			fix = fmt.Sprintf("iptables -I INPUT -p udp --dport %d -j ACCEPT", port)
		}
		if v.rule != "" {
			s.r.add("firewall/input", sc.status, "delete that rule, or "+fix,
				"%s drops UDP %d (%s, %s) by rule %q%s", v.chain, port, what, sc.whom, v.rule, sc.bypass)
			continue
		}
		s.r.add("firewall/input", sc.status, fix,
			"%s has policy drop and no rule accepting UDP %d from every peer: %s that no rule accepts are dropped there, whatever other tables accept%s", v.chain, port, sc.dropped, sc.bypass)
	}
	if len(found) == 0 {
		s.r.ok("firewall/input", "no input chain drops UDP %d (%s)", port, what)
	}
}

// dropScope is whose datagrams an input chain dropping the tunnel port
// cuts off, in the report's words, and how severe that is.
type dropScope struct {
	status  Status
	whom    string // "every VXLAN datagram from the peers"
	dropped string // "the VXLAN datagrams"
	bypass  string // "" or why some peers' datagrams still arrive
}

// inputDropScope: every peer's datagrams (a failure), unless uvxlan's fast
// path has its ingress program on the underlay, which takes the datagrams
// of the peers in its map before netfilter, so that the chain cuts off
// only peers on the userspace path (a warning). A node runs uvxlan by its
// network config or by weftd's --backend: the TAP device and the program
// tell, not the config.
func (s *state) inputDropScope(what string) dropScope {
	sc := dropScope{status: Fail, whom: "every " + what + " datagram from the peers", dropped: "the " + what + " datagrams"}
	if fp, err := s.fastPath(); err == nil && fp.Ingress {
		sc.status, sc.whom = Warn, "the datagrams of peers on the userspace path"
		sc.dropped += " of peers on the userspace path"
		sc.bypass = fmt.Sprintf("; the fast path (%s on the underlay's ingress) takes the datagrams of the peers it carries before this hook, so they still arrive", inspect.FastIngressProgram)
	}
	return sc
}

// chainVerdict walks the rules of a chain (and the chains its rules jump
// or go to, a few levels deep) and records in v the first rule that
// accepts or drops the port; decided is false when none did. A jump that
// has matches of its own (firewalld's per-interface zones, ufw's chains)
// is taken as passing the port's datagrams: an accept in its chain
// decides, a drop there does not (the match may not cover them).
func chainVerdict(c *nftables.Conn, t *nftables.Table, name string, port uint16, v *portVerdict, depth int) (bool, error) {
	if depth > 6 {
		return false, nil
	}
	rules, err := c.GetRules(t, &nftables.Chain{Name: name, Table: t})
	if err != nil {
		return false, fmt.Errorf("rules of %s %s: %w", t.Name, name, err)
	}
	for _, r := range rules {
		if target, matches := ruleJump(r); target != "" {
			var sub portVerdict
			decided, err := chainVerdict(c, t, target, port, &sub, depth+1)
			if err != nil {
				return false, err
			}
			if decided && (!sub.drops || !matches) {
				v.drops, v.rule = sub.drops, sub.rule
				return true, nil
			}
			continue
		}
		switch portRule(r, port) {
		case "accept":
			return true, nil
		case "drop":
			v.drops, v.rule = true, describeRule(r, port)
			if depth > 0 {
				v.rule += " in chain " + name
			}
			return true, nil
		}
	}
	return false, nil
}

// ruleJump returns the chain a rule jumps or goes to ("" for none) and
// whether the rule has matches (anything but a counter and the verdict).
func ruleJump(r *nftables.Rule) (target string, matches bool) {
	for _, e := range r.Exprs {
		switch e := e.(type) {
		case *expr.Counter:
		case *expr.Verdict:
			if e.Kind == expr.VerdictJump || e.Kind == expr.VerdictGoto {
				target = e.Chain
			}
		default:
			matches = true
		}
	}
	return target, matches
}

// portRule says what a rule does with a UDP datagram to port: "accept"
// when it accepts everything, or matches the port (and UDP, if it names a
// protocol) and nothing narrower and accepts; "drop" when it drops or
// rejects everything, or the port and nothing else; "" when it does not
// decide for every peer's datagrams. An accept limited to some sources,
// interfaces or marks (`ip saddr 1.2.3.4 udp dport 8472 accept`) leaves
// the other peers to the rules after it and the policy. A conntrack state
// match that includes new (firewalld's `ct state new,untracked`) does not
// narrow an accept: VXLAN's hashed source ports open new flows, and the
// chains that use it accept established ones before. A drop with any other
// match does not decide (conntrack state does not cover VXLAN's hashed
// source ports).
func portRule(r *nftables.Rule, port uint16) string {
	const (
		loadNone = iota
		loadOther
		loadProto   // the layer-4 protocol
		loadDport   // the transport destination port
		loadCtState // conntrack's state bits
	)
	var (
		matches   int
		portMatch bool
		other     bool // a match besides the protocol and the port
		narrow    bool // one that may leave out some peers' datagrams
		verdict   string
		load      = loadNone // what the last load put in a register
		ctMask    uint32
	)
	for _, e := range r.Exprs {
		switch e := e.(type) {
		case *expr.Counter, *expr.Log:
		case *expr.Meta:
			load = loadOther
			if e.Key == expr.MetaKeyL4PROTO {
				load = loadProto
			}
		case *expr.Payload:
			switch {
			case e.Base == expr.PayloadBaseNetworkHeader && e.Offset == 9 && e.Len == 1:
				load = loadProto
			case e.Base == expr.PayloadBaseTransportHeader && e.Offset == 2 && e.Len == 2:
				load = loadDport
			default:
				load = loadOther
			}
		case *expr.Ct:
			load = loadOther
			if e.Key == expr.CtKeySTATE {
				load, ctMask = loadCtState, ^uint32(0)
			}
		case *expr.Bitwise:
			if load == loadCtState && len(e.Mask) == 4 {
				ctMask &= binary.NativeEndian.Uint32(e.Mask)
			} else {
				load = loadOther
			}
		case *expr.Cmp:
			matches++
			switch load {
			case loadProto:
				if e.Op != expr.CmpOpEq || len(e.Data) != 1 || e.Data[0] != 17 {
					return "" // not UDP
				}
			case loadDport:
				if e.Op != expr.CmpOpEq || len(e.Data) != 2 || binary.BigEndian.Uint16(e.Data) != port {
					return "" // another port
				}
				portMatch = true
			case loadCtState:
				other = true
				narrow = narrow || e.Op != expr.CmpOpNeq || !allZero(e.Data) || ctMask&ctStateNew == 0
			default:
				other, narrow = true, true
			}
			load = loadNone
		case *expr.Verdict:
			switch e.Kind {
			case expr.VerdictAccept:
				verdict = "accept"
			case expr.VerdictDrop:
				verdict = "drop"
			}
		case *expr.Reject:
			verdict = "drop"
		default: // a set lookup, a range, a match of iptables' xtables...
			other, narrow = true, true
		}
	}
	switch {
	case matches == 0 && !other:
		return verdict // accepts or drops everything
	case portMatch && verdict == "accept" && !narrow:
		return "accept"
	case portMatch && verdict == "drop" && !other:
		return "drop"
	}
	return ""
}

// ctStateNew is conntrack's new state bit in `ct state` (IP_CT_NEW's).
const ctStateNew = 1 << 3

func allZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}

// describeRule names a dropping rule by what it matched and its handle.
func describeRule(r *nftables.Rule, port uint16) string {
	for _, e := range r.Exprs {
		if p, ok := e.(*expr.Payload); ok && p.Base == expr.PayloadBaseTransportHeader {
			return fmt.Sprintf("udp dport %d drop (handle %d)", port, r.Handle)
		}
	}
	return fmt.Sprintf("drop, matching every packet (handle %d)", r.Handle)
}
