package doctor

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"

	"github.com/weft-net/weft/backend/forward"
	"github.com/weft-net/weft/backend/kernel"
	"github.com/weft-net/weft/subnet"
)

// fwdProbe makes this node forward a datagram between the overlay and its
// pods: an echo request with a borrowed source, whose reply the node
// forwards. In, the request goes from an unused address of the node's
// pod network (pods) to a peer's VTEP, and the peer's reply crosses the
// overlay device to the pods' link; out, it goes from the peer's VTEP to
// a pod the node has a neighbour entry for, whose reply crosses the pods'
// link to the overlay device.
type fwdProbe struct {
	peer     subnet.Lease
	out      bool
	src, dst netip.Addr // of the request; the reply goes dst → src
	pods     string     // the pods' link
}

func (p fwdProbe) String() string {
	if p.out {
		return fmt.Sprintf("echo reply from pod %s on %s forwarded to peer %s's VTEP %s", p.dst, p.pods, p.peer.Attrs.PublicIP, p.src)
	}
	return fmt.Sprintf("echo reply from peer %s's VTEP %s forwarded to %s on %s (this node's pods)", p.peer.Attrs.PublicIP, p.dst, p.src, p.pods)
}

// planForward picks the forward probes: in for every peer, out when the
// pods' link has a neighbour; why says what is missing when there are none.
func (s *state) planForward() (probes []fwdProbe, why string) {
	if s.k == nil || s.self == nil || s.Handle == nil || !s.self.Subnet.Addr().Is4() {
		return nil, "doctor found no overlay device or IPv4 lease to probe through"
	}
	sn := s.self.Subnet.Masked()
	last := binary.BigEndian.Uint32(sn.Addr().AsSlice()) | (1<<(32-sn.Bits()) - 1)
	unused := netip.AddrFrom4([4]byte(binary.BigEndian.AppendUint32(nil, last-1)))
	rs, err := s.Handle.RouteGet(unused.AsSlice())
	if err != nil || len(rs) == 0 || rs[0].LinkIndex == s.k.Device.Index || rs[0].Gw != nil || rs[0].Type == unix.RTN_LOCAL {
		return nil, fmt.Sprintf("no route to this node's pods (%s) on a link of their own", sn)
	}
	link, err := s.Handle.LinkByIndex(rs[0].LinkIndex)
	if err != nil {
		return nil, fmt.Sprintf("the link to this node's pods: %v", err)
	}
	var pods []netip.Addr
	neighs, _ := s.Handle.NeighList(rs[0].LinkIndex, netlink.FAMILY_V4)
	for _, n := range neighs {
		a, _ := netip.AddrFromSlice(n.IP)
		if a = a.Unmap(); sn.Contains(a) && a != unused && n.State&(netlink.NUD_REACHABLE|netlink.NUD_STALE|netlink.NUD_DELAY|netlink.NUD_PERMANENT) != 0 {
			pods = append(pods, a)
		}
	}
	slices.SortFunc(pods, netip.Addr.Compare)
	name := link.Attrs().Name
	for _, p := range s.peers() {
		vtep := kernel.Gateway(p.Subnet)
		if !vtep.Is4() {
			continue
		}
		probes = append(probes, fwdProbe{peer: p, src: unused, dst: vtep, pods: name})
		if len(pods) > 0 {
			probes = append(probes, fwdProbe{peer: p, out: true, src: vtep, dst: pods[0], pods: name})
		}
	}
	return probes, ""
}

// sendForward sends each probe's echo requests (3, id id) from a raw
// socket that writes their IP header, with the borrowed source.
func (s *state) sendForward(probes []fwdProbe, id uint16) error {
	return s.Do.Run(func() error {
		c, err := net.ListenPacket("ip4:icmp", "0.0.0.0")
		if err != nil {
			return fmt.Errorf("raw socket: %w", err)
		}
		defer c.Close()
		raw, err := ipv4.NewRawConn(c)
		if err != nil {
			return fmt.Errorf("raw socket: %w", err)
		}
		for _, p := range probes {
			for seq := range 3 {
				msg, _ := (&icmp.Message{Type: ipv4.ICMPTypeEcho, Body: &icmp.Echo{ID: int(id), Seq: seq, Data: []byte("weftdoc!")}}).Marshal(nil)
				h := &ipv4.Header{Version: 4, Len: ipv4.HeaderLen, TotalLen: ipv4.HeaderLen + len(msg), TTL: 64, Protocol: unix.IPPROTO_ICMP,
					Src: p.src.AsSlice(), Dst: p.dst.AsSlice()}
				if err := raw.WriteTo(h, msg, nil); err != nil {
					return fmt.Errorf("send to %s: %w", p.dst, err)
				}
			}
		}
		return nil
	})
}

