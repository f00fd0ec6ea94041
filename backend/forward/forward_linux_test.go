package forward

import (
	"context"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/testkit/nettest"
)

var (
	network  = netip.MustParsePrefix("10.244.0.0/16")
	network6 = netip.MustParsePrefix("fd00:10:244::/56")
)

func TestRulesText(t *testing.T) {
	want := []string{
		"-N WEFT-FWD",
		"-A WEFT-FWD -s 10.244.0.0/16 -j ACCEPT",
		"-A WEFT-FWD -d 10.244.0.0/16 -j ACCEPT",
	}
	if got := Rules(network); !slices.Equal(got, want) {
		t.Errorf("Rules = %q, want %q", got, want)
	}
	if got := Rules(network6)[1]; got != "-A WEFT-FWD -s fd00:10:244::/56 -j ACCEPT" {
		t.Errorf("IPv6 rule %q", got)
	}
	if got := Rules(netip.MustParsePrefix("0.0.0.0/0"))[2]; got != "-A WEFT-FWD -j ACCEPT" {
		t.Errorf("rule for a /0 %q", got)
	}
}

func needTools(t *testing.T) {
	t.Helper()
	for _, b := range []string{"iptables-legacy", "iptables-nft", "ip6tables-legacy", "ip6tables-nft", "nft", "ping"} {
		if _, err := exec.LookPath(b); err != nil {
			nettest.CannotRun(t, nettest.SkipTools, b+" missing (test/setup.sh installs iptables and nftables)")
		}
	}
}

// lab is a node forwarding between a pod (10.244.1.2, fd00:10:244:1::2) and
// a host outside the cluster network (192.168.50.2, fd50::2); each has a
// route back through the node.
type lab struct{ node, pod, ext *nettest.NS }

func newLab(t *testing.T) *lab {
	t.Helper()
	needTools(t)
	l := &lab{node: nettest.NewNS(t, "node"), pod: nettest.NewNS(t, "pod"), ext: nettest.NewNS(t, "ext")}
	for _, p := range []struct {
		ns                   *nettest.NS
		link, gw, gw6, a, a6 string
	}{
		{l.pod, "v-pod", "10.244.1.1/24", "fd00:10:244:1::1/64", "10.244.1.2/24", "fd00:10:244:1::2/64"},
		{l.ext, "v-ext", "192.168.50.1/24", "fd50::1/64", "192.168.50.2/24", "fd50::2/64"},
	} {
		nettest.Veth(t, p.ns, "eth0", l.node, p.link)
		nettest.MustRun(t, l.node, "ip", "addr", "add", p.gw, "dev", p.link)
		nettest.MustRun(t, l.node, "ip", "addr", "add", p.gw6, "dev", p.link, "nodad")
		nettest.MustRun(t, p.ns, "ip", "addr", "add", p.a, "dev", "eth0")
		nettest.MustRun(t, p.ns, "ip", "addr", "add", p.a6, "dev", "eth0", "nodad")
		nettest.MustRun(t, p.ns, "ip", "route", "add", "default", "via", strings.Split(p.gw, "/")[0])
		nettest.MustRun(t, p.ns, "ip", "-6", "route", "add", "default", "via", strings.Split(p.gw6, "/")[0])
	}
	nettest.MustRun(t, l.node, "sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1")
	return l
}

// reaches reports whether ext gets an answer from the pod, in each family.
func (l *lab) reaches() (v4, v6 bool) {
	_, e4 := l.ext.Run("ping", "-c1", "-W1", "10.244.1.2")
	_, e6 := l.ext.Run("ping", "-6", "-c1", "-W1", "fd00:10:244:1::2")
	return e4 == nil, e6 == nil
}

