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

// checkFastPathFirewall tells, on a uvxlan node whose fast path is
// attached, that the host's firewall rules on the VXLAN port do not apply
// to the peers the fast path carries: its tc programs take their datagrams
// before netfilter's input hook and send without its output and
// postrouting hooks. A rule that drops the port (the README's tour) then
// blocks only the peers on the userspace path.
func checkFastPathFirewall(s *state) {
	if s.k == nil || s.k.Device.Kind != inspect.KindTAP {
		return
	}
	port := subnet.DefaultVXLANPort
	if s.Config != nil {
		port = s.Config.Backend.Port
	}
	fp, err := s.fastPath()
	if err != nil {
		s.r.add("firewall/fastpath", Warn, "run weftctl doctor as root (it queries the tc programs)", "%v", err)
		return
	}
	if !fp.Egress && !fp.Ingress {
		s.r.ok("firewall/fastpath", "no fast path attached: host firewall rules on UDP %d apply to every peer", port)
		return
	}
	if fp.Bridge != "" {
		checkBridgeHooks(s, fp.Bridge)
	}
	found, err := s.portRules(port)
	if err != nil {
		s.r.add("firewall/fastpath", Warn, "", "read nftables rules: %v", err)
		return
	}
	rules := make([]string, len(found))
	for i, r := range found {
		rules[i] = r.String()
	}
	if len(rules) == 0 {
		s.r.ok("firewall/fastpath", "fast path attached; no nftables rule on UDP %d, which it would bypass", port)
		return
	}
	s.r.add("firewall/fastpath", Warn,
		`filter the VXLAN port on the network or on the peers, or turn the fast path off ("FastPath": false in the network config's Backend)`,
		"fast path attached (%s on %s's egress, %s on the underlay's ingress): %s match UDP %d but do not apply to the peers it carries, "+
			"whose datagrams tc handles before netfilter (only peers on the userspace path meet them)",
		inspect.FastEgressProgram, s.k.Device.Name, inspect.FastIngressProgram, strings.Join(rules, "; "), port)
}

// checkBridgeHooks tells what the bridge program skips: the bridge
// family's output and postrouting hooks, for the TCP super-packets from
// peers it hands to the pods' ports; the ip and inet families' hooks
// (forward, where NetworkPolicy is enforced) have seen them before.
func checkBridgeHooks(s *state, bridge string) {
	var chains []string
	err := s.Do.Run(func() error {
		c, err := nftables.New()
		if err != nil {
			return err
		}
		all, err := c.ListChainsOfTableFamily(nftables.TableFamilyBridge)
		for _, ch := range all {
			if ch.Hooknum != nil && (*ch.Hooknum == *nftables.ChainHookOutput || *ch.Hooknum == *nftables.ChainHookPostrouting) {
				chains = append(chains, fmt.Sprintf("table bridge %s chain %s", ch.Table.Name, ch.Name))
			}
		}
		return err
	})
	switch {
	case err != nil:
		s.r.add("firewall/fastpath", Warn, "", "read the bridge family's nftables chains: %v", err)
	case len(chains) > 0:
		s.r.add("firewall/fastpath", Warn,
			`match pod traffic on the ip or inet family's forward hook instead, or turn the fast path off ("FastPath": false in the network config's Backend)`,
			"%s on %s's egress hands peers' TCP super-packets to the pods' ports without the bridge family's output and postrouting hooks: %s do not see them",
			inspect.FastBridgeProgram, bridge, strings.Join(chains, "; "))
	default:
		s.r.ok("firewall/fastpath", "%s on %s's egress hands peers' TCP super-packets to the pods' ports; no bridge-family chain on the output or postrouting hook, which it skips",
			inspect.FastBridgeProgram, bridge)
	}
}

// fastPath reads, once, which of the uvxlan fast path's programs the node
// has attached; none on a node whose overlay device is not uvxlan's TAP.
func (s *state) fastPath() (inspect.FastPath, error) {
	if s.fp == nil {
		s.fp = &fastPathRead{}
		if s.k != nil && s.k.Device.Kind == inspect.KindTAP {
			underlay := 0
			if u, _, err := s.underlay(); err == nil {
				underlay = u.Attrs().Index
			}
			s.fp.FastPath, s.fp.err = inspect.ReadFastPath(s.Do.Run, s.k.Device.Index, underlay)
		}
	}
	return s.fp.FastPath, s.fp.err
}

type fastPathRead struct {
	inspect.FastPath
	err error
}

// portRule is a rule that compares a port: where it is.
type portRule struct {
	family       nftables.TableFamily
	table, chain string
	handle       uint64
	input        bool // on the input hook
}

func (r portRule) String() string {
	return fmt.Sprintf("table %s %s chain %s rule %d", familyName(r.family), r.table, r.chain, r.handle)
}

// portRules finds the nftables rules in the base chains on the input,
// output, prerouting and postrouting hooks that compare a UDP or TCP port
// with port.
func (s *state) portRules(port int) ([]portRule, error) {
	var out []portRule
	err := s.Do.Run(func() error {
		c, err := nftables.New()
		if err != nil {
			return err
		}
		chains, err := c.ListChains()
		if err != nil {
			return err
		}
		for _, ch := range chains {
			if ch.Hooknum == nil || !hostHook(*ch.Hooknum) || weftFilter(ch.Table) {
				continue
			}
			rules, err := c.GetRules(ch.Table, ch)
			if err != nil {
				return err
			}
			for _, r := range rules {
				if matchesPort(r.Exprs, port) {
					out = append(out, portRule{ch.Table.Family, ch.Table.Name, ch.Name, r.Handle, *ch.Hooknum == *nftables.ChainHookInput})
				}
			}
		}
		return nil
	})
	return out, err
}

func hostHook(h nftables.ChainHook) bool {
	return h == *nftables.ChainHookInput || h == *nftables.ChainHookOutput ||
		h == *nftables.ChainHookPrerouting || h == *nftables.ChainHookPostrouting
}

func familyName(f nftables.TableFamily) string {
	return map[nftables.TableFamily]string{nftables.TableFamilyIPv4: "ip", nftables.TableFamilyIPv6: "ip6",
		nftables.TableFamilyINet: "inet", nftables.TableFamilyBridge: "bridge", nftables.TableFamilyNetdev: "netdev"}[f]
}

// matchesPort reports whether exprs load a transport header's source or
// destination port and compare it equal to port (`udp dport 8472`).
func matchesPort(exprs []expr.Any, port int) bool {
	want := binary.BigEndian.AppendUint16(nil, uint16(port))
	loaded := map[uint32]bool{} // registers holding a port
	for _, e := range exprs {
		switch e := e.(type) {
		case *expr.Payload:
			if e.Base == expr.PayloadBaseTransportHeader && e.Len == 2 && (e.Offset == 0 || e.Offset == 2) {
				loaded[e.DestRegister] = true
			}
		case *expr.Cmp:
			if e.Op == expr.CmpOpEq && loaded[e.Register] && string(e.Data) == string(want) {
				return true
			}
		}
	}
	return false
}
