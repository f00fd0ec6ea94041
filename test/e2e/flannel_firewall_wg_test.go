package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/testkit/nettest"
)

// Flannel failure tests of the firewall, the path MTU and WireGuard
// (docs/flannel-failures.md).

// wgCluster is a cluster of n WireGuard nodes, each with its key file in
// its own directory (not Flannel's /run/flannel/wgkey, which all would
// share).
func wgCluster(t *testing.T, n int, opts Options) *Cluster {
	t.Helper()
	opts.NoConfig = true
	c := NewCluster(t, opts)
	c.Put(Prefix+"/config", `{"Network":"10.244.0.0/16","Backend":{"Type":"wireguard"}}`)
	c.OnNode = func(n *Node) { n.Env = []string{"WIREGUARD_KEY_FILE=" + wgKeyFile(c, n)} }
	for i := range n {
		c.AddNode(fmt.Sprintf("n%d", i+1))
	}
	for _, n := range c.Nodes {
		n.WaitReady()
	}
	return c
}

func wgKeyFile(c *Cluster, n *Node) string { return filepath.Join(c.Dir, n.Label, "wgkey") }

// TestFlannelK3s5101WireGuardMTU answers k3s-io/k3s#5101 (a WireGuard MTU
// regression loses large packets): on underlays of MTU 9001 and 1400 the
// WireGuard overlay MTU (subnet file, flannel-wg, the pod's eth0) is the
// underlay's minus 80, Flannel's overhead (an IPv6 outer header, so that
// the same MTU works on either family); a DF ping of exactly that size
// crosses, and one byte more fails in the sending pod with "message too
// long".
func TestFlannelK3s5101WireGuardMTU(t *testing.T) {
	for _, underlay := range []int{9001, 1400} {
		t.Run(fmt.Sprint(underlay), func(t *testing.T) {
			c := wgCluster(t, 2, Options{UnderlayMTU: underlay})
			n1, n2 := c.Nodes[0], c.Nodes[1]
			a, b := n1.CNI.AddPod(t, "a"), n2.CNI.AddPod(t, "b")
			want := underlay - 80
			if got := fileMTU(t, n1); got != want {
				t.Errorf("FLANNEL_MTU %d, want %d", got, want)
			}
			for what, out := range map[string]string{
				"flannel-wg": Output(t, n1.NS, "ip", "link", "show", "flannel-wg"),
				"pod's eth0": Output(t, a.NS, "ip", "link", "show", "eth0"),
			} {
				if !strings.Contains(out, fmt.Sprintf(" mtu %d ", want)) {
					t.Errorf("%s MTU, want %d:\n%s", what, want, out)
				}
			}
			// WireGuard retries a handshake every 5 s (see TestWireGuardDualStack).
			Eventually(t, 20*time.Second, "a reaches b", func() error { return Ping(a.NS, b.IP, "-W", "1") })
			payload := want - 28 // IPv4 and ICMP headers
			if err := Ping(a.NS, b.IP, "-M", "do", "-s", fmt.Sprint(payload)); err != nil {
				t.Errorf("DF ping of %d bytes (the overlay MTU) must cross: %v", want, err)
			}
			if err := Ping(b.NS, a.IP, "-M", "do", "-s", fmt.Sprint(payload)); err != nil {
				t.Errorf("DF ping of %d bytes back must cross: %v", want, err)
			}
			out, err := a.NS.Run("ping", "-c", "1", "-W", "1", "-M", "do", "-s", fmt.Sprint(payload+1), b.IP.String())
			if err == nil || !strings.Contains(strings.ToLower(out), "message too long") {
				t.Errorf("DF ping of %d bytes must fail in the pod with \"message too long\" (err %v):\n%s", want+1, err, out)
			}
			if !t.Failed() {
				recordFailure(t, "k3s5101", fmt.Sprintf("underlay MTU %d: WireGuard overlay MTU %d; a DF packet of %d bytes crosses both ways, %d fails in the pod", underlay, want, want, want+1))
			}
		})
	}
}

// doctorCheck runs `weftctl doctor -o json` in n's namespace and returns
// the check named name (the test fails when there is none) and the exit
// status.
func doctorCheck(t *testing.T, c *Cluster, n *Node, name string) (doctorResult, int) {
	t.Helper()
	checks, code := doctorChecks(t, c, n)
	for _, ch := range checks {
		if ch.Name == name {
			return ch, code
		}
	}
	t.Fatalf("weftctl doctor has no check %s: %+v", name, checks)
	return doctorResult{}, code
}

