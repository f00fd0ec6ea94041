package doctor

import (
	"context"
	"net"
	"net/netip"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weft-net/weft/internal/ops/connectivity"
	"github.com/weft-net/weft/internal/ops/inspect"
	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/subnet"
)

// firewalld is the input part of firewalld's nftables ruleset: zones by
// interface (zone) and by source (source, before them), the public
// zone's allow chain holding allow.
func firewalld(zone, source, allow string) string {
	return `table inet firewalld {
	chain filter_INPUT {
		type filter hook input priority filter + 10; policy accept;
		ct state established,related accept
		iifname "lo" accept
		jump filter_INPUT_ZONES
		ct state invalid drop
		reject with icmpx admin-prohibited
	}
	chain filter_INPUT_ZONES {
		` + source + `
		` + zone + `
		goto filter_IN_drop
	}
	chain filter_IN_drop {
		drop
	}
	chain filter_IN_trusted {
		accept
	}
	chain filter_IN_public {
		jump filter_IN_public_allow
		meta l4proto { icmp, ipv6-icmp } accept
	}
	chain filter_IN_public_allow {
		tcp dport 22 accept
		` + allow + `
	}
}`
}

// ufw is what ufw loads through iptables-nft (its before-input chain and
// its user chain, where `ufw allow` puts the port), policy DROP.
func ufw(allow string) string {
	return `*filter
:INPUT DROP [0:0]
:ufw-before-input - [0:0]
:ufw-user-input - [0:0]
-A INPUT -j ufw-before-input
-A ufw-before-input -i lo -j ACCEPT
-A ufw-before-input -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A ufw-before-input -m conntrack --ctstate INVALID -j DROP
-A ufw-before-input -p icmp --icmp-type echo-request -j ACCEPT
-A ufw-before-input -j ufw-user-input
` + allow + `COMMIT
`
}

// rhel is RHEL's iptables-nft default: state NEW accepts per port, then
// REJECT.
func rhel(allow string) string {
	return `*filter
:INPUT ACCEPT [0:0]
-A INPUT -m state --state RELATED,ESTABLISHED -j ACCEPT
-A INPUT -p icmp -j ACCEPT
-A INPUT -i lo -j ACCEPT
-A INPUT -p tcp -m state --state NEW -m tcp --dport 22 -j ACCEPT
` + allow + `-A INPUT -j REJECT --reject-with icmp-host-prohibited
COMMIT
`
}

// nixos is NixOS's firewall: a ct state verdict map jumping to its allow
// chain for new flows, policy drop.
func nixos(ports string) string {
	return `table inet nixos-fw {
	chain input-allow {
		tcp dport 22 accept
		udp dport { ` + ports + ` } accept
	}
	chain input {
		type filter hook input priority filter; policy drop;
		iifname "lo" accept
		ct state vmap { invalid : drop, established : accept, related : accept, new : jump input-allow, untracked : jump input-allow }
	}
}`
}

