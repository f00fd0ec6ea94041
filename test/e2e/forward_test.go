package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/testkit/nettest"
)

// TestForwardPolicyDrop runs two nodes as flanneld would run (weftd
// installed as flanneld, Flannel's defaults: no --ip-masq) on hosts whose
// iptables FORWARD policy is DROP, set once through iptables-nft and once
// through iptables-legacy. Pods on the two nodes reach each other through
// weft's WEFT-FWD rules; a deleted jump is put back; the rules stay while
// weftd is stopped; with --iptables-forward-rules=false they are removed and
// the pods no longer reach each other. n1 also starts with flanneld's
// leftovers (FLANNEL-FWD, FLANNEL-POSTRTG in both backends, its nftables
// tables), which weftd removes. With iptables-nft, n2's weftd runs with no
// iptables binary on PATH, as in weft's image.
func TestForwardPolicyDrop(t *testing.T) {
	for _, bin := range []string{"iptables-legacy", "iptables-nft", "ip6tables-legacy", "ip6tables-nft", "nft"} {
		if _, err := exec.LookPath(bin); err != nil {
			nettest.CannotRun(t, nettest.SkipTools, bin+" missing (test/setup.sh installs iptables and nftables)")
		}
	}
	for _, backend := range []string{"nft", "legacy"} {
		t.Run(backend, func(t *testing.T) { testForwardPolicyDrop(t, "iptables-"+backend) })
	}
}

func testForwardPolicyDrop(t *testing.T, ipt string) {
	c := NewCluster(t, Options{})
	flanneld := filepath.Join(c.Dir, "bin", "flanneld")
	if err := os.MkdirAll(filepath.Dir(flanneld), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(c.weftd, flanneld); err != nil {
		t.Fatal(err)
	}
	c.OnNode = func(n *Node) {
		n.Prog = flanneld
		nettest.MustRun(t, n, ipt, "-P", "FORWARD", "DROP")
		if n.Label == "n1" {
			flannelLeftovers(t, n.NS)
		}
		if n.Label == "n2" && ipt == "iptables-nft" {
			n.Env = []string{"PATH=" + t.TempDir()}
		}
	}
	n1, n2 := c.AddNode("n1", "--iptables-resync=1"), c.AddNode("n2", "--iptables-resync=1")
	n1.WaitReady()
	n2.WaitReady()
	a, b := n1.CNI.AddPod(t, "a"), n2.CNI.AddPod(t, "b")
	reach := func(t *testing.T) {
		t.Helper()
		Eventually(t, 5*time.Second, "pods reach each other across nodes with FORWARD policy DROP", func() error {
			if err := Ping(a.NS, b.IP); err != nil {
				return err
			}
			return Ping(b.NS, a.IP)
		})
	}
	t.Run("pods reach each other", reach)

	t.Run("flanneld's leftovers removed", func(t *testing.T) {
		Eventually(t, 5*time.Second, "flanneld's chains and tables gone on n1", func() error {
			for _, b := range []string{"iptables-legacy", "iptables-nft", "ip6tables-legacy", "ip6tables-nft"} {
				out := Output(t, n1.NS, b, "-S") + Output(t, n1.NS, b, "-t", "nat", "-S")
				if strings.Contains(out, "FLANNEL") {
					return fmt.Errorf("%s:\n%s", b, out)
				}
			}
			if out := Output(t, n1.NS, "nft", "list", "tables"); strings.Contains(out, "flannel") {
				return fmt.Errorf("nft tables: %s", out)
			}
			return nil
		})
		if log, _ := os.ReadFile(n1.LogFile); !strings.Contains(string(log), "removed flanneld's leftover chain") {
			t.Errorf("n1 did not log the removal:\n%s", tail(string(log), 30))
		}
	})

	t.Run("a deleted jump is put back", func(t *testing.T) {
		Output(t, n2.NS, ipt, "-D", "FORWARD", "-j", "WEFT-FWD")
		Eventually(t, 5*time.Second, "jump to WEFT-FWD back on n2", func() error {
			if out := Output(t, n2.NS, ipt, "-S", "FORWARD"); !strings.Contains(out, "-A FORWARD -j WEFT-FWD") {
				return fmt.Errorf("%s", out)
			}
			return nil
		})
		reach(t)
	})

	t.Run("rules kept while weftd is stopped", func(t *testing.T) {
		n2.Stop()
		if out := Output(t, n2.NS, ipt, "-S", "WEFT-FWD"); !strings.Contains(out, "-j ACCEPT") {
			t.Errorf("WEFT-FWD after SIGTERM:\n%s", out)
		}
		reach(t)
		n2.Start()
		n2.WaitReady()
	})

	t.Run("--iptables-forward-rules=false removes them", func(t *testing.T) {
		for _, n := range []*Node{n1, n2} {
			n.Stop()
			n.Args = append(n.Args, "--iptables-forward-rules=false")
			n.Start()
			n.WaitReady()
		}
		for _, n := range []*Node{n1, n2} {
			Eventually(t, 5*time.Second, "WEFT-FWD gone on "+n.Label, func() error {
				if out := Output(t, n.NS, ipt, "-S"); strings.Contains(out, "WEFT-FWD") {
					return fmt.Errorf("%s", out)
				}
				return nil
			})
		}
		if err := Ping(a.NS, b.IP); err == nil {
			t.Errorf("pods reach each other through FORWARD policy DROP without weft's rules: the test proves nothing")
		}
	})
}

// flannelLeftovers writes what flanneld leaves on a node into ns: its
// chains in both iptables backends and families, and its nftables tables.
func flannelLeftovers(t *testing.T, ns *nettest.NS) {
	t.Helper()
	for _, b := range []string{"iptables-legacy", "iptables-nft", "ip6tables-legacy", "ip6tables-nft"} {
		network := "10.244.0.0/16"
		if strings.HasPrefix(b, "ip6") {
			network = "fd00:10:244::/56"
		}
		for _, argv := range [][]string{
			{"-N", "FLANNEL-FWD"},
			{"-A", "FLANNEL-FWD", "-s", network, "-m", "comment", "--comment", "flanneld forward", "-j", "ACCEPT"},
			{"-A", "FORWARD", "-m", "comment", "--comment", "flanneld forward", "-j", "FLANNEL-FWD"},
			{"-t", "nat", "-N", "FLANNEL-POSTRTG"},
			{"-t", "nat", "-A", "FLANNEL-POSTRTG", "-m", "mark", "--mark", "0x4000/0x4000", "-m", "comment", "--comment", "flanneld masq", "-j", "RETURN"},
			{"-t", "nat", "-A", "POSTROUTING", "-m", "comment", "--comment", "flanneld masq", "-j", "FLANNEL-POSTRTG"},
		} {
			nettest.MustRun(t, ns, append([]string{b}, argv...)...)
		}
	}
	nettest.MustRun(t, ns, "nft", "add", "table", "ip", "flannel-ipv4")
	nettest.MustRun(t, ns, "nft", "add", "table", "ip6", "flannel-ipv6")
}
