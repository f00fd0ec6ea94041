package lab

import (
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// doctorCheck is one check of `weftctl doctor -o json`.
type doctorCheck struct {
	Name, Status, Evidence, Fix string
}

// doctor runs `weftctl doctor --lab --node node -o json` and returns its
// exit code and checks.
func doctor(t *testing.T, bin, dir, node string) (int, []doctorCheck) {
	t.Helper()
	out, code := run(t, bin, "doctor", "--lab", "--state-dir", dir, "--node", node, "-o", "json", "--timeout", "500ms")
	var doc struct {
		Status string
		Nodes  []struct{ Checks []doctorCheck }
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil || len(doc.Nodes) != 1 {
		t.Fatalf("doctor -o json: exit %d, %v:\n%s", code, err, out)
	}
	if want := []string{"ok", "warn", "fail"}[code]; doc.Status != want {
		t.Errorf("doctor: status %q with exit code %d", doc.Status, code)
	}
	return code, doc.Nodes[0].Checks
}

// expectCheck asserts that exactly the named check (one of them, for
// repeated names) has the status and evidence matching re, and that no
// other check failed or warned.
func expectCheck(t *testing.T, checks []doctorCheck, code, wantCode int, name, status, re string) {
	t.Helper()
	expectChecks(t, checks, code, wantCode, wantCheck{name, status, re})
}

// wantCheck is a check that expectChecks looks for.
type wantCheck struct{ name, status, re string }

// expectChecks asserts that each wanted check is there (one of them, for
// repeated names) with its status and evidence, and that no other check
// failed or warned.
func expectChecks(t *testing.T, checks []doctorCheck, code, wantCode int, want ...wantCheck) {
	t.Helper()
	found := make([]bool, len(want))
next:
	for _, c := range checks {
		for i, w := range want {
			if c.Name == w.name && c.Status == w.status && regexp.MustCompile(w.re).MatchString(c.Evidence) {
				found[i] = true
				if c.Fix == "" {
					t.Errorf("%s: %s without a fix", w.name, w.status)
				}
				continue next
			}
		}
		if c.Status != "ok" {
			t.Errorf("unexpected %s %s: %s", c.Status, c.Name, c.Evidence)
		}
	}
	for i, w := range want {
		if !found[i] || code != wantCode {
			t.Errorf("want %s %s matching %q and exit %d; got exit %d:\n%+v", w.status, w.name, w.re, wantCode, code, checks)
		}
	}
}

// TestDoctorFaults builds a 3-node kernel-VXLAN lab, checks that a healthy
// lab passes every doctor check and the connectivity matrix, then injects
// one fault at a time inside a node's namespace and checks that doctor
// names it with the right status and exit code, and that connectivity
// fails exactly the pairs of a node whose VXLAN port is blocked.
func TestDoctorFaults(t *testing.T) {
	bin := weftctl(t)
	rootBefore := rootNetState(t)
	dir := filepath.Join(t.TempDir(), "lab")
	labUp(t, bin, dir, "--nodes", "3", "--pods-per-node", "1", "--backend", "vxlan")
	st, err := LoadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	n1, n2, n3 := st.Nodes[0], st.Nodes[1], st.Nodes[2]
	t.Run("healthy", func(t *testing.T) {
		for _, n := range st.Nodes {
			code, checks := doctor(t, bin, dir, n.Name)
			probes, filter := 0, false
			for _, c := range checks {
				if c.Status != "ok" {
					t.Errorf("%s: %s %s: %s", n.Name, c.Status, c.Name, c.Evidence)
				}
				filter = filter || c.Name == "firewall/vxlan-peers" && strings.Contains(c.Evidence, "from the 2 peer addresses only")
				if strings.HasPrefix(c.Name, "probe/") && strings.Contains(c.Evidence, "3/3") && strings.Contains(c.Evidence, "DF 1450 bytes ok") {
					probes++
				}
			}
			if !filter {
				t.Errorf("%s: no firewall/vxlan-peers check admitting the 2 peers: %+v", n.Name, checks)
			}
			if code != 0 || probes != 2 || len(checks) < 18 {
				t.Errorf("%s: exit %d, %d good probes, %d checks", n.Name, code, probes, len(checks))
			}
		}
		out, code := run(t, bin, "connectivity", "--lab", "--state-dir", dir)
		if code != 0 || strings.Count(out, "6/6 pairs ok") != 2 {
			t.Errorf("connectivity: exit %d:\n%s", code, out)
		}
		// As on a real node: weftctl runs in the node's namespace, with
		// the etcd flags lab exec sets and the node's file locations.
		out, code = run(t, bin, "lab", "exec", "--state-dir", dir, n2.Name, "--", bin, "doctor",
			"--subnet-file", n2.SubnetFile, "--cni-conf-dir", filepath.Dir(n2.SubnetFile))
		if code != 0 || !strings.Contains(out, "doctor: this node") || !regexp.MustCompile(`\d+ checks: \d+ ok, 0 warn, 0 fail`).MatchString(out) {
			t.Errorf("doctor on node2 itself: exit %d:\n%s", code, out)
		}
	})
	t.Run("connectivity on each host through etcd", func(t *testing.T) {
		// As on plain etcd hosts: one weftctl per node, run inside the
		// node's namespace, meeting the others through the lab's etcd.
		type result struct {
			out  string
			code int
		}
		res := make(chan result, len(st.Nodes))
		for _, n := range st.Nodes {
			go func() {
				out, code := runNoFatal(bin, "lab", "exec", "--state-dir", dir, n.Name, "--", bin, "connectivity",
					"--cni-conf-dir", filepath.Dir(n.SubnetFile), "--cni-bin-dir", filepath.Dir(bin), "--wait", "40s")
				res <- result{out, code}
			}()
		}
		for range st.Nodes {
			r := <-res
			if r.code != 0 || strings.Count(r.out, "6/6 pairs ok") != 2 || !strings.Contains(r.out, "3 of 3 nodes took part; 3 published their results") {
				t.Errorf("connectivity on a node: exit %d:\n%s", r.code, r.out)
			}
		}
	})
	t.Run("explain the way out", func(t *testing.T) {
		// explain reads routes; it sends nothing to the address.
		out, code := run(t, bin, "explain", "--lab", "--state-dir", dir, st.Pods[0].IP.String(), "192.0.2.1")
		for _, want := range []string{"192.0.2.1 is outside the cluster network", "192.0.2.1 via 192.168.77.254 dev eth0",
			"rewrites the source to eth0's address " + n1.Addr.String()} {
			if !strings.Contains(out, want) {
				t.Errorf("explain lacks %q", want)
			}
		}
		if code != 0 {
			t.Errorf("explain to an outside address: exit %d:\n%s", code, out)
		}
	})
	t.Run("UDP 8472 blocked", func(t *testing.T) {
		ipIn(t, n2.NS, "nft", "add table inet wefttest; add chain inet wefttest in { type filter hook input priority 0; }; add rule inet wefttest in udp dport 8472 drop")
		defer ipIn(t, n2.NS, "nft", "delete table inet wefttest")
		code, checks := doctor(t, bin, dir, n1.Name)
		// node2 drops node1's probes, so node2 sends node1 nothing that
		// node1's kernel could judge: node1 lists its own suspects (none).
		// Should node2 send node1 a datagram meanwhile (it still may), node1's
		// kernel accepts it, and doctor says so.
		none := regexp.MustCompile(`^none of peer ` + regexp.QuoteMeta(n2.Addr.String()) + ` \(\S+\)'s VXLAN datagrams arrived during the probes .*suspects only: none on this node$`)
		accepted := regexp.MustCompile(`^UDP 8472 \(VXLAN\) from peer ` + regexp.QuoteMeta(n2.Addr.String()) + ` \(\S+\) over IPv4: the kernel accepted it`)
		checks = slices.DeleteFunc(checks, func(c doctorCheck) bool {
			if c.Name != "firewall/input" || !strings.Contains(c.Evidence, "peer "+n2.Addr.String()+" ") {
				return false
			}
			if !(c.Status == "warn" && none.MatchString(c.Evidence) || c.Status == "ok" && accepted.MatchString(c.Evidence)) {
				t.Errorf("firewall/input for node2: %s %q, want a warning with no suspect or the kernel's accept", c.Status, c.Evidence)
			}
			return true
		})
		expectChecks(t, checks, code, 2, wantCheck{"probe/" + n2.Addr.String(), "fail", "UDP 8472 blocked on the path: " + regexp.QuoteMeta(n2.Addr.String()) + " answers on the underlay"})
		// On node2 the kernel names the rule, from node1's and node3's replies.
		code, checks = doctor(t, bin, dir, n2.Name)
		expectChecks(t, checks, code, 2, wantCheck{"probe/" + n1.Addr.String(), "fail", "UDP 8472 blocked on the path"},
			wantCheck{"probe/" + n3.Addr.String(), "fail", "UDP 8472 blocked on the path"},
			wantCheck{"firewall/input", "fail", `^UDP 8472 \(VXLAN\) from peer \S+ \(\S+\) over IPv4: the kernel dropped it in table inet wefttest chain in by rule handle \d+ \(udp dport 8472 drop\)$`})
		out, code := run(t, bin, "connectivity", "--lab", "--state-dir", dir, "--count", "1", "--timeout", "300ms")
		if code != 2 {
			t.Errorf("connectivity: exit %d", code)
		}
		for _, l := range strings.Split(out, "\n") {
			f := strings.Fields(strings.TrimPrefix(l, "✗"))
			if len(f) < 2 || !strings.HasPrefix(f[0], "node") {
				continue
			}
			involves := strings.HasPrefix(f[0], "node2") || strings.HasPrefix(f[1], "node2")
			if failed := strings.HasPrefix(l, "✗"); failed != involves {
				t.Errorf("pair %s → %s: failed %v, but node2's port is the one blocked:\n%s", f[0], f[1], failed, out)
			}
		}
		if strings.Count(out, "2/6 pairs ok") != 2 {
			t.Errorf("want 4 of 6 pairs failing in both matrices:\n%s", out)
		}
	})
	t.Run("UDP 8472 accepted from some sources only", func(t *testing.T) {
		// node2 accepts the port from node1 alone before a drop: node3's
		// datagrams are dropped, and doctor names node3 as the peer left out.
		ipIn(t, n2.NS, "nft", "add table inet wefttest; add chain inet wefttest in { type filter hook input priority 0; }; "+
			"add rule inet wefttest in ip saddr "+n1.Addr.String()+" udp dport 8472 accept; add rule inet wefttest in udp dport 8472 drop")
		defer ipIn(t, n2.NS, "nft", "delete table inet wefttest")
		code, checks := doctor(t, bin, dir, n2.Name)
		expectChecks(t, checks, code, 2, wantCheck{"probe/" + n3.Addr.String(), "fail", "UDP 8472 blocked on the path"},
			wantCheck{"firewall/input", "fail", `^UDP 8472 \(VXLAN\) from peer ` + regexp.QuoteMeta(n3.Addr.String()) + ` \(\S+\) over IPv4: the kernel dropped it in table inet wefttest chain in by rule handle \d+ \(udp dport 8472 drop\)$`})
		if !slices.ContainsFunc(checks, func(c doctorCheck) bool {
			return c.Name == "firewall/input" && c.Status == "ok" && strings.Contains(c.Evidence, "from peer "+n1.Addr.String()+" ") && strings.Contains(c.Evidence, "ip saddr "+n1.Addr.String()+" udp dport 8472 accept")
		}) {
			t.Errorf("no ok firewall/input naming the accept of node1:\n%+v", checks)
		}
		// The underlay's prefix holds every peer: the port is open to all
		// of them, as the probes show, and firewall/input says so.
		underlay := netip.PrefixFrom(n1.Addr, 24).Masked()
		ipIn(t, n2.NS, "nft", "insert rule inet wefttest in ip saddr "+underlay.String()+" udp dport 8472 accept")
		code, checks = doctor(t, bin, dir, n2.Name)
		expectChecks(t, checks, code, 0)
		if !slices.ContainsFunc(checks, func(c doctorCheck) bool { return c.Name == "firewall/input" && c.Status == "ok" }) {
			t.Errorf("no ok firewall/input with the underlay accepted:\n%+v", checks)
		}
	})
	t.Run("UDP 8472 accepted through another interface only", func(t *testing.T) {
		// node2 accepts the port from the underlay's prefix in a chain
		// reached from eth1 only, then drops it: the peers' datagrams
		// arrive on eth0 and are dropped, and doctor does not take the
		// accept for theirs.
		underlay := netip.PrefixFrom(n1.Addr, 24).Masked()
		ipIn(t, n2.NS, "nft", "add table inet wefttest; add chain inet wefttest in { type filter hook input priority 0; }; add chain inet wefttest trusted; "+
			"add rule inet wefttest in iifname eth1 jump trusted; add rule inet wefttest trusted ip saddr "+underlay.String()+" udp dport 8472 accept; "+
			"add rule inet wefttest in udp dport 8472 drop")
		defer ipIn(t, n2.NS, "nft", "delete table inet wefttest")
		code, checks := doctor(t, bin, dir, n2.Name)
		expectChecks(t, checks, code, 2, wantCheck{"probe/" + n1.Addr.String(), "fail", "UDP 8472 blocked on the path"},
			wantCheck{"probe/" + n3.Addr.String(), "fail", "UDP 8472 blocked on the path"},
			wantCheck{"firewall/input", "fail", `^UDP 8472 \(VXLAN\) from peer \S+ \(\S+\) over IPv4: the kernel dropped it in table inet wefttest chain in by rule handle \d+ \(udp dport 8472 drop\)$`})
	})
	t.Run("input policy drop, UDP 8472 accepted on the underlay interface", func(t *testing.T) {
		interfaceAccept(t, bin, dir, n2, false, n1, n3)
	})
	t.Run("underlay MTU lowered", func(t *testing.T) {
		ipIn(t, n1.NS, "ip", "link", "set", "eth0", "mtu", "1400")
		defer ipIn(t, n1.NS, "ip", "link", "set", "eth0", "mtu", "1500")
		code, checks := doctor(t, bin, dir, n1.Name)
		// The DF probes at 1450 bytes no longer fit either: they are the
		// active proof of the same fault.
		var rest []doctorCheck
		for _, c := range checks {
			if !strings.HasPrefix(c.Name, "probe/") || c.Status == "ok" || !strings.Contains(c.Evidence, "MTU black hole") {
				rest = append(rest, c)
			}
		}
		expectCheck(t, rest, code, 2, "underlay/mtu", "fail", `weft.1 MTU 1450 \+ 50 bytes of VXLAN = 1500 > eth0 MTU 1400`)
	})
	t.Run("subnet file removed", func(t *testing.T) {
		if err := os.Rename(n3.SubnetFile, n3.SubnetFile+".away"); err != nil {
			t.Fatal(err)
		}
		defer os.Rename(n3.SubnetFile+".away", n3.SubnetFile)
		code, checks := doctor(t, bin, dir, n3.Name)
		expectCheck(t, checks, code, 2, "subnetfile/present", "fail", regexp.QuoteMeta(n3.SubnetFile))
	})
	t.Run("nftables forward drop policy", func(t *testing.T) {
		// A table of the host's own, not iptables' filter: weftd puts its
		// WEFT-FWD accept into a filter FORWARD chain as soon as the kernel
		// notifies it, but a drop in another base chain on the hook is
		// final whatever weft's rules accept.
		ipIn(t, n1.NS, "nft", "add table inet host; add chain inet host forward { type filter hook forward priority 0; policy drop; }")
		defer ipIn(t, n1.NS, "nft", "delete table inet host")
		code, checks := doctor(t, bin, dir, n1.Name)
		// The kernel drops the replies doctor makes node1 forward, both ways.
		expectCheck(t, checks, code, 2, "firewall/forward", "fail", `: the kernel dropped it in table inet host chain forward by its policy drop$`)
		// The fix doctor proposes makes the check pass.
		ipIn(t, n1.NS, "nft", "insert rule inet host forward ip saddr 10.244.0.0/16 accept; insert rule inet host forward ip daddr 10.244.0.0/16 accept")
		if code, checks := doctor(t, bin, dir, n1.Name); code != 0 {
			t.Errorf("with the accept rules: exit %d\n%+v", code, checks)
		}
	})
	t.Run("flannel.1 on port 8472", func(t *testing.T) {
		ipIn(t, n1.NS, "ip", "link", "add", "flannel.1", "type", "vxlan", "id", "2", "dstport", "8472", "dev", "eth0")
		defer ipIn(t, n1.NS, "ip", "link", "del", "flannel.1")
		ipIn(t, n1.NS, "ip", "link", "set", "flannel.1", "up") // the kernel shares the port between VNIs
		code, checks := doctor(t, bin, dir, n1.Name)
		expectCheck(t, checks, code, 1, "vxlan/port", "warn", `flannel.1 \(VNI 2\) holds UDP port 8472`)
	})
	t.Run("rp_filter strict", func(t *testing.T) {
		ipIn(t, n1.NS, "sysctl", "-qw", "net.ipv4.conf.all.rp_filter=1")
		defer ipIn(t, n1.NS, "sysctl", "-qw", "net.ipv4.conf.all.rp_filter=0")
		code, checks := doctor(t, bin, dir, n1.Name)
		expectCheck(t, checks, code, 1, "kernel/rp_filter", "warn", `strict reverse-path filter on weft.1, eth0`)
	})
	t.Run("ip_forward off", func(t *testing.T) {
		ipIn(t, n1.NS, "sysctl", "-qw", "net.ipv4.ip_forward=0")
		defer ipIn(t, n1.NS, "sysctl", "-qw", "net.ipv4.ip_forward=1")
		code, checks := doctor(t, bin, dir, n1.Name)
		expectCheck(t, checks, code, 2, "kernel/ip_forward", "fail", `net.ipv4.ip_forward = 0`)
	})
	t.Run("healthy again", func(t *testing.T) {
		for end := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			code, checks := doctor(t, bin, dir, n1.Name)
			if code == 0 {
				break
			}
			if time.Now().After(end) {
				t.Fatalf("node1 not healthy after the faults were removed: exit %d\n%+v", code, checks)
			}
		}
	})
	if after := rootNetState(t); after != rootBefore {
		t.Errorf("root namespace sysctls or nftables changed:\nbefore %s\nafter  %s", rootBefore, after)
	}
}

// TestDoctorUVXLAN checks doctor and connectivity on userspace VTEPs
// without the fast path (--fast-path=false): a healthy 2-node uvxlan lab
// passes, and a blocked VXLAN port is named.
func TestDoctorUVXLAN(t *testing.T) {
	bin := weftctl(t)
	dir := filepath.Join(t.TempDir(), "lab")
	labUp(t, bin, dir, "--nodes", "2", "--pods-per-node", "1", "--backend", "uvxlan", "--fast-path=false")
	st, err := LoadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	n1, n2 := st.Nodes[0], st.Nodes[1]
	for _, n := range st.Nodes {
		code, checks := doctor(t, bin, dir, n.Name)
		for _, c := range checks {
			if c.Status != "ok" {
				t.Errorf("%s: %s %s: %s", n.Name, c.Status, c.Name, c.Evidence)
			}
		}
		if code != 0 {
			t.Errorf("%s: exit %d", n.Name, code)
		}
	}
	out, code := run(t, bin, "connectivity", "--lab", "--state-dir", dir)
	if code != 0 || strings.Count(out, "2/2 pairs ok") != 2 {
		t.Errorf("connectivity: exit %d:\n%s", code, out)
	}
	ipIn(t, n2.NS, "nft", "add table inet wefttest; add chain inet wefttest in { type filter hook input priority 0; }; add rule inet wefttest in udp dport 8472 drop")
	code, checks := doctor(t, bin, dir, n1.Name)
	expectChecks(t, checks, code, 2, wantCheck{"probe/" + n2.Addr.String(), "fail", "UDP 8472 blocked on the path"},
		wantCheck{"firewall/input", "warn", `^none of peer ` + regexp.QuoteMeta(n2.Addr.String()) + ` \(\S+\)'s VXLAN datagrams arrived during the probes`})
	// Without the fast path every peer's datagrams meet the rule: the node
	// that holds it fails firewall/input.
	code, checks = doctor(t, bin, dir, n2.Name)
	expectChecks(t, checks, code, 2, wantCheck{"probe/" + n1.Addr.String(), "fail", "UDP 8472 blocked on the path"},
		wantCheck{"firewall/input", "fail", `^UDP 8472 \(VXLAN\) from peer ` + regexp.QuoteMeta(n1.Addr.String()) + ` \(\S+\) over IPv4: the kernel dropped it in table inet wefttest chain in by rule handle \d+ \(udp dport 8472 drop\)$`})
	ipIn(t, n2.NS, "nft", "delete table inet wefttest")
	interfaceAccept(t, bin, dir, n2, false, n1)
}

// TestDoctorFastPathFirewall: on a uvxlan lab with the fast path (the
// default), the
// README's tour (drop UDP 8472 on a node with nft) blocks nothing between
// fast-path peers, and doctor says so: the rule is named as one the fast
// path bypasses, and firewall/input warns (it cuts off only peers on the
// userspace path) where TestDoctorUVXLAN, without the fast path, fails it.
// peers and explain say which path carries the traffic.
func TestDoctorFastPathFirewall(t *testing.T) {
	bin := weftctl(t)
	dir := filepath.Join(t.TempDir(), "lab")
	labUp(t, bin, dir, "--nodes", "2", "--pods-per-node", "1", "--backend", "uvxlan") // the fast path is on by default
	st, err := LoadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	n1, n2 := st.Nodes[0], st.Nodes[1]
	for _, n := range st.Nodes {
		code, checks := doctor(t, bin, dir, n.Name)
		found, bridge := false, false
		for _, c := range checks {
			found = found || c.Name == "firewall/fastpath" && c.Status == "ok" && strings.Contains(c.Evidence, "fast path attached; no nftables rule on UDP 8472")
			bridge = bridge || c.Name == "firewall/fastpath" && c.Status == "ok" && strings.Contains(c.Evidence, "weft_fp_bridge on cni0's egress")
			if c.Status != "ok" {
				t.Errorf("%s: %s %s: %s", n.Name, c.Status, c.Name, c.Evidence)
			}
		}
		if !found || !bridge || code != 0 {
			t.Errorf("%s: exit %d, want ok firewall/fastpath with the fast path and the bridge program attached:\n%+v", n.Name, code, checks)
		}
	}
	out, code := run(t, bin, "peers", "--lab", "--state-dir", dir, "--node", n1.Name)
	if code != 0 || !strings.Contains(out, "fast path attached") || !strings.Contains(out, "on cni0's egress") {
		t.Errorf("peers: exit %d:\n%s", code, out)
	}
	// A bridge-family chain on the output hook does not see what the
	// bridge program hands to the pods' ports: doctor names it.
	ipIn(t, n2.NS, "nft", "add table bridge wefttest; add chain bridge wefttest out { type filter hook output priority 0; }")
	code, checks := doctor(t, bin, dir, n2.Name)
	expectChecks(t, checks, code, 1, wantCheck{"firewall/fastpath", "warn", `weft_fp_bridge on cni0's egress .*: table bridge wefttest chain out do not see them`})
	ipIn(t, n2.NS, "nft", "delete table bridge wefttest")
	var p1, p2 PodState
	for _, p := range st.Pods {
		switch p.Node {
		case n1.Name:
			p1 = p
		case n2.Name:
			p2 = p
		}
	}
	out, code = run(t, bin, "explain", "--lab", "--state-dir", dir, p1.IP.String(), p2.IP.String())
	back := strings.Index(out, "weft_fp_bridge on cni0's egress hands TCP super-packets straight to the pod's port")
	if code != 0 || !strings.Contains(out, "fast path: tc program weft_fp_egress") || back < 0 || back < strings.Index(out, " deliver ") {
		t.Errorf("explain: exit %d, want the fast path's programs named, and the bridge program for the replies after the way there:\n%s", code, out)
	}

	ipIn(t, n2.NS, "nft", "add table inet wefttest; add chain inet wefttest in { type filter hook input priority 0; }; add rule inet wefttest in udp dport 8472 drop")
	code, checks = doctor(t, bin, dir, n2.Name)
	expectChecks(t, checks, code, 1, wantCheck{"firewall/fastpath", "warn", `table inet wefttest chain in rule \d+ match UDP 8472 but do not apply to the peers it carries`})
	// No chain saw node1's replies: the fast path took them, and the
	// rule's drop does not hold for them.
	if !slices.ContainsFunc(checks, func(c doctorCheck) bool {
		return c.Name == "firewall/input" && c.Status == "ok" && regexp.MustCompile(`^VXLAN datagrams of peer `+regexp.QuoteMeta(n1.Addr.String())+
			` \(\S+\): uvxlan's fast path takes them on the underlay's ingress before netfilter, so no chain saw them`).MatchString(c.Evidence)
	}) {
		t.Errorf("no ok firewall/input naming the fast path:\n%+v", checks)
	}
	out, code = run(t, bin, "connectivity", "--lab", "--state-dir", dir)
	if code != 0 || strings.Count(out, "2/2 pairs ok") != 2 {
		t.Errorf("connectivity with UDP 8472 dropped on %s: exit %d (fast-path peers bypass the rule):\n%s", n2.Name, code, out)
	}
	ipIn(t, n2.NS, "nft", "delete table inet wefttest")
	interfaceAccept(t, bin, dir, n2, true, n1)
}

// interfaceAccept gives node n an input chain with policy drop that
// accepts UDP 8472 on one interface, the common shape (firewalld's
// zones, hand-written firewalls), and checks doctor on n against what
// the kernel did, told by the probes (a probe comes back only when the
// peer's reply datagram arrived): on eth0, the underlay, every peer's
// datagrams are accepted, and doctor names the accept from the kernel's
// trace; on eth1 they are dropped, and doctor names the policy. With
// uvxlan's fast path attached, tc takes the peers' datagrams before
// netfilter on either interface: they arrive, doctor says the fast path
// took them, and firewall/fastpath warns that the rule does not apply.
// (No ct state accept: flows left from the first run would be accepted
// as established.)
func interfaceAccept(t *testing.T, bin, dir string, n NodeState, fastPath bool, peers ...NodeState) {
	t.Helper()
	for _, iif := range []string{"eth0", "eth1"} {
		ipIn(t, n.NS, "nft", "add table inet wefttest; add chain inet wefttest in { type filter hook input priority 0; policy drop; }; "+
			"add rule inet wefttest in iif lo accept; add rule inet wefttest in meta l4proto icmp accept; "+
			"add rule inet wefttest in iifname "+iif+" udp dport 8472 accept")
		code, checks := doctor(t, bin, dir, n.Name)
		ipIn(t, n.NS, "nft", "delete table inet wefttest")
		var want []wantCheck
		wantCode := 0
		accepted := `the kernel accepted it: table inet wefttest chain in by rule handle \d+ \(iifname "eth0" udp dport 8472 accept\)$`
		switch {
		case fastPath:
			accepted, wantCode = `uvxlan's fast path takes them on the underlay's ingress before netfilter`, 1
			want = append(want, wantCheck{"firewall/fastpath", "warn", `table inet wefttest chain in rule \d+ match UDP 8472`})
		case iif != "eth0":
			accepted, wantCode = "", 2
			for _, p := range peers {
				want = append(want, wantCheck{"probe/" + p.Addr.String(), "fail", "UDP 8472 blocked on the path"})
			}
			want = append(want, wantCheck{"firewall/input", "fail", `^UDP 8472 \(VXLAN\) from peer \S+ \(\S+\) over IPv4: the kernel dropped it in table inet wefttest chain in by its policy drop$`})
		}
		expectChecks(t, checks, code, wantCode, want...)
		for _, p := range peers {
			if accepted != "" && !slices.ContainsFunc(checks, func(c doctorCheck) bool {
				return c.Name == "firewall/input" && c.Status == "ok" && strings.Contains(c.Evidence, "peer "+p.Addr.String()+" ") && regexp.MustCompile(accepted).MatchString(c.Evidence)
			}) {
				t.Errorf("iifname %s: no ok firewall/input for %s matching %q:\n%+v", iif, p.Name, accepted, checks)
			}
		}
	}
}