// TestInputTrace sends real UDP datagrams from two peers (192.168.77.2
// and .3, or fd77::2 and ::3) to port 8472 (51820 for WireGuard) of a node whose input
// firewall is one of the common shapes, and checks that firewall/input,
// from the kernel's trace, fails exactly for the peers whose datagrams did
// not arrive at a socket on the port, and names the chain that decided;
// when iptables-legacy's rules, which the trace does not see, drop them,
// it warns and never says ok.
func TestInputTrace(t *testing.T) {
	const peer2, peer3 = "192.168.77.2", "192.168.77.3"
	for _, tt := range []struct {
		name         string
		nft, ipt     string // ruleset loaded with nft -f, with iptables-nft-restore
		legacy       string // ruleset loaded with iptables-legacy-restore, which the trace does not see
		v6           bool   // the underlay is IPv6 (fd77::/64)
		want2, want3 string // in the evidence for peer .2 and peer .3
	}{
		{"no firewall", "", "", "", false, "no chain but doctor's own trace chain met it", ""},
		{"plain nft drop", "table inet f { chain in { type filter hook input priority 0; udp dport 8472 counter drop\n}\n}", "", "", false,
			`dropped it in table inet f chain in by rule handle \d+ \(udp dport 8472 counter packets \d+ bytes \d+ drop\)`, ""},
		{"policy drop, accept by the underlay interface", "table inet f { chain in { type filter hook input priority 0; policy drop; iifname \"eth0\" udp dport 8472 accept\n}\n}", "", "", false,
			`accepted it: table inet f chain in by rule handle \d+ \(iifname "eth0" udp dport 8472 accept\)`, ""},
		{"policy drop, accept by another interface", "table inet f { chain in { type filter hook input priority 0; policy drop; iifname \"eth1\" udp dport 8472 accept\n}\n}", "", "", false,
			`dropped it in table inet f chain in by its policy drop`, ""},
		{"accept by source leaves a peer out", "table inet f { chain in { type filter hook input priority 0; ip saddr " + peer2 + " udp dport 8472 accept\nudp dport 8472 drop\n}\n}", "", "", false,
			`accepted it: table inet f chain in by rule handle`, `dropped it in table inet f chain in by rule handle \d+ \(udp dport 8472 drop\)`},
		{"firewalld, port open in the interface's zone", firewalld(`iifname "eth0" goto filter_IN_public`, "", "udp dport 8472 ct state new,untracked accept"), "", "", false,
			`accepted it: table inet firewalld chain filter_IN_public_allow by rule handle`, ""},
		{"firewalld, port closed", firewalld(`iifname "eth0" goto filter_IN_public`, "", ""), "", "", false,
			`dropped it in table inet firewalld chain filter_INPUT by rule handle \d+ \(reject with icmpx admin-prohibited\)`, ""},
		{"firewalld, port open in another interface's zone", firewalld(`iifname "eth1" goto filter_IN_public`, "", "udp dport 8472 ct state new,untracked accept"), "", "", false,
			`dropped it in table inet firewalld chain filter_IN_drop by rule handle`, ""},
		{"firewalld, one peer in the trusted zone by source", firewalld("", "ip saddr "+peer2+" goto filter_IN_trusted", ""), "", "", false,
			`accepted it: table inet firewalld chain filter_IN_trusted`, `dropped it in table inet firewalld chain filter_IN_drop`},
		{"ufw, port allowed", "", ufw("-A ufw-user-input -p udp --dport 8472 -j ACCEPT\n"), "", false, `accepted it: table ip filter chain ufw-user-input by rule handle`, ""},
		{"ufw, port not allowed", "", ufw(""), "", false, `dropped it in table ip filter chain INPUT by its policy drop`, ""},
		{"RHEL, port accepted for state NEW", "", rhel("-A INPUT -p udp -m state --state NEW -m udp --dport 8472 -j ACCEPT\n"), "", false, `accepted it: table ip filter chain INPUT by rule handle`, ""},
		{"RHEL, port not accepted", "", rhel(""), "", false, `dropped it in table ip filter chain INPUT by rule handle \d+`, ""},
		{"NixOS, port allowed", nixos("8472, 8080"), "", "", false, `accepted it: table inet nixos-fw chain input-allow by rule handle`, ""},
		{"NixOS, port not allowed", nixos("8080"), "", "", false, `dropped it in table inet nixos-fw chain input by its policy drop`, ""},
		{"iptables-legacy drops the port: the kernel's trace cannot say", "", "", "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -p udp --dport 8472 -j DROP\nCOMMIT\n", false,
			`nftables accepted it, but its probe did not come back and iptables-legacy tables filter are loaded: .* suspects only: iptables-legacy tables filter`, ""},
		{"WireGuard, policy drop, accept by the underlay interface", "table inet f { chain in { type filter hook input priority 0; policy drop; iifname \"eth0\" udp dport 51820 accept\n}\n}", "", "", false,
			`^UDP 51820 \(WireGuard\) from peer .*: the kernel accepted it: table inet f chain in by rule handle \d+ \(iifname "eth0" udp dport 51820 accept\)`, ""},
		{"WireGuard, policy drop, accept by another interface", "table inet f { chain in { type filter hook input priority 0; policy drop; iifname \"eth1\" udp dport 51820 accept\n}\n}", "", "", false,
			`^UDP 51820 \(WireGuard\) from peer .*: the kernel dropped it in table inet f chain in by its policy drop`, ""},
		{"IPv6 underlay, ip6 drop", "table ip6 f { chain in { type filter hook input priority 0; udp dport 8472 drop\n}\n}", "", "", true,
			`over IPv6: the kernel dropped it in table ip6 f chain in`, ""},
		{"IPv6 underlay, an ip table's drop does not hold", "table ip f { chain in { type filter hook input priority 0; udp dport 8472 drop\n}\n}", "", "", true,
			`over IPv6: the kernel accepted it`, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			prefix := netip.MustParsePrefix("192.168.77.0/24")
			if tt.v6 {
				prefix = netip.MustParsePrefix("fd77::/64")
			}
			u := nettest.NewUnderlay(t, prefix, 0)
			node, p2, p3 := u.AddHost(t, "dnode", "eth0"), u.AddHost(t, "dpeer2", "eth0"), u.AddHost(t, "dpeer3", "eth0")
			load(t, node.NS, "nft", tt.nft)
			load(t, node.NS, "iptables-nft-restore", tt.ipt)
			load(t, node.NS, "iptables-legacy-restore", tt.legacy)
			leases := make([]subnet.Lease, 3)
			for i, h := range []*nettest.Host{node, p2, p3} {
				leases[i].Subnet = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i + 1), 0}), 24)
				if tt.v6 {
					leases[i].Attrs.PublicIPv6 = h.Addr
				} else {
					leases[i].Attrs.PublicIP = h.Addr
				}
			}
			// The firewall sees WireGuard's datagrams as it sees VXLAN's:
			// UDP to the backend's port.
			backend, port := subnet.BackendConfig{Type: subnet.BackendTypeVXLAN, Port: 8472}, 8472
			if strings.HasPrefix(tt.name, "WireGuard") {
				backend, port = subnet.BackendConfig{Type: subnet.BackendTypeWireGuard, ListenPort: 51820}, 51820
			}
			s := &state{Node: Node{Do: connectivity.Do(node.Do), Leases: leases, Config: &subnet.Config{Backend: backend}},
				r: &Report{}, self: &leases[0], fp: &fastPathRead{}, k: &inspect.Kernel{}}
			it := s.startInputTrace()
			if it.err != nil {
				t.Fatal(it.err)
			}
			arrived := sendDatagrams(t, node, port, p2, p3)
			checkInput(s, it)
			for i, h := range []*nettest.Host{p2, p3} {
				want := []string{tt.want2, tt.want3}[i]
				c := peerCheck(t, s.r, h.Addr)
				st := map[bool]Status{true: OK, false: Fail}[arrived[h.Addr]]
				if tt.legacy != "" && !arrived[h.Addr] {
					st = Warn // what nftables accepted, iptables-legacy may drop
				}
				if c.Status != st {
					t.Errorf("peer %s: datagram arrived %v, but doctor says %s: %s", h.Addr, arrived[h.Addr], c.Status, c.Evidence)
				}
				if want != "" && !regexp.MustCompile(want).MatchString(c.Evidence) {
					t.Errorf("peer %s: %q does not match %q", h.Addr, c.Evidence, want)
				}
			}
			if tables := nettest.MustRun(t, node.NS, "nft", "list", "tables"); strings.Contains(tables, traceTable) {
				t.Errorf("trace table left behind:\n%s", tables)
			}
		})
	}
}