// doctorChecks runs `weftctl doctor -o json` in n's namespace and returns
// its checks and exit status.
func doctorChecks(t *testing.T, c *Cluster, n *Node) ([]doctorResult, int) {
	t.Helper()
	cmd := n.Command(context.Background(), nettest.Binary(t, "weftctl"), "doctor", "-o", "json",
		"--etcd-endpoints", c.Endpoints(), "--subnet-file", n.SubnetFile, "--cni-conf-dir", t.TempDir(),
		"--health-addr", "127.0.0.1:9470")
	out, err := cmd.Output()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("weftctl doctor: %v", err)
	}
	var r struct {
		Nodes []struct{ Checks []doctorResult }
	}
	if err := json.Unmarshal(out, &r); err != nil || len(r.Nodes) != 1 {
		t.Fatalf("weftctl doctor -o json: %v (%d nodes)\n%s", err, len(r.Nodes), out)
	}
	return r.Nodes[0].Checks, code
}

// doctorResult is one check of `weftctl doctor -o json`.
type doctorResult struct{ Name, Status, Evidence, Fix string }

// TestFlannel2388PMTUBlackHole answers flannel-io/flannel#2388 and #1039
// (UDP 8472 dropped by a hypervisor or a firewall: cross-node traffic gone
// and nothing says why), and the variant where only large VXLAN datagrams
// are dropped: a hop on the underlay (here the switch, by an nftables
// bridge rule) silently drops UDP 8472 datagrams longer than 1000 bytes and
// sends no ICMP "fragmentation needed", so small pod packets cross and
// large ones vanish. `weftctl doctor` on n1 must fail n2's probe and name
// the cause in each case: "UDP 8472 blocked" when every datagram is
// dropped, "MTU black hole" when only large ones are.
func TestFlannel2388PMTUBlackHole(t *testing.T) {
	if _, err := exec.LookPath("nft"); err != nil {
		nettest.CannotRun(t, nettest.SkipTools, "nft missing (test/setup.sh installs nftables)")
	}
	c := NewCluster(t, Options{Nodes: 2})
	n1, n2 := c.Nodes[0], c.Nodes[1]
	a, b := n1.CNI.AddPod(t, "a"), n2.CNI.AddPod(t, "b")
	Eventually(t, 5*time.Second, "a reaches b", func() error { return Ping(a.NS, b.IP, "-W", "1") })
	probe := "probe/" + n2.Addr.String()
	if ch, _ := doctorCheck(t, c, n1, probe); ch.Status != "ok" {
		t.Fatalf("healthy overlay: %+v", ch)
	}
	sw := c.Underlay.NS
	for _, tt := range []struct{ name, match, want string }{
		{"UDP 8472 dropped", "udp dport 8472", "UDP 8472 blocked on the path: " + n2.Addr.String() + " answers on the underlay"},
		{"large datagrams dropped", "udp dport 8472 ip length > 1000", "MTU black hole: small probes to " + n2.Subnet().Addr().String() + " come back"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			nettest.MustRun(t, sw, "nft", "add table bridge wefttest; add chain bridge wefttest hop { type filter hook forward priority 0; }; add rule bridge wefttest hop "+tt.match+" drop")
			t.Cleanup(func() { nettest.MustRun(t, sw, "nft", "delete table bridge wefttest") })
			small, large := Ping(a.NS, b.IP, "-W", "1"), Ping(a.NS, b.IP, "-W", "1", "-M", "do", "-s", "1400")
			if large == nil {
				t.Fatal("a 1428-byte DF ping crossed the rule: the test proves nothing")
			}
			if tt.name == "large datagrams dropped" && small != nil {
				t.Fatalf("a small ping no longer crosses: %v", small)
			}
			start := time.Now()
			ch, code := doctorCheck(t, c, n1, probe)
			if ch.Status != "fail" || code != 2 || !strings.Contains(ch.Evidence, tt.want) {
				t.Fatalf("doctor exit %d, %s: %+v; want fail with %q", code, probe, ch, tt.want)
			}
			recordFailure(t, "2388", fmt.Sprintf("%s: doctor names it in %s (%q)", tt.name, time.Since(start).Round(100*time.Millisecond), ch.Evidence))
			if tt.name == "large datagrams dropped" {
				out, codes := connectivityHosts(t, c)
				for _, what := range []string{n1.Addr.String() + " → " + n2.Addr.String(), n2.Addr.String() + " → " + n1.Addr.String()} {
					if want := "✗ " + what + ": MTU black hole: small packets cross, 1450-byte packets with DF set do not"; strings.Count(out[0], want) != 2 {
						t.Errorf("weftctl connectivity on n1 does not name the black hole %s in both matrices (exit %v):\n%s", what, codes, out[0])
					}
				}
				if codes[0] != 2 || codes[1] != 2 {
					t.Errorf("weftctl connectivity exit %v, want 2 on both nodes", codes)
				}
				t.Logf("weftctl connectivity on n1:\n%s", out[0])
			}
		})
	}
	out, codes := connectivityHosts(t, c)
	if codes[0] != 0 || codes[1] != 0 || strings.Count(out[0], "ok 1450") != 4 || strings.Contains(out[0], "black hole") {
		t.Errorf("rules gone: weftctl connectivity exit %v, want 0 with 4 DF probes of 1450 bytes ok:\n%s", codes, out[0])
	}
}

