package doctor

import (
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/safchain/ethtool"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/weft-net/weft/backend/masq"
	"github.com/weft-net/weft/backend/vxlan"
	"github.com/weft-net/weft/internal/ops/inspect"
	"github.com/weft-net/weft/subnet"
)

// dropChain is a forward-hook chain of another owner whose policy drops.
type dropChain struct {
	family      nftables.TableFamily
	table, name string
	accepts     bool // a rule accepts the cluster network
}

func (c dropChain) String() string {
	fam := map[nftables.TableFamily]string{nftables.TableFamilyIPv4: "ip", nftables.TableFamilyIPv6: "ip6", nftables.TableFamilyINet: "inet", nftables.TableFamilyBridge: "bridge"}[c.family]
	return fmt.Sprintf("table %s %s chain %s", fam, c.table, c.name)
}

// checkFirewall looks for other firewalls that drop forwarded pod traffic:
// nftables chains on the forward hook with policy drop (iptables-nft's
// FORWARD included, where Docker sets DROP), and iptables-legacy tables,
// which nftables does not show (their filter FORWARD policy is read too).
func checkFirewall(s *state) {
	chains, err := s.forwardDropChains()
	if err != nil {
		s.r.add("firewall/forward", Warn, "", "read nftables chains: %v", err)
	}
	network := "the cluster network"
	if s.Config != nil {
		network = s.Config.Network.String()
	}

	for _, c := range chains {
		if c.accepts {
			s.r.ok("firewall/forward", "%s has policy drop but a rule accepts %s", c, network)
			continue
		}

		fix := fmt.Sprintf("nft insert rule %s %s ip saddr %s accept; nft insert rule %s %s ip daddr %s accept",
			strings.Fields(c.String())[1]+" "+c.table, c.name, network, strings.Fields(c.String())[1]+" "+c.table, c.name, network)
		if c.table == "filter" && c.name == "FORWARD" {
			fix = fmt.Sprintf("run weftd with --iptables-forward-rules (the default) and without EnableNFTables: it keeps chain WEFT-FWD accepting %s here; "+
				"or iptables -I FORWARD -s %s -j ACCEPT; iptables -I FORWARD -d %s -j ACCEPT", network, network, network)
		}
		s.r.add("firewall/forward", Fail, fix,
			"%s has policy drop and no rule accepting %s: forwarded pod traffic is dropped there, whatever other tables accept", c, network)
	}
	if err == nil && len(chains) == 0 {
		s.r.ok("firewall/forward", "no other forward chain with policy drop")
	}
	if names, err := s.procNet("ip_tables_names"); err == nil && strings.TrimSpace(names) != "" {
		s.r.add("firewall/iptables-legacy", Warn, "check them with `iptables-legacy -S` (and migrate them to iptables-nft or nft)",
			"iptables-legacy tables %s are loaded: their rules run beside nftables and `nft list ruleset` does not show them", strings.Join(strings.Fields(names), ", "))
		checkLegacyForward(s, names)
	}
}

// hookChains calls f, in the node's namespace, for each nftables base
// chain on hook that is not in weft's masquerade tables or in the kernel
// VXLAN backend's port filter (checkPeerFilter reports that one).
func (s *state) hookChains(hook *nftables.ChainHook, f func(c *nftables.Conn, ch *nftables.Chain) error) error {
	return s.Do.Run(func() error {
		c, err := nftables.New()
		if err != nil {
			return err
		}
		chains, err := c.ListChains()
		if err != nil {
			return err
		}
		for _, ch := range chains {
			if ch.Hooknum == nil || *ch.Hooknum != *hook || ch.Table.Name == masq.TableIPv4 || ch.Table.Name == masq.TableIPv6 ||
				ch.Table.Name == vxlan.FilterTable && ch.Table.Family == nftables.TableFamilyINet {
				continue
			}
			if err := f(c, ch); err != nil {
				return err
			}
		}
		return nil
	})
}