// load loads a ruleset into n with cmd (nft -f - or iptables-nft-restore).
func load(t *testing.T, n *nettest.NS, cmd, ruleset string) {
	t.Helper()
	if ruleset == "" {
		return
	}
	args := map[string][]string{"nft": {"nft", "-f", "-"}, "iptables-nft-restore": {"iptables-nft-restore"}, "ip6tables-nft-restore": {"ip6tables-nft-restore"},
		"iptables-legacy-restore": {"iptables-legacy-restore"}}[cmd]
	c := n.Command(context.Background(), args...)
	c.Stdin = strings.NewReader(ruleset)
	if out, err := c.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", cmd, err, out)
	}
}

// sendDatagrams sends 30 UDP datagrams from each peer, one after the
// other, to port on node (more than the trace's limit: each peer has its
// own) and returns the peers whose datagrams arrived at a socket there.
func sendDatagrams(t *testing.T, node *nettest.Host, port int, peers ...*nettest.Host) map[netip.Addr]bool {
	t.Helper()
	var ln *net.UDPConn
	if err := node.Do(func() (err error) {
		ln, err = net.ListenUDP("udp", &net.UDPAddr{Port: port})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	for _, p := range peers {
		for range 30 {
			if err := p.Do(func() error {
				c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(node.Addr, uint16(port))))
				if err != nil {
					return err
				}
				defer c.Close()
				_, err = c.Write([]byte("weft doctor test"))
				return err
			}); err != nil {
				t.Fatal(err)
			}
		}
	}
	arrived := map[netip.Addr]bool{}
	buf := make([]byte, 64)
	for len(arrived) < len(peers) {
		// Waiting, not asserting: a dropped datagram never comes.
		_ = ln.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, from, err := ln.ReadFromUDPAddrPort(buf)
		if err != nil {
			break
		}
		arrived[from.Addr().Unmap()] = true
	}
	return arrived
}

