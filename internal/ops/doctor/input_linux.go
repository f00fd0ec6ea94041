package doctor

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/weft-net/weft/subnet"
)

// inputTrace is the nftables trace doctor runs around its probes: each
// probe makes the peer send its reply as a datagram to the tunnel port,
// and the kernel reports which chains, rules and verdicts it met.
type inputTrace struct {
	t            *tracer
	err          error // why the kernel could not be asked
	port4, port6 uint16
	what         string     // VXLAN or WireGuard
	fwd          []fwdProbe // see checkForward
	fwdWhy       string     // why there are none
	events       []traceEvent
	lost         error // see tracer.stop
	stopped      bool
}

// startInputTrace starts the trace before the probes; nil when the
// backend has no tunnel port or the probes are off.
func (s *state) startInputTrace() *inputTrace {
	if s.Config == nil || s.Probe.Skip {
		return nil
	}
	it := &inputTrace{what: "VXLAN"}
	b := s.Config.Backend
	switch b.Type {
	case subnet.BackendTypeVXLAN, subnet.BackendTypeUVXLAN:
		it.port4, it.port6 = uint16(b.Port), uint16(b.Port)
	case subnet.BackendTypeWireGuard:
		it.port4, it.port6, it.what = uint16(b.ListenPort), uint16(b.ListenPort), "WireGuard"
		if b.Mode == subnet.WireGuardSeparate {
			it.port6 = uint16(b.ListenPortV6)
		}
	default:
		return nil
	}
	if s.k == nil {
		it.err = errors.New("doctor found no overlay device to probe through, so no peer sends it a datagram")
		return it
	}
	p4, p6 := s.peerAddrs()
	sp := traceSpec{peers4: p4, peers6: p6, port4: it.port4, port6: it.port6, echoID: uint16(os.Getpid())}
	if it.fwd, it.fwdWhy = s.planForward(); len(it.fwd) > 0 {
		for _, p := range it.fwd {
			sp.replies = append(sp.replies, p.src) // an out probe's src is a peer's VTEP
		}
		slices.SortFunc(sp.replies, netip.Addr.Compare)
		sp.replies = slices.Compact(sp.replies)
	}
	if it.t, it.err = startTrace(s.Do, sp); it.err == nil && len(it.fwd) > 0 {
		if err := s.sendForward(it.fwd, sp.echoID); err != nil {
			it.fwd, it.fwdWhy = nil, err.Error()
		}
	}
	return it
}

// stop ends the trace, once, and keeps what it collected.
func (it *inputTrace) stop(s *state) {
	if it != nil && it.err == nil && !it.stopped {
		it.stopped = true
		it.events, it.lost = it.t.stop(s.Do)
	}
}

// checkInput reports, for each peer and each underlay family its probe
// replies arrived over, what the kernel did with them on this node: the
// rule (or a base chain's policy) that dropped them, a failure; or the
// chains that accepted them. A peer whose datagrams no chain saw was
// carried by uvxlan's fast path (tc takes them before netfilter) when its
// probe came back, and otherwise sent nothing here to judge. Where the
// kernel cannot say (it cannot be asked, nothing came, events were lost,
// or nftables accepted what loaded iptables-legacy tables may have
// dropped), the probes' answer stands, with this node's suspects.
func checkInput(s *state, it *inputTrace) {
	if it == nil {
		return
	}
	if it.err != nil {
		it.suspects(s, fmt.Sprintf("cannot trace the %s datagrams: %v", it.what, it.err))
		return
	}
	it.stop(s)
	legacy, note := legacyNames(s.legacyTables()), ""
	if legacy != "" {
		note = fmt.Sprintf("; iptables-legacy tables %s are loaded, which the trace does not see", legacy)
	}
	rules := ruleTexts{s: s}
	for _, p := range s.peers() {
		peer := fmt.Sprintf("peer %s (%s)", cmp.Or(p.Attrs.PublicIP, p.Attrs.PublicIPv6), p.Subnet)
		seen := false
		for _, a := range []netip.Addr{p.Attrs.PublicIP.Unmap(), p.Attrs.PublicIPv6} {
			evs := slices.DeleteFunc(slices.Clone(it.events), func(e traceEvent) bool { return !a.IsValid() || e.src != a })
			if len(evs) == 0 {
				continue
			}
			seen = true
			port := map[bool]uint16{false: it.port4, true: it.port6}[a.Is6()]
			what := fmt.Sprintf("UDP %d (%s) from %s over %s", port, it.what, peer, map[bool]string{false: "IPv4", true: "IPv6"}[a.Is6()])
			drop, accepts := rules.decision(evs)
			switch {
			case drop != nil:
				family := map[bool]nftables.TableFamily{false: nftables.TableFamilyIPv4, true: nftables.TableFamilyIPv6}[a.Is6()]
				s.r.add("firewall/input", Fail, acceptFix(*drop, family, []string{a.String()}, port, false), "%s: the kernel dropped it in %s%s", what, rules.describe(*drop), note)
			case it.lost != nil:
				it.suspects(s, fmt.Sprintf("%s: nftables accepted it, but some trace events were lost (%v)", what, it.lost))
			case legacy != "" && !s.reached(p):
				it.suspects(s, what+": nftables accepted it, but its probe did not come back and iptables-legacy tables "+legacy+" are loaded")
			default:
				s.r.ok("firewall/input", "%s: the kernel accepted it: %s%s", what, strings.Join(accepts, "; "), note)
			}
		}
		if !seen {
			it.untraced(s, p, peer, note)
		}
	}
}