// checkForward reports what the kernel did with each forward probe's
// reply: the rule or policy that dropped it, a failure; forwarded, ok,
// unless a rule it met tested its conntrack state or protocol, which
// pods' new connections do not share (a warning, with this node's
// suspects). Where no reply was forwarded, or none could be made, or one
// direction has no probe, the suspects are the answer.
func checkForward(s *state, it *inputTrace) {
	switch {
	case it == nil:
		s.forwardSuspects("no forwarded datagram traced (probes off, or a backend without a tunnel)")
		return
	case it.err != nil:
		s.forwardSuspects(fmt.Sprintf("cannot trace forwarded datagrams: %v", it.err))
		return
	}
	it.stop(s)
	rules := ruleTexts{s: s}
	out := false
	for _, p := range it.fwd {
		out = out || p.out
		evs := slices.DeleteFunc(slices.Clone(it.events), func(e traceEvent) bool { return e.src != p.dst || e.dst != p.src })
		drop, accepts := rules.decision(evs)
		ended := slices.ContainsFunc(evs, func(e traceEvent) bool { return strings.HasPrefix(e.table, traceTable) && e.chain == traceEnd })
		switch tests := s.replyTests(evs); {
		case drop != nil:
			fix := strings.Join(s.forwardFix(*drop, false), "; ")
			if drop.table == "filter" && drop.chain == "FORWARD" && drop.family != nftables.TableFamilyINet && drop.handle == 0 {
				fix = weftdForward + fix
			}
			s.r.add("firewall/forward", Fail, fix, "%s: the kernel dropped it in %s", p, rules.describe(*drop))
		case !ended && it.lost != nil:
			s.forwardSuspects(fmt.Sprintf("%s: some trace events were lost (%v)", p, it.lost))
		case !ended:
			s.forwardSuspects(p.String() + ": no reply was forwarded during the probes (the peer, the path, or a firewall the trace does not see)")
		case len(tests) > 0:
			s.forwardSuspects(fmt.Sprintf("%s: the kernel forwarded it, as the reply of a flow (%s test its conntrack state or protocol), so new connections between pods may meet another verdict", p, strings.Join(tests, "; ")))
		default:
			s.r.ok("firewall/forward", "%s: the kernel forwarded it: %s", p, strings.Join(accepts, "; "))
		}
	}
	switch {
	case it.fwdWhy != "":
		s.forwardSuspects("cannot make this node forward a datagram: " + it.fwdWhy)
	case !out:
		s.forwardSuspects("no pod on this node in its neighbour table to make it forward a datagram from its pods to the overlay")
	}
}

// replyTests names the rules (not weft's or doctor's) that matched a
// reply and test its conntrack state or status, its protocol or ports, or
// an xtables match, which doctor does not read.
func (s *state) replyTests(evs []traceEvent) []string {
	var out []string
	cache := map[string][]*nftables.Rule{}
	for _, e := range evs {
		if e.handle == 0 || weftTable(e.table) {
			continue
		}
		key := familyName(e.family) + " " + e.table + " chain " + e.chain
		rs, ok := cache[key]
		if !ok {
			_ = s.Do.Run(func() error {
				c, err := nftables.New()
				if err == nil {
					rs, err = c.GetRules(&nftables.Table{Name: e.table, Family: e.family}, &nftables.Chain{Name: e.chain})
				}
				return err
			})
			cache[key] = rs
		}
		i := slices.IndexFunc(rs, func(r *nftables.Rule) bool { return r.Handle == e.handle })
		if i >= 0 && slices.ContainsFunc(rs[i].Exprs, func(x expr.Any) bool {
			switch x := x.(type) {
			case *expr.Ct:
				return x.Key == expr.CtKeySTATE || x.Key == expr.CtKeySTATUS
			case *expr.Meta:
				return x.Key == expr.MetaKeyL4PROTO
			case *expr.Payload:
				return x.Base == expr.PayloadBaseTransportHeader || x.Base == expr.PayloadBaseNetworkHeader && x.Offset == 9
			case *expr.Match:
				return true
			}
			return false
		}) && !slices.Contains(out, fmt.Sprintf("table %s rule %d", key, e.handle)) {
			out = append(out, fmt.Sprintf("table %s rule %d", key, e.handle))
		}
	}
	return out
}