// peerCheck is the one firewall/input check about the peer at addr.
func peerCheck(t *testing.T, r *Report, addr netip.Addr) Check {
	t.Helper()
	var found []Check
	for _, c := range r.Find("firewall/input") {
		if strings.Contains(c.Evidence, "from peer "+addr.String()+" ") || strings.Contains(c.Evidence, " of peer "+addr.String()+" ") {
			found = append(found, c)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want one firewall/input check for peer %s, got %+v", addr, r.Checks)
	}
	return found[0]
}

// TestInputSuspects: where the kernel cannot say, firewall/input warns
// with the probes' answer, never fails. Without CAP_NET_ADMIN doctor
// cannot trace (nor read nftables), and says to run it as root; where
// doctor finds no overlay device to probe through, no peer sends it
// anything to trace; when no datagram of a peer arrived (the peer's own
// firewall may drop this node's probes), it names this node's input chains
// with policy drop or a drop rule and the rules on the port as suspects,
// with the accepts that would open them.
func TestInputSuspects(t *testing.T) {
	ns := nettest.NewNS(t, "dsusp")
	load(t, ns, "nft", "table inet f { chain in { type filter hook input priority 0; udp dport 8472 drop\n}\n}")
	load(t, ns, "iptables-nft-restore", "*filter\n:INPUT DROP [0:0]\nCOMMIT\n")
	leases := []subnet.Lease{{Subnet: netip.MustParsePrefix("10.244.1.0/24")}, {Subnet: netip.MustParsePrefix("10.244.2.0/24")}}
	leases[0].Attrs.PublicIP, leases[1].Attrs.PublicIP = netip.MustParseAddr("192.168.77.1"), netip.MustParseAddr("192.168.77.2")
	// noAdmin runs f in ns on a thread without CAP_NET_ADMIN in its
	// effective set (capabilities are per thread), as an unprivileged
	// doctor would.
	noAdmin := func(f func() error) error {
		return ns.Do(func() error {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
			var caps, saved [2]unix.CapUserData
			if err := unix.Capget(&hdr, &caps[0]); err != nil {
				return err
			}
			saved = caps
			caps[0].Effective &^= 1 << unix.CAP_NET_ADMIN
			if err := unix.Capset(&hdr, &caps[0]); err != nil {
				return err
			}
			defer func() {
				if err := unix.Capset(&hdr, &saved[0]); err != nil {
					panic(err) // never leave a thread of the test process without it
				}
			}()
			return f()
		})
	}
	vxlan := subnet.BackendConfig{Type: subnet.BackendTypeVXLAN, Port: 8472}
	for _, tt := range []struct {
		name     string
		do       connectivity.Do
		backend  subnet.BackendConfig
		evidence []string
		fix      string
	}{
		{"no CAP_NET_ADMIN", noAdmin, vxlan, []string{`^cannot trace the VXLAN datagrams: .*operation not permitted: the probes say 192.168.77.2 did not answer; suspects only: \(nftables unreadable`}, "^run weftctl doctor as root"},
		{"WireGuard: no overlay device to probe through", connectivity.Do(ns.Do), subnet.BackendConfig{Type: subnet.BackendTypeWireGuard, ListenPort: 8472},
			[]string{`^cannot trace the WireGuard datagrams: doctor found no overlay device to probe through, so no peer sends it a datagram: .*suspects only: .*table ip filter chain INPUT policy drop`}, ""},
		{"no datagram arrived", connectivity.Do(ns.Do), vxlan, []string{`^none of peer 192.168.77.2 \(10.244.2.0/24\)'s VXLAN datagrams arrived during the probes .*: the probes say 192.168.77.2 did not answer; suspects only: `,
			`table ip filter chain INPUT policy drop`, `table inet f chain in rule handle \d+ on UDP 8472`},
			`^if a suspect drops them: (iptables -I INPUT -s 192.168.77.2 -p udp --dport 8472 -j ACCEPT|nft insert rule inet f in position \d+ ip saddr 192.168.77.2 udp dport 8472 accept); (iptables -I INPUT -s 192.168.77.2 -p udp --dport 8472 -j ACCEPT|nft insert rule inet f in position \d+ ip saddr 192.168.77.2 udp dport 8472 accept)$`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := &state{Node: Node{Do: tt.do, Leases: leases, Config: &subnet.Config{Backend: tt.backend}},
				r: &Report{}, self: &leases[0], fp: &fastPathRead{}, probes: []probeResult{{peer: leases[1]}}}
			if tt.backend.Type == subnet.BackendTypeVXLAN {
				s.k = &inspect.Kernel{} // a device to probe through
			}
			checkInput(s, s.startInputTrace())
			c := s.r.Find("firewall/input")
			if len(c) != 1 || c[0].Status != Warn || strings.HasSuffix(c[0].Fix, ": ") || tt.fix != "" && !regexp.MustCompile(tt.fix).MatchString(c[0].Fix) {
				t.Fatalf("got %+v, want one warning with fix %q", c, tt.fix)
			}
			for _, re := range tt.evidence {
				if !regexp.MustCompile(re).MatchString(c[0].Evidence) {
					t.Errorf("evidence %q does not match %q", c[0].Evidence, re)
				}
			}
		})
	}
}

