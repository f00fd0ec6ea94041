package policy

import (
	"errors"
	"fmt"
	"os"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"

	"github.com/weft-net/weft/backend/nft"
)

// This file builds the bridge table (the pods' source checks and the
// isolation of pods from broadcasts) and turns br_netfilter's settings on.

// buildAntiSpoof adds to t (family bridge, hook prerouting) the source
// checks of the pods' bridge ports in plans' Ports: a frame from one of
// those ports is dropped when it is
//
//	ARP with a sender address (not 0.0.0.0) that is not its port's,
//	IPv4 with a source address that is not its port's,
//	IPv6 with a source address that is not its port's, link-local or ::,
//	802.1Q or 802.1ad tagged (no pod needs them; they would carry packets
//	past the checks).
//
// Ports not listed (another plugin's veths, the bridge's other ports) are
// not checked. Every frame a pod sends crosses the chain, so each rule
// tests the frame's type first (a rule for another type costs one
// comparison), and a frame whose port and address are in the port's
// address set is accepted by the first rule of its type: a pod's own
// frames cost one lookup. IPv6 frames with a link-local or unspecified
// source are accepted from any port by their address alone; the other
// frames are looked up again in the set of ports and dropped (and
// counted) when they come from a pod, an IPv4 or IPv6 frame too short to
// hold a source address included:
//
//	ether type arp  iifname . arp saddr ip @pod-addrs accept
//	ether type arp  iifname @pod-ports  arp saddr ip != 0.0.0.0  counter drop
//	ether type ip   iifname . ip saddr @pod-addrs accept
//	ether type ip   iifname @pod-ports  counter drop
//	ether type ip6  iifname . ip6 saddr @v6-pod-addrs accept
//	ether type ip6  ip6 saddr fe80::/10 accept
//	ether type ip6  ip6 saddr :: accept
//	ether type ip6  iifname @pod-ports  counter drop
//	ether type 8021q  iifname @pod-ports  counter drop
//	ether type 8021ad  iifname @pod-ports  counter drop
//
// (bench/cluster's README has the profile.)
func buildAntiSpoof(conn *nftables.Conn, t *nftables.Table, plans []Plan) error {
	c := conn.AddChain(&nftables.Chain{Name: "prerouting", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityFilter})
	ports := &nftables.Set{Table: t, Name: "pod-ports", KeyType: nftables.TypeIFName}
	v4 := &nftables.Set{Table: t, Name: "pod-addrs", Concatenation: true, KeyType: nftables.MustConcatSetType(nftables.TypeIFName, nftables.TypeIPAddr)}
	v6 := &nftables.Set{Table: t, Name: "v6-pod-addrs", Concatenation: true, KeyType: nftables.MustConcatSetType(nftables.TypeIFName, nftables.TypeIP6Addr)}
	seen := map[string]bool{}
	var portEls, v4Els, v6Els []nftables.SetElement
	for _, p := range plans {
		for _, pp := range p.Ports {
			if len(pp.Port) >= 16 || pp.Port == "" {
				return fmt.Errorf("bridge port %q: not an interface name", pp.Port)
			}
			if pp.Addr.Is4() == p.V6 {
				return fmt.Errorf("bridge port %s: address %s in the plan of the other family", pp.Port, pp.Addr)
			}
			if !seen[pp.Port] {
				seen[pp.Port] = true
				portEls = append(portEls, nftables.SetElement{Key: ifname(pp.Port)})
			}
			el := nftables.SetElement{Key: append(ifname(pp.Port), pp.Addr.AsSlice()...)}
			if p.V6 {
				v6Els = append(v6Els, el)
			} else {
				v4Els = append(v4Els, el)
			}
		}
	}
	for _, x := range []struct {
		s   *nftables.Set
		els []nftables.SetElement
	}{{ports, portEls}, {v4, v4Els}, {v6, v6Els}} {
		if err := nft.AddSet(conn, x.s, x.els); err != nil {
			return fmt.Errorf("set %s: %w", x.s.Name, err)
		}
	}
	add := commentedRules(conn, t, c)
	fromPod := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Lookup{SourceRegister: 1, SetName: ports.Name, SetID: ports.ID},
	}
	portAddr := func(off, n uint32, s *nftables.Set) []expr.Any {
		return portAddrIn(expr.MetaKeyIIFNAME, off, n, s, false)
	}
	accept, drop := verdict(expr.VerdictAccept), join(counted(), verdict(expr.VerdictDrop))
	add("weft: ARP sender the pod's", etherType(unix.ETH_P_ARP), portAddr(14, 4, v4), accept)
	add("weft: ARP sender not the pod's", etherType(unix.ETH_P_ARP), fromPod,
		[]expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 14, Len: 4},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
		}, drop)
	add("weft: IPv4 source the pod's", etherType(unix.ETH_P_IP), portAddr(12, 4, v4), accept)
	add("weft: IPv4 source not the pod's", etherType(unix.ETH_P_IP), fromPod, drop)
	add("weft: IPv6 source the pod's", etherType(unix.ETH_P_IPV6), portAddr(ipv6.saddr, 16, v6), accept)
	add("weft: IPv6 link-local or unspecified source", etherType(unix.ETH_P_IPV6), linkLocal(ipv6.saddr), accept)
	add("weft: IPv6 link-local or unspecified source", etherType(unix.ETH_P_IPV6),
		[]expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: ipv6.saddr, Len: 16},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: make([]byte, 16)},
		}, accept)
	add("weft: IPv6 source not the pod's", etherType(unix.ETH_P_IPV6), fromPod, drop)
	add("weft: VLAN-tagged frame from a pod", etherType(unix.ETH_P_8021Q), fromPod, drop)
	add("weft: VLAN-tagged frame from a pod", etherType(unix.ETH_P_8021AD), fromPod, drop)
	return isolateBroadcast(conn, t, plans, v4, v6)
}