// forwardSuspects warns (why) with this node's suspects and the rules
// that would open them; ok when it has none.
func (s *state) forwardSuspects(why string) {
	var families []nftables.TableFamily
	if s.Config == nil || s.Config.Network.IsValid() {
		families = append(families, nftables.TableFamilyIPv4)
	}
	if s.Config == nil || s.Config.IPv6Network.IsValid() {
		families = append(families, nftables.TableFamilyIPv6)
	}
	found, fixes, err := s.suspects(nftables.ChainHookForward, nil, families, s.forwardFix)
	fix := "accept the cluster network ahead of the suspects' drops"
	switch {
	case len(found) == 0:
		s.r.ok("firewall/forward", "%s; no forward chain here drops by policy or by a rule without a condition, no iptables-legacy table is loaded", why)
		return
	case errors.Is(err, unix.EPERM):
		fix = "run weftctl doctor as root: it needs CAP_NET_ADMIN to read nftables and to ask the kernel"
	case len(fixes) > 0:
		fix = "if a suspect drops pods' traffic: " + strings.Join(fixes, "; ")
	}
	if slices.ContainsFunc(found, func(f string) bool {
		return strings.HasPrefix(f, "table ip filter chain FORWARD policy drop") || strings.HasPrefix(f, "table ip6 filter chain FORWARD policy drop")
	}) {
		fix = weftdForward + fix // iptables' FORWARD drops by its policy: weftd's chain can help
	}
	s.r.add("firewall/forward", Warn, fix, "%s; suspects only: %s", why, strings.Join(found, "; "))
}

// weftdForward is the advice for a drop by the policy of iptables'
// FORWARD, where weftd's own chain accepts the cluster network.
const weftdForward = "run weftd with --iptables-forward-rules (the default) and without EnableNFTables: its chain " + forward.Chain +
	" accepts the cluster network here; or "

// forwardFix is what accepts the cluster network (each family it has)
// ahead of e's drop: iptables' (ip6tables', iptables-legacy's) for
// iptables' FORWARD, nft's elsewhere.
func (s *state) forwardFix(e traceEvent, legacy bool) []string {
	if s.Config == nil {
		return nil
	}
	var out []string
	for _, f := range []struct {
		family  nftables.TableFamily
		network netip.Prefix
		ip, cmd string
	}{{nftables.TableFamilyIPv4, s.Config.Network, "ip", "iptables"}, {nftables.TableFamilyIPv6, s.Config.IPv6Network, "ip6", "ip6tables"}} {
		if !f.network.IsValid() || e.family != f.family && e.family != nftables.TableFamilyINet {
			continue
		}
		n := f.network.String()
		if e.table == "filter" && e.chain == "FORWARD" && e.family != nftables.TableFamilyINet {
			cmd := f.cmd + map[bool]string{true: "-legacy"}[legacy]
			out = append(out, fmt.Sprintf("%s -I FORWARD -s %s -j ACCEPT; %s -I FORWARD -d %s -j ACCEPT", cmd, n, cmd, n))
			continue
		}
		t := familyName(e.family) + " " + e.table + " " + e.chain
		out = append(out, fmt.Sprintf("nft insert rule %s %s saddr %s accept; nft insert rule %s %s daddr %s accept", t, f.ip, n, t, f.ip, n))
	}
	return out
}
