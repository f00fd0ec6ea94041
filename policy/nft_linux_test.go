package policy

import (
	"net/netip"
	"regexp"
	"strings"
	"testing"

	"github.com/weft-net/weft/internal/testkit/nettest"
)

func ip(s string) netip.Addr { return netip.MustParseAddr(s) }

// TestProgramLists programs a plan in a test namespace and reads it back
// with nft(8): the sets hold the plan's addresses, ranges and ports; with
// bridge ports the bridge table comes too; Remove removes both.
func TestProgramLists(t *testing.T) {
	ns := nettest.NewNS(t, "npnft")
	plan := Plan{
		IngressIsolated: []netip.Addr{ip("10.244.1.2"), ip("10.244.1.3")},
		EgressIsolated:  []netip.Addr{ip("10.244.1.3")},
		Rules: []Rule{
			{Name: "a/p ingress 0", Local: []netip.Addr{ip("10.244.1.2")},
				Peers: []Range{{ip("10.0.0.0"), ip("10.255.255.255")}, {ip("192.168.1.7"), ip("192.168.1.7")}},
				Ports: []PortEntry{{Range{ip("10.244.1.2"), ip("10.244.1.2")}, protoTCP, 80, 80}, {Range{ip("10.244.1.2"), ip("10.244.1.2")}, protoUDP, 5000, 5010}}},
			{Name: "a/p ingress 1", Local: []netip.Addr{ip("10.244.1.3")}, AnyPeer: true, AllPorts: true},
			{Name: "a/q egress 0", Egress: true, Local: []netip.Addr{ip("10.244.1.3")}, AnyPeer: true,
				Ports:      []PortEntry{{allOf(ip("0.0.0.0")), protoUDP, 53, 53}},
				NamedPorts: []PortEntry{{Range{ip("10.244.2.9"), ip("10.244.2.9")}, protoSCTP, 9000, 9000}}},
			{Name: "a/q egress 1", Egress: true, Local: []netip.Addr{ip("10.244.1.3")}, AllPorts: true,
				Peers: []Range{{ip("0.0.0.0"), ip("255.255.255.255")}}},
		},
	}
	if err := Program(ns.Path, plan); err != nil {
		t.Fatal(err)
	}
	if err := Program(ns.Path, plan); err != nil { // replaces, does not add
		t.Fatal(err)
	}
	out := nettest.MustRun(t, ns, "nft", "list", "table", "inet", Table)
	for _, want := range []string{
		"ct state established,related accept",
		"ip saddr @egress-isolated jump egress",
		"ip daddr @ingress-isolated jump ingress",
		"10.0.0.0/8", "192.168.1.7",
		"10.244.1.2 . tcp . 80", "10.244.1.2 . udp . 5000-5010",
		"ip saddr @r0-peers ip daddr . meta l4proto . th dport @r0-ports accept",
		"ip daddr @r1-local accept",
		"0.0.0.0/0 . udp . 53",
		"10.244.2.9 . sctp . 9000",
		"ip saddr @r2-local ip daddr . meta l4proto . th dport @r2-named return",
		"0.0.0.0/0",
		"ip saddr @r3-local ip daddr @r3-peers return",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
	if strings.Contains(out, "log") {
		t.Errorf("drops logged without a log group:\n%s", out)
	}
	plan.LogGroup = 7
	plan.IngressBy = []Isolation{{Policies: []string{"a/p"}, Addrs: []netip.Addr{ip("10.244.1.2")}}, {Policies: []string{"a/p", "a/q"}, Addrs: []netip.Addr{ip("10.244.1.3")}}}
	plan.EgressBy = []Isolation{{Policies: []string{"a/q"}, Addrs: []netip.Addr{ip("10.244.1.3")}}}
	if err := Program(ns.Path, plan); err != nil {
		t.Fatal(err)
	}
	out = nettest.MustRun(t, ns, "nft", "list", "table", "inet", Table)
	for _, want := range []string{
		"limit rate 100/second burst 50 packets jump ingress-log",
		"limit rate 100/second burst 50 packets jump egress-log",
		`ip daddr @in-log-0 log prefix "weft drop ingress a/p" group 7 snaplen 128`,
		`ip daddr @in-log-1 log prefix "weft drop ingress a/p a/q" group 7 snaplen 128`,
		`ip saddr @eg-log-0 log prefix "weft drop egress a/q" group 7 snaplen 128`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
	if n := strings.Count(out, "table inet "+Table); n != 1 {
		t.Errorf("%d tables", n)
	}
	plan.Ports = []PodPort{{ip("10.244.1.2"), "vethd2528480aff"}}
	if err := Program(ns.Path, plan); err != nil {
		t.Fatal(err)
	}
	if out := nettest.MustRun(t, ns, "nft", "list", "tables"); !strings.Contains(out, "table bridge "+Table) || !strings.Contains(out, "table inet "+Table) {
		t.Errorf("tables with bridge ports:\n%s", out)
	}
	if err := Remove(ns.Path); err != nil {
		t.Fatal(err)
	}
	if out := nettest.MustRun(t, ns, "nft", "list", "ruleset"); strings.Contains(out, Table) {
		t.Errorf("table left after Remove:\n%s", out)
	}
}

// TestProgramThousands: sets of thousands of elements hold all of them (a
// netlink message of 4,096 addresses overflows its list's 16-bit length,
// and the kernel would read it cut short without an error): a rule's 5,000
// local pods and its 3,000 peer ranges (6,000 elements with their ends).
func TestProgramThousands(t *testing.T) {
	ns := nettest.NewNS(t, "npbig")
	var peers []Range
	for i := range 3000 {
		a := netip.AddrFrom4([4]byte{10, byte(i >> 7), byte(i << 1), 1})
		peers = append(peers, Range{a, a})
	}
	var local []netip.Addr
	for i := range 5000 {
		local = append(local, netip.AddrFrom4([4]byte{10, 200, byte(i >> 8), byte(i)}))
	}
	plan := Plan{IngressIsolated: local, Rules: []Rule{{Name: "a/p ingress 0", Local: local, Peers: peers, AllPorts: true}}}
	if err := Program(ns.Path, plan); err != nil {
		t.Fatal(err)
	}
	addr := regexp.MustCompile(`\b10\.\d+\.\d+\.\d+\b`)
	for set, want := range map[string]int{"ingress-isolated": 5000, "r0-local": 5000, "r0-peers": 3000} {
		out := nettest.MustRun(t, ns, "nft", "list", "set", "inet", Table, set)
		if got := len(addr.FindAllString(out, -1)); got != want {
			t.Errorf("set %s holds %d addresses, want %d", set, got, want)
		}
	}
}
