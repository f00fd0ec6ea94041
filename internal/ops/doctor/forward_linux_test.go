package doctor

import (
	"net/netip"
	"regexp"
	"strings"
	"testing"

	"github.com/weft-net/weft/internal/ops/connectivity"
	"github.com/weft-net/weft/internal/ops/inspect"
	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/subnet"
)

// TestForwardTrace builds a node whose pods (10.244.1.0/24 on bridge cni0)
// reach a peer's VTEP 10.244.2.0 through an overlay link ovl, loads one
// forward firewall shape in the node, and checks firewall/forward, from
// the kernel's trace of the replies doctor makes the node forward, against
// what the kernel does with the pods' own traffic: a ping each way, new
// connections both. Traffic that flows is never a failure; traffic that
// does not is never ok.
func TestForwardTrace(t *testing.T) {
	weftFwd := "*filter\n:FORWARD DROP [0:0]\n:WEFT-FWD - [0:0]\n-A FORWARD -j WEFT-FWD\n-A WEFT-FWD -s 10.244.0.0/16 -j ACCEPT\n-A WEFT-FWD -d 10.244.0.0/16 -j ACCEPT\nCOMMIT\n"
	docker := "*filter\n:FORWARD DROP [0:0]\n-A FORWARD -o cni0 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n-A FORWARD -i cni0 ! -o cni0 -j ACCEPT\nCOMMIT\n"
	chain := func(rules string) string {
		return "table inet f { chain fw { type filter hook forward priority 0; policy drop;\n" + rules + "\n}\n}"
	}
	for _, tt := range []struct {
		name, nft, ipt string
		legacy         string // loaded with iptables-legacy-restore
		want           Status // the worst firewall/forward check
		re             string // in one of them
	}{
		{"no firewall", "", "", "", OK, `^echo reply from peer .* forwarded to 10.244.1.254 on cni0 \(this node's pods\): the kernel forwarded it: no chain but doctor's own`},
		{"policy drop, accept by interface", chain("iifname \"ovl\" accept\noifname \"ovl\" accept"), "", "", OK,
			`^echo reply from pod 10.244.1.2 on cni0 forwarded to peer .*: the kernel forwarded it: table inet f chain fw by rule handle \d+ \(oifname "ovl" accept\)`},
		{"policy drop, accept by address", chain("ip saddr 10.244.0.0/16 accept\nip daddr 10.244.0.0/16 accept"), "", "", OK, `by rule handle \d+ \(ip saddr 10.244.0.0/16 accept\)`},
		{"policy drop, nothing accepted", chain(""), "", "", Fail, `: the kernel dropped it in table inet f chain fw by its policy drop$`},
		{"policy drop, accept by another interface", chain("iifname \"eth1\" accept\noifname \"eth1\" accept"), "", "", Fail, `the kernel dropped it in table inet f chain fw by its policy drop`},
		{"policy drop, replies accepted", chain("ct state established,related accept"), "", "", Warn,
			`the kernel forwarded it, as the reply of a flow \(table inet f chain fw rule \d+ test its conntrack state or protocol\).*suspects only: table inet f chain fw policy drop`},
		{"replies accepted, then a drop rule", "table inet f { chain fw { type filter hook forward priority 0;\nct state established,related accept\ndrop\n}\n}", "", "", Warn,
			`suspects only: table inet f chain fw rule handle \d+ drops$`},
		{"replies accepted, nothing dropped", "table inet f { chain fw { type filter hook forward priority 0;\nct state established,related accept\n}\n}", "", "", OK,
			`as the reply of a flow .*; no forward chain here drops by policy or by a rule without a condition`},
		{"iptables-nft FORWARD DROP, weft's WEFT-FWD", "", weftFwd, "", OK, `table ip filter chain WEFT-FWD by rule handle`},
		{"iptables-nft FORWARD DROP, Docker's accepts for its bridge", "", docker, "", Warn, `suspects only: table ip filter chain FORWARD policy drop`},
		// iptables-legacy's chains are no nf_tables chains, but doctor's
		// last chain on the hook sees what passed them.
		{"iptables-legacy FORWARD DROP, weft's WEFT-FWD", "", "", weftFwd, OK, `: the kernel forwarded it: no chain but doctor's own`},
		{"iptables-legacy FORWARD DROP", "", "", "*filter\n:FORWARD DROP [0:0]\nCOMMIT\n", Warn,
			`: no reply was forwarded during the probes .*suspects only: iptables-legacy tables filter`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			node, peer, pod := nettest.NewNS(t, "fnode"), nettest.NewNS(t, "fpeer"), nettest.NewNS(t, "fpod")
			nettest.Veth(t, node, "ovl", peer, "ovl")
			nettest.Veth(t, node, "vethpod", pod, "eth0")
			for _, c := range [][]string{{"ip", "link", "add", "cni0", "type", "bridge"}, {"ip", "link", "set", "cni0", "up"},
				{"ip", "link", "set", "vethpod", "master", "cni0"}, {"ip", "addr", "add", "10.244.1.1/24", "dev", "cni0"},
				{"ip", "addr", "add", "10.244.1.0/32", "dev", "ovl"}, {"ip", "route", "add", "10.244.2.0/24", "via", "10.244.2.0", "dev", "ovl", "onlink"},
				{"sysctl", "-qw", "net.ipv4.ip_forward=1"}} {
				nettest.MustRun(t, node, c...)
			}
			nettest.MustRun(t, peer, "ip", "addr", "add", "10.244.2.0/32", "dev", "ovl")
			nettest.MustRun(t, peer, "ip", "route", "add", "10.244.1.0/24", "via", "10.244.1.0", "dev", "ovl", "onlink")
			nettest.MustRun(t, pod, "ip", "addr", "add", "10.244.1.2/24", "dev", "eth0")
			nettest.MustRun(t, pod, "ip", "route", "add", "default", "via", "10.244.1.1")
			nettest.MustRun(t, node, "ping", "-c1", "-W1", "10.244.1.2") // the node's neighbour entry for its pod
			load(t, node, "nft", tt.nft)
			load(t, node, "iptables-nft-restore", tt.ipt)
			load(t, node, "iptables-legacy-restore", tt.legacy)
			_, errOut := pod.Run("ping", "-c1", "-W1", "10.244.2.0")
			_, errIn := peer.Run("ping", "-c1", "-W1", "10.244.1.2")
			reach := errOut == nil && errIn == nil

			ovl, err := node.Handle.LinkByName("ovl")
			if err != nil {
				t.Fatal(err)
			}
			leases := []subnet.Lease{{Subnet: netip.MustParsePrefix("10.244.1.0/24")}, {Subnet: netip.MustParsePrefix("10.244.2.0/24")}}
			leases[0].Attrs.PublicIP, leases[1].Attrs.PublicIP = netip.MustParseAddr("192.168.77.1"), netip.MustParseAddr("192.168.77.2")
			s := &state{Node: Node{Do: connectivity.Do(node.Do), Handle: node.Handle, Leases: leases,
				Config: &subnet.Config{Network: netip.MustParsePrefix("10.244.0.0/16"), Backend: subnet.BackendConfig{Type: subnet.BackendTypeVXLAN, Port: 8472}}},
				r: &Report{}, self: &leases[0], fp: &fastPathRead{}, k: &inspect.Kernel{Device: inspect.Device{Name: "ovl", Index: ovl.Attrs().Index}}}
			it := s.startInputTrace()
			if it.err != nil || len(it.fwd) != 2 {
				t.Fatalf("trace: %v; forward probes %+v (%s)", it.err, it.fwd, it.fwdWhy)
			}
			checkForward(s, it)
			checks := s.r.Find("firewall/forward")
			worst, matched := OK, false
			for _, c := range checks {
				worst = max(worst, c.Status)
				matched = matched || regexp.MustCompile(tt.re).MatchString(c.Evidence)
			}
			if worst != tt.want || !matched || len(checks) != 2 {
				t.Errorf("want %s with %q, got %+v", tt.want, tt.re, checks)
			}
			if reach && worst == Fail || !reach && worst == OK {
				t.Errorf("pods and peer reach each other: %v (out %v, in %v), but doctor says %s: %+v", reach, errOut, errIn, worst, checks)
			}
			if tables := nettest.MustRun(t, node, "nft", "list", "tables"); strings.Contains(tables, traceTable) {
				t.Errorf("trace table left behind:\n%s", tables)
			}
		})
	}
}