// TestSuspectFixesRun: the accepts doctor offers for its suspects are
// commands that nft, iptables and ip6tables take, each family's peers with
// that family's port: for three peers of both families on WireGuard's two
// ports (separate mode) through input chains of every family, and for both
// cluster networks through forward chains.
func TestSuspectFixesRun(t *testing.T) {
	ns := nettest.NewNS(t, "dfixes")
	load(t, ns, "nft", "table inet f { chain in { type filter hook input priority 0; policy drop; ct state invalid drop\nudp dport 51821 drop\n}\n"+
		"chain fw { type filter hook forward priority 0; ct state established accept\nreject\n}\n}\n"+
		"table ip6 g { chain in { type filter hook input priority 0; policy drop; }\nchain fw { type filter hook forward priority 0; policy drop; }\n}")
	load(t, ns, "iptables-nft-restore", "*filter\n:INPUT DROP [0:0]\nCOMMIT\n")
	load(t, ns, "ip6tables-nft-restore", "*filter\n:INPUT DROP [0:0]\nCOMMIT\n")
	var leases []subnet.Lease
	for i := range byte(4) {
		l := subnet.Lease{Subnet: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, i + 1, 0}), 24)}
		l.Attrs.PublicIP, l.Attrs.PublicIPv6 = netip.AddrFrom4([4]byte{192, 168, 77, i + 1}), netip.AddrFrom16([16]byte{0: 0xfd, 1: 0x77, 15: i + 1})
		leases = append(leases, l)
	}
	wg := subnet.BackendConfig{Type: subnet.BackendTypeWireGuard, Mode: subnet.WireGuardSeparate, ListenPort: 51820, ListenPortV6: 51821}
	s := &state{Node: Node{Do: connectivity.Do(ns.Do), Leases: leases, Config: &subnet.Config{Backend: wg,
		Network: netip.MustParsePrefix("10.244.0.0/16"), IPv6Network: netip.MustParsePrefix("fd00:10:244::/56")}},
		r: &Report{}, self: &leases[0], fp: &fastPathRead{}}
	checkInput(s, s.startInputTrace()) // no overlay device: the suspects answer
	s.forwardSuspects("test")
	v4, v6 := "{ 192.168.77.2, 192.168.77.3, 192.168.77.4 }", "{ fd77::2, fd77::3, fd77::4 }"
	for name, want := range map[string][]string{
		"firewall/input": {"nft insert rule inet f in ip saddr " + v4 + " udp dport 51820 accept", "nft insert rule inet f in ip6 saddr " + v6 + " udp dport 51821 accept",
			"nft insert rule ip6 g in ip6 saddr " + v6 + " udp dport 51821 accept",
			"iptables -I INPUT -s 192.168.77.2,192.168.77.3,192.168.77.4 -p udp --dport 51820 -j ACCEPT", "ip6tables -I INPUT -s fd77::2,fd77::3,fd77::4 -p udp --dport 51821 -j ACCEPT"},
		"firewall/forward": {"nft insert rule inet f fw ip saddr 10.244.0.0/16 accept", "nft insert rule inet f fw ip daddr 10.244.0.0/16 accept",
			"nft insert rule inet f fw ip6 saddr fd00:10:244::/56 accept", "nft insert rule inet f fw ip6 daddr fd00:10:244::/56 accept",
			"nft insert rule ip6 g fw ip6 saddr fd00:10:244::/56 accept", "nft insert rule ip6 g fw ip6 daddr fd00:10:244::/56 accept"},
	} {
		c := s.r.Find(name)
		if len(c) != 1 || c[0].Status != Warn {
			t.Fatalf("%s: %+v, want one warning", name, c)
		}
		fixes, ok := strings.CutPrefix(c[0].Fix, map[string]string{"firewall/input": "if a suspect drops them: ", "firewall/forward": "if a suspect drops pods' traffic: "}[name])
		got := strings.Split(fixes, "; ")
		slices.Sort(got)
		slices.Sort(want)
		if !ok || !slices.Equal(got, want) {
			t.Errorf("%s: fix %q, want the commands %q", name, c[0].Fix, want)
			continue
		}
		for _, cmd := range got {
			nettest.MustRun(t, ns, "sh", "-c", cmd)
		}
	}
}