// connectivityHosts runs `weftctl connectivity` on every node at once, as
// on etcd hosts, with each node's conflist (the weft plugin) as the
// runtime's CNI config, and returns each node's output and exit status.
func connectivityHosts(t *testing.T, c *Cluster) ([]string, []int) {
	t.Helper()
	weftctl := nettest.Binary(t, "weftctl")
	outs, codes := make([]string, len(c.Nodes)), make([]int, len(c.Nodes))
	var wg sync.WaitGroup
	start := time.Now()
	defer func() { t.Logf("weftctl connectivity ran for %s", time.Since(start).Round(time.Millisecond)) }()
	for i, n := range c.Nodes {
		conf := t.TempDir()
		if err := os.WriteFile(filepath.Join(conf, "10-weft.conflist"), n.CNI.List.Bytes, 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := n.Command(context.Background(), weftctl, "connectivity", "--etcd-endpoints", c.Endpoints(),
			"--cni-conf-dir", conf, "--cni-bin-dir", filepath.Dir(c.weft), "--wait", "20s", "--count", "2")
		wg.Go(func() {
			b, err := cmd.CombinedOutput()
			outs[i] = string(b)
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				codes[i] = ee.ExitCode()
			} else if err != nil {
				codes[i] = -1
				outs[i] += err.Error()
			}
		})
	}
	wg.Wait()
	return outs, codes
}