// start runs a Forwarder inside ns until the test ends (or stop is called)
// and waits for its first pass.
func start(t *testing.T, ns *nettest.NS, cfg Config) (*Forwarder, func()) {
	t.Helper()
	if cfg.CheckInterval == 0 {
		cfg.CheckInterval = 100 * time.Millisecond // iptables-legacy's, which has no notifications
	}
	if cfg.Resync == 0 {
		// The full check never comes within a test: iptables-nft's rules
		// are repaired by the kernel's notification of the change.
		cfg.Resync = time.Hour
	}
	f, err := New(cfg, slog.New(slog.NewTextHandler(t.Output(), nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ns.Do(func() error { return f.Run(ctx) }) }()
	stop := sync.OnceFunc(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	t.Cleanup(stop)
	select {
	case <-f.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("forwarder not ready within 10s")
	}
	return f, stop
}

// TestForwardPolicyDrop: with the FORWARD policy DROP set through
// iptables-nft or iptables-legacy, the rules let pod traffic through in
// both families; they are repaired after each kind of damage, kept when
// Run returns, and removed by a run with Accept off.
// With iptables-nft the forwarder runs with no iptables binary on PATH (as
// in weft's image); the test runs them by their full path.
func TestForwardPolicyDrop(t *testing.T) {
	for _, backend := range []string{legacy, nft} {
		t.Run(backend, func(t *testing.T) {
			l := newLab(t)
			ipt, ip6t := lookPath(t, "iptables-"+backend), lookPath(t, "ip6tables-"+backend)
			if backend == nft {
				noIptablesOnPath(t)
			}
			nettest.MustRun(t, l.node, ipt, "-P", "FORWARD", "DROP")
			nettest.MustRun(t, l.node, ip6t, "-P", "FORWARD", "DROP")
			if v4, v6 := l.reaches(); v4 || v6 {
				t.Fatalf("pod reachable with policy DROP and no rules (%v %v): the lab is wrong", v4, v6)
			}
			f, stop := start(t, l.node, Config{Network: network, IPv6Network: network6, Accept: true})
			check := func(t *testing.T) {
				t.Helper()
				if v4, v6 := l.reaches(); !v4 || !v6 {
					t.Fatalf("pod not reachable through FORWARD policy DROP: IPv4 %v, IPv6 %v\n%s", v4, v6,
						nettest.MustRun(t, l.node, ipt, "-S"))
				}
				for _, c := range []struct {
					ipt string
					n   netip.Prefix
				}{{ipt, network}, {ip6t, network6}} {
					got := listing(t, l.node, c.ipt, "-S", Chain)
					if !slices.Equal(got, Rules(c.n)) {
						t.Errorf("%s -S %s = %q", c.ipt, Chain, got)
					}
					if fwd := nettest.MustRun(t, l.node, c.ipt, "-S", "FORWARD"); strings.Count(fwd, Jump+"\n") != 1 {
						t.Errorf("want one jump to %s in %s FORWARD:\n%s", Chain, c.ipt, fwd)
					}
				}
			}
			t.Run("programmed", check)
			if backend == nft {
				if out := nettest.MustRun(t, l.node, "cat", "/proc/net/ip_tables_names"); out != "" {
					t.Errorf("iptables-legacy tables created, though not in use: %q", out)
				}
			} else if out := nettest.MustRun(t, l.node, "nft", "list", "tables"); out != "" {
				t.Errorf("nftables tables created, though iptables-nft is not in use:\n%s", out)
			}
			for _, br := range [][]string{
				{ipt, "-D", "FORWARD", "-j", Chain},
				{ipt, "-D", Chain, "-s", network.String(), "-j", "ACCEPT"},
				{ipt, "-I", Chain, "-s", "10.0.0.0/8", "-j", "DROP"},
				{ipt, "-A", "FORWARD", "-j", Chain},
				{ipt, "-F", Chain},
				{ip6t, "-F", Chain},
				{ip6t, "-D", "FORWARD", "-j", Chain},
			} {
				t.Run("repaired after "+filepath.Base(br[0])+" "+strings.Join(br[1:], " "), func(t *testing.T) {
					before := f.Repairs()
					nettest.MustRun(t, l.node, br...)
					deadline := time.Now().Add(5 * time.Second)
					for f.Repairs() == before && time.Now().Before(deadline) {
						time.Sleep(20 * time.Millisecond)
					}
					if f.Repairs() == before {
						t.Fatalf("not repaired within 5s:\n%s", nettest.MustRun(t, l.node, ipt, "-S"))
					}
					check(t)
				})
			}
			stop()
			t.Run("kept after Run returns", check)
			t.Run("repaired after a restart", func(t *testing.T) {
				// The rules an earlier Run left are weft's: rewriting them
				// later is a repair, counted and logged as one.
				f, stop := start(t, l.node, Config{Network: network, IPv6Network: network6, Accept: true})
				defer stop()
				nettest.MustRun(t, l.node, ipt, "-D", "FORWARD", "-j", Chain)
				deadline := time.Now().Add(5 * time.Second)
				for f.Repairs() == 0 && time.Now().Before(deadline) {
					time.Sleep(20 * time.Millisecond)
				}
				if f.Repairs() == 0 {
					t.Fatalf("a rewrite after a restart was not counted as a repair:\n%s", nettest.MustRun(t, l.node, ipt, "-S"))
				}
				check(t)
			})

			start(t, l.node, Config{Network: network, IPv6Network: network6, Accept: false})
			for _, b := range []string{ipt, ip6t} {
				if out := nettest.MustRun(t, l.node, b, "-S"); strings.Contains(out, Chain) {
					t.Errorf("%s still has weft's rules with Accept off:\n%s", b, out)
				}
			}
			if v4, v6 := l.reaches(); v4 || v6 {
				t.Errorf("pod reachable after the rules were removed (%v %v)", v4, v6)
			}
		})
	}
}

// lookPath is the full path of the binary name.
func lookPath(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		nettest.CannotRun(t, nettest.SkipTools, name+" missing (test/setup.sh installs iptables and nftables)")
	}
	return p
}

// noIptablesOnPath sets PATH, until the test ends, to a directory that
// holds the other commands the tests run (ip runs every command in a
// namespace) but no iptables binary.
func noIptablesOnPath(t *testing.T) {
	t.Helper()
	dir := t.TempDir()
	for _, b := range []string{"ip", "ping", "cat", "nft", "sysctl"} {
		if err := os.Symlink(lookPath(t, b), filepath.Join(dir, b)); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", dir)
	for _, b := range []string{"iptables", "iptables-nft", "ip6tables-nft", "iptables-legacy", "ip6tables-legacy"} {
		if _, err := exec.LookPath(b); err == nil {
			t.Fatalf("%s still on PATH", b)
		}
	}
}

// listing is the output of an iptables command without its warnings.
func listing(t *testing.T, n *nettest.NS, argv ...string) []string {
	t.Helper()
	var out []string
	for l := range strings.SplitSeq(strings.TrimSpace(nettest.MustRun(t, n, argv...)), "\n") {
		if !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return out
}

// TestNothingInUse: on a node where no iptables table is in use, Run
// creates none (asking iptables-legacy for a table would load it).
func TestNothingInUse(t *testing.T) {
	needTools(t)
	n := nettest.NewNS(t, "node")
	start(t, n, Config{Network: network, IPv6Network: network6, Accept: true})
	time.Sleep(300 * time.Millisecond) // a few checks
	for _, f := range []string{"/proc/net/ip_tables_names", "/proc/net/ip6_tables_names"} {
		if out, _ := n.Run("cat", f); strings.TrimSpace(out) != "" {
			t.Errorf("%s lists %q: a legacy table was created", f, out)
		}
	}
	if out := nettest.MustRun(t, n, "nft", "list", "ruleset"); strings.TrimSpace(out) != "" {
		t.Errorf("nftables holds tables:\n%s", out)
	}
}

// TestFlannelLeftovers: FLANNEL-FWD and FLANNEL-POSTRTG, with their jumps,
// in both backends and families, and flanneld's nftables tables, are gone
// after the first pass, with Accept on and off; other rules stay.
func TestFlannelLeftovers(t *testing.T) {
	for _, accept := range []bool{true, false} {
		t.Run(map[bool]string{true: "accept", false: "no accept"}[accept], func(t *testing.T) {
			needTools(t)
			n := nettest.NewNS(t, "node")
			var bins []string
			for _, b := range []string{"iptables-legacy", "iptables-nft", "ip6tables-legacy", "ip6tables-nft"} {
				bins = append(bins, b)
				for _, argv := range [][]string{
					{"-N", "FLANNEL-FWD"},
					{"-A", "FLANNEL-FWD", "-s", "10.0.0.0/8", "-m", "comment", "--comment", "flanneld forward", "-j", "ACCEPT"},
					{"-A", "FORWARD", "-m", "comment", "--comment", "flanneld forward", "-j", "FLANNEL-FWD"},
					{"-N", "USER-FWD"},
					{"-A", "FORWARD", "-j", "USER-FWD"},
					{"-t", "nat", "-N", "FLANNEL-POSTRTG"},
					{"-t", "nat", "-A", "FLANNEL-POSTRTG", "-m", "mark", "--mark", "0x4000/0x4000", "-j", "RETURN"},
					{"-t", "nat", "-A", "POSTROUTING", "-m", "comment", "--comment", "flanneld masq", "-j", "FLANNEL-POSTRTG"},
				} {
					if strings.HasPrefix(b, "ip6") && slices.Contains(argv, "10.0.0.0/8") {
						argv = slices.Replace(slices.Clone(argv), 3, 4, "fd00::/8")
					}
					nettest.MustRun(t, n, append([]string{b}, argv...)...)
				}
			}
			for _, tb := range []string{"ip flannel-ipv4", "ip6 flannel-ipv6"} {
				nettest.MustRun(t, n, append([]string{"nft", "add", "table"}, strings.Fields(tb)...)...)
			}
			// weft's masquerade is not in place yet: flanneld's forward
			// chain goes, its masquerade stays.
			nat := make(chan struct{})
			start(t, n, Config{Network: network, IPv6Network: network6, Accept: accept, NATReady: nat})
			time.Sleep(300 * time.Millisecond)
			for _, b := range bins {
				if out := nettest.MustRun(t, n, b, "-S"); strings.Contains(out, "FLANNEL") {
					t.Errorf("%s still has flanneld's forward chain:\n%s", b, out)
				}
				if out := nettest.MustRun(t, n, b, "-t", "nat", "-S"); !strings.Contains(out, "-A POSTROUTING -m comment --comment \"flanneld masq\" -j FLANNEL-POSTRTG") {
					t.Errorf("%s: flanneld's masquerade removed before weft's was in place:\n%s", b, out)
				}
			}
			if out := nettest.MustRun(t, n, "nft", "list", "tables"); !strings.Contains(out, "flannel-ipv4") {
				t.Errorf("flanneld's nftables tables removed before weft's masquerade was in place: %s", out)
			}
			close(nat)
			deadline := time.Now().Add(5 * time.Second)
			for {
				left := ""
				for _, b := range bins {
					if out := nettest.MustRun(t, n, b, "-S") + nettest.MustRun(t, n, b, "-t", "nat", "-S"); strings.Contains(out, "FLANNEL") {
						left += b + ":\n" + out
					}
				}
				if out := nettest.MustRun(t, n, "nft", "list", "tables"); strings.Contains(out, "flannel") {
					left += "nftables: " + out
				}
				if left == "" {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("flanneld's rules left after weft's masquerade was in place:\n%s", left)
				}
				time.Sleep(50 * time.Millisecond)
			}
			for _, b := range bins {
				if out := nettest.MustRun(t, n, b, "-S"); !strings.Contains(out, "-A FORWARD -j USER-FWD") {
					t.Errorf("%s lost a rule that is not flanneld's:\n%s", b, out)
				}
			}
		})
	}
}

// TestNFTAsBinaryWrites: the rules weft writes through nftables are the
// ones the iptables-nft binary writes for the same commands, compared in two
// namespaces by iptables-nft's own listings and by the kernel's
// expressions, for prefixes that end on a byte boundary and inside a byte.
// The forwarder runs with no iptables binary on PATH. Afterwards
// iptables-nft still changes the table, weft's rules included.
func TestNFTAsBinaryWrites(t *testing.T) {
	for _, tc := range []struct{ name, v4, v6 string }{
		{"byte boundary", "10.244.0.0/16", "fd00:10:244::/56"},
		{"inside a byte", "10.240.0.0/12", "fd00:10:244::/57"},
		{"everything", "0.0.0.0/0", "::/0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			needTools(t)
			ipt, ip6t := lookPath(t, "iptables-nft"), lookPath(t, "ip6tables-nft")
			save, save6 := lookPath(t, "iptables-nft-save"), lookPath(t, "ip6tables-nft-save")
			n4, n6 := netip.MustParsePrefix(tc.v4), netip.MustParsePrefix(tc.v6)
			native, bin := nettest.NewNS(t, "native"), nettest.NewNS(t, "binary")
			for _, ns := range []*nettest.NS{native, bin} {
				nettest.MustRun(t, ns, ipt, "-P", "FORWARD", "DROP")
				nettest.MustRun(t, ns, ip6t, "-P", "FORWARD", "DROP")
			}
			for _, c := range []struct {
				ipt string
				n   netip.Prefix
			}{{ipt, n4}, {ip6t, n6}} {
				for _, l := range append(Rules(c.n), Jump) {
					nettest.MustRun(t, bin, append([]string{c.ipt}, strings.Fields(l)...)...)
				}
			}
			noIptablesOnPath(t)
			_, stop := start(t, native, Config{Network: n4, IPv6Network: n6, Accept: true})
			stop()

			for _, argv := range [][]string{{ipt, "-S"}, {ip6t, "-S"}, {save}, {save6}} {
				got, want := listing(t, native, argv...), listing(t, bin, argv...)
				if !slices.Equal(got, want) {
					t.Errorf("%s lists weft's rules\n%s\nand the binary's\n%s", filepath.Base(argv[0]),
						strings.Join(got, "\n"), strings.Join(want, "\n"))
				}
			}
			if got, want := netlinkDump(t, native), netlinkDump(t, bin); got != want {
				t.Errorf("the kernel holds weft's rules as\n%s\nand the binary's as\n%s", got, want)
			}

			for _, argv := range [][]string{
				{ipt, "-C", Chain, "-s", tc.v4, "-j", "ACCEPT"},
				{ip6t, "-C", Chain, "-d", tc.v6, "-j", "ACCEPT"},
				{ipt, "-I", "FORWARD", "-s", "192.0.2.1", "-j", "DROP"},
				{ipt, "-D", "FORWARD", "-j", Chain},
				{ip6t, "-D", "FORWARD", "-j", Chain},
				{ipt, "-D", Chain, "-d", tc.v4, "-j", "ACCEPT"},
				{ipt, "-A", Chain, "-d", "192.0.2.2", "-j", "ACCEPT"},
				{ipt, "-D", "FORWARD", "-s", "192.0.2.1", "-j", "DROP"},
				{ip6t, "-F", Chain},
				{ip6t, "-X", Chain},
			} {
				if out := nettest.MustRun(t, native, argv...); out != "" {
					t.Errorf("%s: %s", strings.Join(argv, " "), out)
				}
			}
			want := []string{"-P INPUT ACCEPT", "-P FORWARD DROP", "-P OUTPUT ACCEPT", "-N " + Chain,
				Rules(n4)[1], "-A " + Chain + " -d 192.0.2.2/32 -j ACCEPT"}
			if got := listing(t, native, ipt, "-S"); !slices.Equal(got, want) {
				t.Errorf("after iptables-nft's changes, iptables-nft -S =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
		})
	}
}

// netlinkDump is nft's listing of the kernel's expressions in n, without
// rule handles.
func netlinkDump(t *testing.T, n *nettest.NS) string {
	t.Helper()
	var out []string
	for l := range strings.SplitSeq(nettest.MustRun(t, n, "nft", "--debug=netlink", "list", "ruleset"), "\n") {
		if strings.HasPrefix(l, "ip filter ") || strings.HasPrefix(l, "ip6 filter ") {
			l = strings.Join(strings.Fields(l)[:3], " ") // family, table, chain
		}
		out = append(out, l)
	}
	return strings.Join(out, "\n")
}