// TestSuspectShapes: the chains doctor names as suspects where the kernel
// cannot say are those that drop all they see by policy or by a rule with
// no condition, also behind jumps, in a family the traffic has; a chain
// that only drops what a condition selects, weft's own tables, WEFT-FWD's
// accept before a policy drop and chains of a family the cluster does not
// use are not.
func TestSuspectShapes(t *testing.T) {
	nixos := "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:nixos-fw - [0:0]\n:nixos-fw-log-refuse - [0:0]\n:nixos-fw-refuse - [0:0]\n" +
		"-A INPUT -j nixos-fw\n-A FORWARD -j nixos-fw\n-A nixos-fw -i lo -j ACCEPT\n-A nixos-fw -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT\n" +
		"-A nixos-fw -j nixos-fw-log-refuse\n-A nixos-fw-log-refuse -p tcp --syn -j LOG\n-A nixos-fw-log-refuse -j nixos-fw-refuse\n-A nixos-fw-refuse -j DROP\nCOMMIT\n"
	kube := "*filter\n:FORWARD DROP [0:0]\n:KUBE-FORWARD - [0:0]\n:WEFT-FWD - [0:0]\n-A FORWARD -j KUBE-FORWARD\n-A FORWARD -j WEFT-FWD\n" +
		"-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP\n-A KUBE-FORWARD -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n" +
		"-A WEFT-FWD -s 10.244.0.0/16 -j ACCEPT\n-A WEFT-FWD -d 10.244.0.0/16 -j ACCEPT\nCOMMIT\n"
	ipt := func(rules string) string {
		return "*filter\n:INPUT ACCEPT [0:0]\n:X - [0:0]\n" + rules + "COMMIT\n"
	}
	for _, tt := range []struct {
		name, nft, ipt, ip6t string
		input, forward       string // a suspect in the evidence of firewall/input (a warning either way) or firewall/forward; "" for none
		forwardFix           string // in firewall/forward's fix
	}{
		{"RHEL's final REJECT", "", rhel("-A FORWARD -j REJECT\n"), "", `suspects only: table ip filter chain INPUT rule handle \d+ rejects$`,
			`suspects only: table ip filter chain FORWARD rule handle \d+ rejects$`, `^if a suspect drops pods' traffic: iptables -I FORWARD`},
		{"Docker's FORWARD DROP without WEFT-FWD", "", "*filter\n:FORWARD DROP [0:0]\nCOMMIT\n", "", "", `suspects only: table ip filter chain FORWARD policy drop$`,
			`^run weftd with --iptables-forward-rules .*; or if a suspect drops pods' traffic: iptables -I FORWARD`},
		{"a comment's jump to a drop", "", ipt("-A INPUT -m comment --comment c -j X\n-A X -j DROP\n"), "", `suspects only: table ip filter chain INPUT rule handle \d+ of chain X drops$`, "", ""},
		{"a goto does not come back", "", ipt("-A INPUT -g X\n-A INPUT -j DROP\n"), "", "", "", ""},
		{"a return comes back", "", ipt("-A INPUT -j X\n-A X -j RETURN\n-A X -j DROP\n"), "", "", "", ""},
		{"an accept before a policy drop", "", "*filter\n:INPUT DROP [0:0]\n-A INPUT -j ACCEPT\nCOMMIT\n", "", "", "", ""},
		{"a log is no reject", "", ipt("-A INPUT -j LOG\n"), "", "", "", ""},
		{"NixOS's refuse chain behind jumps", "", nixos, "", `suspects only: table ip filter chain INPUT rule handle \d+ of chain nixos-fw-refuse drops$`,
			`suspects only: table ip filter chain FORWARD rule handle \d+ of chain nixos-fw-refuse drops$`, ""},
		{"firewalld's reject", firewalld(`iifname "eth0" goto filter_IN_public`, "", ""), "", "", `suspects only: table inet firewalld chain filter_INPUT rule handle \d+ of chain filter_IN_drop drops$`, "", ""},
		{"kube-proxy and WEFT-FWD before a policy drop", "", kube, "", "", "", ""},
		{"only conditional drops", "table inet f { chain in { type filter hook input priority 0; ct state invalid drop\n}\nchain fw { type filter hook forward priority 0; ct state invalid drop\n}\n}", "", "", "", "", ""},
		{"weft's own policy table", "table inet weft-policy { chain forward { type filter hook forward priority 0; policy drop; drop\n}\n}", "", "", "", "", ""},
		{"an IPv6 table on an IPv4 cluster", "", "", "*filter\n:INPUT DROP [0:0]\n:FORWARD DROP [0:0]\n-A INPUT -p udp --dport 8472 -j DROP\nCOMMIT\n", "", "", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ns := nettest.NewNS(t, "dshape")
			load(t, ns, "nft", tt.nft)
			load(t, ns, "iptables-nft-restore", tt.ipt)
			load(t, ns, "ip6tables-nft-restore", tt.ip6t)
			leases := []subnet.Lease{{Subnet: netip.MustParsePrefix("10.244.1.0/24")}, {Subnet: netip.MustParsePrefix("10.244.2.0/24")}}
			leases[0].Attrs.PublicIP, leases[1].Attrs.PublicIP = netip.MustParseAddr("192.168.77.1"), netip.MustParseAddr("192.168.77.2")
			s := &state{Node: Node{Do: connectivity.Do(ns.Do), Leases: leases, Config: &subnet.Config{Network: netip.MustParsePrefix("10.244.0.0/16"),
				Backend: subnet.BackendConfig{Type: subnet.BackendTypeVXLAN, Port: 8472}}}, r: &Report{}, self: &leases[0], fp: &fastPathRead{}}
			(&inputTrace{port4: 8472, port6: 8472, what: "VXLAN"}).suspects(s, "test")
			s.forwardSuspects("test")
			for name, want := range map[string]string{"firewall/input": tt.input, "firewall/forward": tt.forward} {
				c := s.r.Find(name)
				switch {
				case len(c) != 1:
					t.Fatalf("%s: %+v", name, c)
				case want == "" && !strings.HasSuffix(c[0].Evidence, "none on this node") && c[0].Status != OK:
					t.Errorf("%s: %s %q, want no suspect", name, c[0].Status, c[0].Evidence)
				case want != "" && (c[0].Status != Warn || !regexp.MustCompile(want).MatchString(c[0].Evidence)):
					t.Errorf("%s: %s %q, want a warning matching %q", name, c[0].Status, c[0].Evidence, want)
				case name == "firewall/forward" && tt.forwardFix != "" && !regexp.MustCompile(tt.forwardFix).MatchString(c[0].Fix):
					t.Errorf("%s: fix %q, want %q", name, c[0].Fix, tt.forwardFix)
				}
			}
		})
	}
}
