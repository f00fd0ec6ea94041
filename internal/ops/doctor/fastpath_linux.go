package doctor

import (
	"fmt"
	"strings"

	"github.com/google/nftables"

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