func (s *state) forwardDropChains() ([]dropChain, error) {
	var out []dropChain
	err := s.hookChains(nftables.ChainHookForward, func(c *nftables.Conn, ch *nftables.Chain) error {
		if ch.Policy == nil || *ch.Policy != nftables.ChainPolicyDrop {
			return nil
		}
		d := dropChain{family: ch.Table.Family, table: ch.Table.Name, name: ch.Name}
		rules, err := c.GetRules(ch.Table, ch)
		if err != nil {
			return err
		}
		d.accepts = s.Config != nil && acceptsNetwork(rules, s.Config.Network)
		for _, target := range jumpTargets(rules) { // weft's -j WEFT-FWD, Flannel's -j FLANNEL-FWD
			sub, err := c.GetRules(ch.Table, &nftables.Chain{Name: target, Table: ch.Table})
			if err != nil {
				return err
			}
			d.accepts = d.accepts || s.Config != nil && acceptsNetwork(sub, s.Config.Network)
		}
		out = append(out, d)
		return nil
	})
	return out, err
}

// jumpTargets are the chains that rules jump (or go) to for every packet:
// rules with no expression but a counter and the verdict.
func jumpTargets(rules []*nftables.Rule) []string {
	var out []string
	for _, r := range rules {
		if t := jumpTarget(r); t != "" {
			out = append(out, t)
		}
	}
	return out
}

func jumpTarget(r *nftables.Rule) string {
	target := ""
	for _, e := range r.Exprs {
		switch e := e.(type) {
		case *expr.Counter:
		case *expr.Verdict:
			if e.Kind == expr.VerdictJump || e.Kind == expr.VerdictGoto {
				target = e.Chain
			}
		default:
			return ""
		}
	}
	return target
}

// acceptsNetwork reports whether a rule matches an address prefix that
// covers the network and accepts. nft matches a prefix by loading only its
// leading bytes (ip saddr 10.244.0.0/16 compares 2 bytes), masked when the
// length is not a multiple of 8; iptables-nft loads 4 bytes and masks.
func acceptsNetwork(rules []*nftables.Rule, network netip.Prefix) bool {
	net4 := network.Masked().Addr().AsSlice()
	for _, r := range rules {
		covers, accept := false, false
		var mask []byte
		for _, e := range r.Exprs {
			switch e := e.(type) {
			case *expr.Bitwise:
				mask = e.Mask
			case *expr.Cmp:
				covers = covers || e.Op == expr.CmpOpEq && prefixCovers(e.Data, mask, net4, network.Bits())
				mask = nil
			case *expr.Verdict:
				accept = e.Kind == expr.VerdictAccept
			}
		}
		if covers && accept {
			return true
		}
	}
	return false
}

// prefixCovers reports whether comparing the leading len(data) bytes of an
// address, under mask (nil: all ones), with data matches every address of
// the network net4/bits.
func prefixCovers(data, mask, net4 []byte, bits int) bool {
	if len(data) == 0 || len(data) > len(net4) || mask != nil && len(mask) != len(data) {
		return false
	}
	ones := 0
	for i := range data {
		m := byte(0xff)
		if mask != nil {
			m = mask[i]
		}
		if net4[i]&m != data[i] {
			return false
		}
		for b := m; b != 0; b <<= 1 {
			ones++
		}
	}
	return ones <= bits
}