// peerAddrs are the peers' public addresses, IPv4 and IPv6.
func (s *state) peerAddrs() (v4, v6 []netip.Addr) {
	for _, l := range s.peers() {
		if a := l.Attrs.PublicIP.Unmap(); a.Is4() && !a.IsUnspecified() {
			v4 = append(v4, a)
		}
		if a := l.Attrs.PublicIPv6; a.Is6() && !a.IsUnspecified() {
			v6 = append(v6, a)
		}
	}
	return v4, v6
}

// reached reports whether the probe of peer p came back.
func (s *state) reached(p subnet.Lease) bool {
	return slices.ContainsFunc(s.probes, func(r probeResult) bool { return r.peer.Key() == p.Key() && r.small.Received > 0 })
}

// untraced reports a peer none of whose datagrams met a chain: carried
// by the fast path when its probe came back, else nothing for the kernel
// to judge (the peer's own firewall may drop this node's probes), and
// this node's suspects are listed.
func (it *inputTrace) untraced(s *state, p subnet.Lease, peer, note string) {
	fp, _ := s.fastPath()
	switch reached := s.reached(p); {
	case reached && fp.Ingress:
		s.r.ok("firewall/input", "%s datagrams of %s: uvxlan's fast path takes them on the underlay's ingress before netfilter, so no chain saw them (see firewall/fastpath)%s", it.what, peer, note)
	case reached:
		s.r.add("firewall/input", Warn, "run weftctl doctor again: the trace may have lost its events on a busy node", "%s datagrams of %s: its probe came back, but the kernel traced none of its datagrams to this node%s", it.what, peer, note)
	default:
		it.suspects(s, fmt.Sprintf("none of %s's %s datagrams arrived during the probes (its side, the path, or its firewall dropping this node's probes)", peer, it.what))
	}
}

// suspects is firewall/input's answer where the kernel cannot say why:
// the probes' answer, and this node's suspects with the accepts of the
// peers' datagrams that would open them.
func (it *inputTrace) suspects(s *state, why string) {
	var answers []string
	for _, r := range s.probes {
		answers = append(answers, fmt.Sprintf("%s %s", cmp.Or(r.peer.Attrs.PublicIP, r.peer.Attrs.PublicIPv6), map[bool]string{true: "answered", false: "did not answer"}[r.small.Received > 0]))
	}
	if len(answers) == 0 {
		answers = []string{"nothing (no probe ran)"}
	}
	var peers4, peers6 []string
	p4, p6 := s.peerAddrs()
	for _, a := range p4 {
		peers4 = append(peers4, a.String())
	}
	for _, a := range p6 {
		peers6 = append(peers6, a.String())
	}
	var ports []uint16
	var families []nftables.TableFamily
	if len(peers4) > 0 {
		ports, families = append(ports, it.port4), append(families, nftables.TableFamilyIPv4)
	}
	if len(peers6) > 0 {
		ports, families = append(ports, it.port6), append(families, nftables.TableFamilyIPv6)
	}
	found, fixes, err := s.suspects(nftables.ChainHookInput, ports, families, func(e traceEvent, legacy bool) []string {
		var out []string
		for _, f := range []struct {
			family nftables.TableFamily
			src    []string
			port   uint16
		}{{nftables.TableFamilyIPv4, peers4, it.port4}, {nftables.TableFamilyIPv6, peers6, it.port6}} {
			if len(f.src) > 0 && (e.family == f.family || e.family == nftables.TableFamilyINet) {
				out = append(out, acceptFix(e, f.family, f.src, f.port, legacy))
			}
		}
		return out
	})
	fix := "run weftctl doctor on the peers too: the kernel names the rule on the node whose chains drop the datagrams"
	switch {
	case errors.Is(err, unix.EPERM):
		fix = "run weftctl doctor as root: it needs CAP_NET_ADMIN to read nftables and to ask the kernel"
	case len(fixes) > 0:
		fix = "if a suspect drops them: " + strings.Join(fixes, "; ")
	case len(found) > 0:
		fix = fmt.Sprintf("accept UDP %d from the peers' addresses ahead of the suspects' drops", it.port4)
		if len(ports) > 0 {
			fix = fmt.Sprintf("accept UDP %s from the peers' addresses ahead of the suspects' drops", strings.Trim(strings.Join(strings.Fields(fmt.Sprint(slices.Compact(ports))), " and "), "[]"))
		}
	default:
		found = []string{"none on this node"}
	}
	s.r.add("firewall/input", Warn, fix, "%s: the probes say %s; suspects only: %s", why, strings.Join(answers, ", "), strings.Join(found, "; "))
}

// acceptFix is the rule that accepts UDP port from the addresses src of
// family ahead of e's drop (before its rule, or first in its chain):
// iptables' (ip6tables', iptables-legacy's) for iptables' INPUT, nft's
// elsewhere.
func acceptFix(e traceEvent, family nftables.TableFamily, src []string, port uint16, legacy bool) string {
	ip, cmd := "ip", "iptables"
	if family == nftables.TableFamilyIPv6 {
		ip, cmd = "ip6", "ip6tables"
	}
	if legacy {
		cmd += "-legacy"
	}
	if e.table == "filter" && e.chain == "INPUT" && e.family != nftables.TableFamilyINet {
		return fmt.Sprintf("%s -I INPUT -s %s -p udp --dport %d -j ACCEPT", cmd, strings.Join(src, ","), port)
	}
	where := ""
	if e.handle != 0 {
		where = fmt.Sprintf(" position %d", e.handle)
	}
	set := src[0]
	if len(src) > 1 {
		set = "{ " + strings.Join(src, ", ") + " }"
	}
	return fmt.Sprintf("nft insert rule %s %s %s%s %s saddr %s udp dport %d accept", familyName(e.family), e.table, e.chain, where, ip, set, port)
}