// TestFlannel1317NFTablesHost answers flannel-io/flannel#1317 (on hosts
// with nf_tables and iptables rules, pods cannot leave the node): each
// variant sets a host firewall on both nodes before weftd starts, then pods
// on the two nodes ping each other. Where weft's own rules (WEFT-FWD in the
// iptables filter table) make the traffic flow, it must flow and `weftctl
// doctor` must find no firewall at fault. Where they cannot (a base chain
// of a native nftables table with policy drop drops a packet whatever
// another table accepted; nor does weft open the VXLAN port on input),
// doctor must fail naming the table and chain or the rule (or, where the
// kernel forwards the replies doctor makes it forward but not the pods' new
// connections, warn naming the chain as a suspect), and its fix, run as
// printed, must make the pods reach each other.
func TestFlannel1317NFTablesHost(t *testing.T) {
	for _, bin := range []string{"iptables-legacy", "iptables-nft", "nft"} {
		if _, err := exec.LookPath(bin); err != nil {
			nettest.CannotRun(t, nettest.SkipTools, bin+" missing (test/setup.sh installs iptables and nftables)")
		}
	}
	const inputBase = "add table inet filter; add chain inet filter input { type filter hook input priority 0; policy drop; }; " +
		"add rule inet filter input ct state established,related accept; add rule inet filter input iif lo accept; " +
		"add rule inet filter input icmp type echo-request accept"
	for _, tt := range []struct {
		name   string
		setup  []string // sh -c on each node
		check  string   // the doctor check that must fail or warn on n1 ("": traffic flows)
		want   string   // in its evidence
		traced string   // firewall/input: in n2's evidence once n1 took its fix
		warn   bool     // the check warns: the kernel let doctor's probes through, but not the pods' traffic
	}{
		{"iptables-legacy FORWARD policy DROP", []string{"iptables-legacy -P FORWARD DROP"}, "", "", "", false},
		{"iptables-nft FORWARD policy DROP", []string{"iptables-nft -P FORWARD DROP"}, "", "", "", false},
		{"iptables-nft INPUT policy DROP", []string{"iptables-nft -A INPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT && iptables-nft -A INPUT -i lo -j ACCEPT && " +
			"iptables-nft -A INPUT -p icmp -j ACCEPT && iptables-nft -P INPUT DROP"},
			"firewall/input", "suspects only: table ip filter chain INPUT policy drop", "the kernel dropped it in table ip filter chain INPUT by its policy drop", false},
		{"nftables forward policy drop", []string{"nft 'add table inet filter; add chain inet filter forward { type filter hook forward priority 0; policy drop; }; " +
			"add rule inet filter forward ct state established,related accept'"},
			"firewall/forward", "as the reply of a flow (table inet filter chain forward rule 2 test its conntrack state or protocol), so new connections between pods may meet another verdict; " +
				"suspects only: table inet filter chain forward policy drop", "", true},
		{"nftables input policy drop", []string{"nft '" + inputBase + "'"},
			"firewall/input", "suspects only: table inet filter chain input policy drop", "the kernel dropped it in table inet filter chain input by its policy drop", false},
		{"nftables rule drops UDP 8472", []string{"nft 'add table inet filter; add chain inet filter input { type filter hook input priority 0; }; add rule inet filter input udp dport 8472 drop'"},
			"firewall/input", "suspects only: table inet filter chain input rule handle", "the kernel dropped it in table inet filter chain input by rule handle", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := NewCluster(t, Options{})
			c.OnNode = func(n *Node) {
				for _, cmd := range tt.setup {
					nettest.MustRun(t, n, "sh", "-c", cmd)
				}
			}
			n1, n2 := c.AddNode("n1"), c.AddNode("n2")
			n1.WaitReady()
			n2.WaitReady()
			a, b := n1.CNI.AddPod(t, "a"), n2.CNI.AddPod(t, "b")
			reach := func() error {
				if err := Ping(a.NS, b.IP, "-W", "1"); err != nil {
					return err
				}
				return Ping(b.NS, a.IP, "-W", "1")
			}
			firewall := func() []doctorResult {
				checks, _ := doctorChecks(t, c, n1)
				var out []doctorResult
				for _, ch := range checks {
					if strings.HasPrefix(ch.Name, "firewall/") && ch.Status == "fail" {
						out = append(out, ch)
					}
				}
				return out
			}
			if tt.check == "" {
				Eventually(t, 5*time.Second, "pods reach each other", reach)
				if bad := firewall(); len(bad) > 0 {
					t.Errorf("traffic flows but doctor fails a firewall check: %+v", bad)
				} else {
					recordFailure(t, "1317", tt.name+": pods reach each other, no firewall check of doctor fails")
				}
				return
			}
			if err := reach(); err == nil {
				t.Fatal("pods reach each other through the host firewall: the test proves nothing")
			}
			// Both nodes drop the VXLAN port: n2 drops n1's probes, so no
			// reply reaches n1's chains and n1's doctor can only name its
			// suspects (a warning). Once n1 takes its fix, n2's probes are
			// answered and n2's kernel traces the replies to its rule.
			status := map[bool]string{true: "warn", false: "fail"}[tt.traced != "" || tt.warn]
			ch, code := doctorCheck(t, c, n1, tt.check)
			if ch.Status != status || code < map[string]int{"warn": 1, "fail": 2}[status] || !strings.Contains(ch.Evidence, tt.want) {
				t.Fatalf("doctor exit %d, %+v; want %s %s with %q", code, ch, tt.check, status, tt.want)
			}
			recordFailure(t, "1317", fmt.Sprintf("%s: doctor's %s names it (%q)", tt.name, ch.Name, ch.Evidence))
			fixes := map[*Node]string{n1: ch.Fix, n2: ch.Fix}
			if tt.traced != "" {
				nettest.MustRun(t, n1, "sh", "-c", strings.TrimPrefix(ch.Fix, "if a suspect drops them: "))
				ch, code = doctorCheck(t, c, n2, tt.check)
				if ch.Status != "fail" || code != 2 || !strings.Contains(ch.Evidence, tt.traced) {
					t.Fatalf("doctor on n2 after n1's fix: exit %d, %+v; want %s to fail with %q", code, ch, tt.check, tt.traced)
				}
				fixes = map[*Node]string{n2: ch.Fix}
			}
			for n, fix := range fixes {
				if _, after, ok := strings.Cut(fix, ", or "); ok {
					fix = after
				}
				if _, after, ok := strings.Cut(fix, "drops pods' traffic: "); ok {
					fix = after
				}
				nettest.MustRun(t, n, "sh", "-c", strings.ReplaceAll(fix, "iptables ", "iptables-nft "))
			}
			Eventually(t, 5*time.Second, "pods reach each other after doctor's fix", reach)
			if bad := firewall(); len(bad) > 0 {
				t.Errorf("doctor still fails after its fix: %+v", bad)
			}
		})
	}
}