// checkVXLANPort looks for other VXLAN devices that hold weft's UDP port
// or use its VNI (a flanneld left running, a device left from another run).
func checkVXLANPort(s *state) {
	port, vni := subnet.DefaultVXLANPort, subnet.DefaultVNI
	if s.Config != nil {
		port, vni = s.Config.Backend.Port, s.Config.Backend.VNI
	}
	own := ""
	if s.k != nil {
		own = s.k.Device.Name
	}
	links, err := s.Handle.LinkList()
	if err != nil {
		s.r.add("vxlan/port", Warn, "", "list links: %v", err)
		return
	}
	found := false
	for _, l := range links {
		v, ok := l.(*netlink.Vxlan)
		if !ok || v.Name == own {
			continue
		}
		switch {
		case v.Port == port:
			found = true
			st, holds, why := Fail, "holds", "the userspace VTEP cannot receive on it"
			switch {
			case v.Flags&net.FlagUp == 0:
				st, holds, why = Warn, "is down but set to", "it cannot open the port while weftd holds it, but it takes the port when it comes up first (after a reboot)"
			case s.k != nil && s.k.Device.Kind == inspect.KindVXLAN:
				st, why = Warn, "the kernel shares the port between VNIs, but a second overlay on it is a leftover (flanneld still running?)"
			}
			s.r.add("vxlan/port", st, fmt.Sprintf("stop the daemon that owns it (flanneld?), then ip link delete %s", v.Name),
				"%s (VNI %d) %s UDP port %d: %s", v.Name, v.VxlanId, holds, port, why)
		case v.VxlanId == vni:
			found = true
			s.r.add("vxlan/port", Warn, "ip link delete "+v.Name+" if nothing uses it",
				"%s uses VNI %d too (on port %d): a duplicate VNI on the node", v.Name, vni, v.Port)
		}
	}
	if !found {
		s.r.ok("vxlan/port", "no other VXLAN device on UDP port %d or VNI %d", port, vni)
	}
}

// checkOffload reports the transmit checksum offload of a kernel VXLAN
// device: before Linux 5.7, with masquerade --random-fully (which weft
// uses) or kube-proxy's NAT, the kernel sends VXLAN datagrams with a bad
// UDP checksum ("UDP: bad checksum" on the receiver) while it is on.
// weftd's vxlan backend turns it off itself on those kernels, so finding it
// on there means the device is not (or not yet) weftd's.
func checkOffload(s *state) {
	if s.k == nil {
		return
	}
	if s.k.Device.Kind != inspect.KindVXLAN {
		s.r.ok("offload/checksum", "%s is a TAP: weftd builds the VXLAN datagrams itself, so the kernel VXLAN checksum offload bug does not apply", s.k.Device.Name)
		return
	}
	var feats map[string]bool
	err := s.Do.Run(func() error {
		e, err := ethtool.NewEthtool()
		if err != nil {
			return err
		}
		defer e.Close()
		feats, err = e.Features(s.k.Device.Name)
		return err
	})
	if err != nil {
		s.r.add("offload/checksum", Warn, "", "read the offload features of %s: %v", s.k.Device.Name, err)
		return
	}
	on := feats["tx-checksum-ip-generic"]
	major, minor := kernelVersion()
	fix := "ethtool -K " + s.k.Device.Name + " tx-checksum-ip-generic off"
	switch {
	case on && (major < 5 || major == 5 && minor < 7):
		s.r.add("offload/checksum", Fail, "run weftd (on kernels before 5.7 it turns the offload off when it creates or adopts the device and at every full sync); meanwhile: "+fix,
			"kernel %d.%d < 5.7 with tx-checksum-ip-generic on: NATed VXLAN traffic (Services, masquerade) leaves with a bad checksum; weftd turns it off on such kernels, so %s is not managed by a running weftd of this release", major, minor, s.k.Device.Name)
	case on:
		s.r.ok("offload/checksum", "tx-checksum-ip-generic on; kernel %d.%d ≥ 5.7 carries the fix, so weftd leaves it on (if a peer logs \"UDP: bad checksum\" from this node, run: %s)", major, minor, fix)
	default:
		s.r.ok("offload/checksum", "tx-checksum-ip-generic off on %s", s.k.Device.Name)
	}
}

func kernelVersion() (major, minor int) {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return 0, 0
	}
	fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &major, &minor)
	return major, minor
}