// isolateBroadcast adds to t (family bridge) a chain on the forward hook,
// where a frame that the bridge sends out of one port to another (the
// flooded copies of a broadcast or multicast frame each pass it, with the
// port they leave by) is dropped when it goes to the port of a pod
// isolated for ingress and its IPv4 or IPv6 destination is not that pod's
// address (in pod-addrs, v6-pod-addrs): broadcasts, multicast and any
// other packet the pod would take without being its destination, which
// the inet table's ingress check (by destination address) never matches.
// ARP and IPv6 neighbour solicitations and advertisements pass.
func isolateBroadcast(conn *nftables.Conn, t *nftables.Table, plans []Plan, v4, v6 *nftables.Set) error {
	iso := &nftables.Set{Table: t, Name: "ingress-isolated-ports", KeyType: nftables.TypeIFName}
	var els []nftables.SetElement
	seen := map[string]bool{}
	for _, p := range plans {
		for _, pp := range p.Ports {
			if !seen[pp.Port] && slices.Contains(p.IngressIsolated, pp.Addr) {
				seen[pp.Port] = true
				els = append(els, nftables.SetElement{Key: ifname(pp.Port)})
			}
		}
	}
	if err := nft.AddSet(conn, iso, els); err != nil {
		return fmt.Errorf("set %s: %w", iso.Name, err)
	}
	c := conn.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter})
	add := commentedRules(conn, t, c)
	toIsolated := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Lookup{SourceRegister: 1, SetName: iso.Name, SetID: iso.ID},
	}
	notPortDest := func(off, n uint32, s *nftables.Set) []expr.Any {
		return portAddrIn(expr.MetaKeyOIFNAME, off, n, s, true)
	}
	drop := join(counted(), verdict(expr.VerdictDrop))
	add("weft: to a pod isolated for ingress, not its IPv4 address", etherType(unix.ETH_P_IP), toIsolated, notPortDest(ipv4.daddr, 4, v4), drop)
	add("weft: IPv6 neighbour discovery", etherType(unix.ETH_P_IPV6), toIsolated, neighbourDiscovery(), verdict(expr.VerdictAccept))
	add("weft: to a pod isolated for ingress, not its IPv6 address", etherType(unix.ETH_P_IPV6), toIsolated, notPortDest(ipv6.daddr, 16, v6), drop)
	return nil
}

// commentedRules returns a function that appends to chain c of t a rule
// made of exprs, with note as its comment.
func commentedRules(conn *nftables.Conn, t *nftables.Table, c *nftables.Chain) func(note string, exprs ...[]expr.Any) {
	return func(note string, exprs ...[]expr.Any) {
		conn.AddRule(&nftables.Rule{Table: t, Chain: c, Exprs: join(exprs...), UserData: userdata.AppendString(nil, userdata.TypeComment, note)})
	}
}

// etherType matches frames of EtherType typ (bridge family).
func etherType(typ uint16) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseLLHeader, Offset: 12, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(typ)},
	}
}

// portAddrIn matches when the port (the input or output interface, key) .
// the address at off (len n) of the network header is in s (not in s,
// with invert).
func portAddrIn(key expr.MetaKey, off, n uint32, s *nftables.Set, invert bool) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Payload{DestRegister: 2, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n},
		&expr.Lookup{SourceRegister: 1, SetName: s.Name, SetID: s.ID, Invert: invert},
	}
}

// ifname is an interface name as nftables keys hold it: 16 bytes, zero
// padded.
func ifname(n string) []byte {
	b := make([]byte, 16)
	copy(b, n)
	return b
}

// ErrNoBridgeNetfilter says br_netfilter is not loaded: traffic between
// two pods of the node crosses the bridge unseen by the policy rules, and
// weftd does not load kernel modules.
var ErrNoBridgeNetfilter = errors.New("br_netfilter is not loaded, so traffic between pods of this node would bypass network policy " +
	"(load it: modprobe br_netfilter, or turn policy off: --network-policy=false)")

// EnsureBridgeNetfilter makes bridged IPv4 and IPv6 traffic pass the
// forward hook in the network namespace of the calling thread, as policy
// needs for the traffic between pods of one node: it sets
// net.bridge.bridge-nf-call-iptables and -ip6tables to 1 under procSys
// (normally /proc/sys; they are settings of each network namespace since
// Linux 5.3). It returns ErrNoBridgeNetfilter when br_netfilter is not
// loaded, and which settings it changed.
func EnsureBridgeNetfilter(procSys string) (changed []string, err error) {
	for _, name := range []string{"bridge-nf-call-iptables", "bridge-nf-call-ip6tables"} {
		path := procSys + "/net/bridge/" + name
		b, err := os.ReadFile(path)
		if errors.Is(err, os.ErrNotExist) {
			return changed, ErrNoBridgeNetfilter
		}
		if err != nil {
			return changed, fmt.Errorf("network policy: %w", err)
		}
		if len(b) > 0 && b[0] == '1' {
			continue
		}
		if err := os.WriteFile(path, []byte("1\n"), 0o644); err != nil {
			return changed, fmt.Errorf("network policy: set net.bridge.%s=1, without which traffic between pods of this node bypasses policy: %w", name, err)
		}
		changed = append(changed, "net.bridge."+name)
	}
	return changed, nil
}
