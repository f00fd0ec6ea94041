package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/subnet"
)

// TestWireGuard runs three wireguard nodes (in-process WireGuard: this
// kernel has no module) and checks Flannel's lease and key file, pod
// traffic, that the underlay carries only WireGuard UDP to 51820 and no
// plaintext pod packet, a restart that keeps the key, a peer whose key
// changes, and a removed lease.
func TestWireGuard(t *testing.T) {
	c := NewCluster(t, Options{NoConfig: true})
	c.Put(Prefix+"/config", `{"Network":"10.244.0.0/16","Backend":{"Type":"wireguard"}}`)
	keyFile := func(n *Node) string { return filepath.Join(c.Dir, n.Label, "wgkey") }
	c.OnNode = func(n *Node) { n.Env = []string{"WIREGUARD_KEY_FILE=" + keyFile(n)} }
	for _, l := range []string{"n1", "n2", "n3"} {
		c.AddNode(l)
	}
	for _, n := range c.Nodes {
		n.WaitReady()
	}
	n1, n2, n3 := c.Nodes[0], c.Nodes[1], c.Nodes[2]
	pods := podsPerNode(t, c, 1)
	pingAll := func(t *testing.T) {
		t.Helper()
		for i, from := range pods {
			for j, to := range pods {
				if i != j {
					Eventually(t, 10*time.Second, fmt.Sprintf("n%d → n%d", i+1, j+1), func() error {
						return Ping(from[0].NS, to[0].IP, "-W", "1")
					})
				}
			}
		}
	}

	t.Run("lease and key file as Flannel's", func(t *testing.T) {
		for _, n := range c.Nodes {
			key := readKey(t, keyFile(n))
			fi, err := os.Stat(keyFile(n))
			if err != nil || fi.Mode().Perm() != 0o400 {
				t.Errorf("%s key file mode %v (%v), want 0400", n.Label, fi.Mode(), err)
			}
			raw := c.leaseJSON(t, n.Subnet())
			want := fmt.Sprintf(`{"PublicIP":"%s","PublicIPv6":null,"BackendType":"wireguard","BackendData":{"PublicKey":"%s","Port":51820}}`,
				n.Addr, key.PublicKey())
			if raw != want {
				t.Errorf("%s lease\n got %s\nwant %s", n.Label, raw, want)
			}
		}
		if mtu := fileMTU(t, n1); mtu != 1420 {
			t.Errorf("FLANNEL_MTU %d, want 1420", mtu)
		}
		if got := Output(t, n1.NS, "ip", "route", "show", "10.244.0.0/16"); !strings.HasPrefix(got, "10.244.0.0/16 dev flannel-wg proto 87 scope link") {
			t.Errorf("cluster route %q", got)
		}
	})

	t.Run("pods ping across, only WireGuard on the wire", func(t *testing.T) {
		pingAll(t)
		lines := capture(t, n1, "not ip6", func() {
			if err := Ping(pods[0][0].NS, pods[1][0].IP); err != nil {
				t.Error(err)
			}
			if _, err := Transfer(pods[0][0].NS, pods[2][0].NS, pods[2][0].IP, 1<<20); err != nil {
				t.Error(err)
			}
		})
		udp := 0
		for _, l := range lines {
			switch {
			case strings.Contains(l, "10.244."):
				t.Errorf("plaintext pod packet on the underlay: %s", l)
			case linkControl(l):
			case strings.Contains(l, ".51820") && strings.Contains(l, "UDP"):
				udp++
			default:
				t.Errorf("not WireGuard UDP to 51820: %s", l)
			}
		}
		if udp < 10 {
			t.Errorf("only %d WireGuard datagrams captured:\n%s", udp, strings.Join(lines, "\n"))
		}
	})

	t.Run("doctor finds the WireGuard device and traces through it", func(t *testing.T) {
		pingAll(t) // the pods' neighbour entries, for doctor's forward probes
		checks, _ := doctorChecks(t, c, n1)
		want := map[string]string{
			"overlay/device":            `^flannel-wg \(wireguard, MTU 1420, up`,
			"probe/" + n2.Addr.String(): `over the overlay: 3/3`,
			"firewall/input":            `^UDP 51820 \(WireGuard\) from peer \S+ \(\S+\) over IPv4: the kernel accepted it`,
			"firewall/forward":          `: the kernel forwarded it: `,
			"underlay/mtu":              `^flannel-wg MTU 1420 \+ 60 ≤ eth0 MTU 1500`,
		}
		seen := map[string]bool{}
		for _, ch := range checks {
			if re, ok := want[ch.Name]; ok {
				seen[ch.Name] = true
				if ch.Status != "ok" || !regexp.MustCompile(re).MatchString(ch.Evidence) {
					t.Errorf("%s: %s %q, want ok matching %q", ch.Name, ch.Status, ch.Evidence, re)
				}
			}
		}
		if len(seen) != len(want) {
			t.Errorf("doctor on n1 ran %v of the checks %v: %+v", seen, want, checks)
		}
	})

	t.Run("doctor: WireGuard accepted by interface, on the underlay's only", func(t *testing.T) {
		// n1's input chain drops by policy and accepts UDP 51820 from one
		// interface (and loopback and ICMP, which doctor's probes need;
		// the nodes reach etcd over a unix socket): from eth0, the
		// underlay, every peer's datagrams are accepted by that rule; from
		// eth1 the kernel drops them by the policy, and doctor says so for
		// each peer. No conntrack accept: WireGuard's datagrams share one
		// tuple both ways, so it would take them before the interface rule.
		for _, iif := range []string{"eth0", "eth1"} {
			pingAll(t)
			nettest.MustRun(t, n1.NS, "nft", "add table inet wefttest; add chain inet wefttest in { type filter hook input priority 0; policy drop; }; "+
				"add rule inet wefttest in iif lo accept; add rule inet wefttest in meta l4proto icmp accept; "+
				"add rule inet wefttest in iifname "+iif+" udp dport 51820 accept")
			checks := func() []doctorResult {
				defer nettest.MustRun(t, n1.NS, "nft", "delete table inet wefttest") // also when doctorChecks fails the test
				checks, _ := doctorChecks(t, c, n1)                                  // exit 2 whatever the firewall: no CNI config in its directory
				return checks
			}()
			want := `^UDP 51820 \(WireGuard\) from peer %s \(\S+\) over IPv4: the kernel accepted it: table inet wefttest chain in by rule handle \d+ \(iifname "eth0" udp dport 51820 accept\)$`
			status := "ok"
			if iif != "eth0" {
				want = `^UDP 51820 \(WireGuard\) from peer %s \(\S+\) over IPv4: the kernel dropped it in table inet wefttest chain in by its policy drop$`
				status = "fail"
			}
			for _, ch := range checks {
				if (strings.HasPrefix(ch.Name, "firewall/") || strings.HasPrefix(ch.Name, "probe/")) && ch.Status != "ok" && iif == "eth0" {
					t.Errorf("iifname eth0: %s %s: %s", ch.Name, ch.Status, ch.Evidence)
				}
			}
			for _, p := range []*Node{n2, n3} {
				re := regexp.MustCompile(fmt.Sprintf(want, regexp.QuoteMeta(p.Addr.String())))
				if !slices.ContainsFunc(checks, func(ch doctorResult) bool {
					return ch.Name == "firewall/input" && ch.Status == status && re.MatchString(ch.Evidence)
				}) {
					t.Errorf("iifname %s: no %s firewall/input for %s matching %q: %+v", iif, status, p.Label, re, checks)
				}
			}
		}
		pingAll(t)
	})

	t.Run("a restarted node keeps its key and its peers reconnect", func(t *testing.T) {
		before := readKey(t, keyFile(n2))
		n2.Restart()
		n2.WaitReady()
		if after := readKey(t, keyFile(n2)); after != before {
			t.Fatal("key changed across a restart")
		}
		if !strings.Contains(c.leaseJSON(t, n2.Subnet()), before.PublicKey().String()) {
			t.Error("lease lost the key")
		}
		pingAll(t)
	})

	t.Run("a lease that changes key updates the peer", func(t *testing.T) {
		old := readKey(t, keyFile(n3)).PublicKey().String()
		n3.Stop()
		if err := os.Remove(keyFile(n3)); err != nil {
			t.Fatal(err)
		}
		n3.Start()
		n3.WaitReady()
		nu := readKey(t, keyFile(n3)).PublicKey().String()
		Eventually(t, 10*time.Second, "n3's lease with the new key", func() error {
			if !strings.Contains(c.leaseJSON(t, n3.Subnet()), nu) {
				return fmt.Errorf("lease %s", c.leaseJSON(t, n3.Subnet()))
			}
			return nil
		})
		pingAll(t)
		waitLog(t, n1, "peer removed", old)
	})

	t.Run("a removed lease removes the peer", func(t *testing.T) {
		key := readKey(t, keyFile(n3)).PublicKey().String()
		n3.Stop()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := c.Client.Delete(ctx, Prefix+"/subnets/"+subnet.MakeKey(n3.Subnet(), netip.Prefix{})); err != nil {
			t.Fatal(err)
		}
		waitLog(t, n1, "peer removed", key)
		if err := Ping(pods[0][0].NS, pods[1][0].IP); err != nil {
			t.Errorf("n1 → n2 after n3 left: %v", err)
		}
	})
}

func readKey(t *testing.T, path string) wgtypes.Key {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	k, err := wgtypes.ParseKey(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// leaseJSON is the raw value of the lease of subnet sn.
func (c *Cluster) leaseJSON(t *testing.T, sn netip.Prefix) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// A dual-stack key goes on with "&<IPv6 subnet>".
	resp, err := c.Client.Get(ctx, Prefix+"/subnets/"+subnet.MakeKey(sn, netip.Prefix{}), clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("lease of %s: %v (%d keys)", sn, err, len(resp.Kvs))
	}
	var v json.RawMessage = resp.Kvs[0].Value
	return string(v)
}

// waitLog waits until n's weftd log has a line with every one of words.
func waitLog(t *testing.T, n *Node, words ...string) {
	t.Helper()
	Eventually(t, 15*time.Second, fmt.Sprintf("%s logs %q", n.Label, words), func() error {
		b, _ := os.ReadFile(n.LogFile)
		for _, l := range strings.Split(string(b), "\n") {
			ok := true
			for _, w := range words {
				ok = ok && strings.Contains(l, w)
			}
			if ok {
				return nil
			}
		}
		return fmt.Errorf("no such line")
	})
}

// capture runs tcpdump with filter on n's underlay while f runs and
// returns the decoded packets, one line each.
func capture(t *testing.T, n *Node, filter string, f func()) []string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "underlay.pcap")
	cmd := n.Command(context.Background(), "tcpdump", "--immediate-mode", "-i", "eth0", "-n", "-U", "-w", file, filter)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stderr)
	for sc.Scan() && !strings.Contains(sc.Text(), "listening on") {
	}
	go func() {
		for sc.Scan() {
		}
	}()
	f()
	cmd.Process.Signal(syscall.SIGINT)
	cmd.Wait()
	out := Output(t, n.NS, "tcpdump", "-nn", "-r", file)
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if l != "" && !strings.HasPrefix(l, "reading from file") {
			lines = append(lines, l)
		}
	}
	return lines
}

// TestWireGuardDualStack runs two dual-stack nodes in Flannel's default
// separate mode: flannel-wg carries IPv4 on 51820, flannel-wg-v6 IPv6 over
// the IPv6 underlay on 51821.
func TestWireGuardDualStack(t *testing.T) {
	c := NewCluster(t, Options{NoConfig: true, UnderlayV6: netip.MustParsePrefix("fd77::/64")})
	c.Put(Prefix+"/config", `{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10:244::/56","Backend":{"Type":"wireguard"}}`)
	c.OnNode = func(n *Node) { n.Env = []string{"WIREGUARD_KEY_FILE=" + filepath.Join(c.Dir, n.Label, "wgkey")} }
	n1, n2 := c.AddNode("n1"), c.AddNode("n2")
	n1.WaitReady()
	n2.WaitReady()
	raw := c.leaseJSON(t, n2.Subnet())
	key := readKey(t, filepath.Join(c.Dir, "n2", "wgkey")).PublicKey().String()
	for _, want := range []string{`"BackendType":"wireguard"`, `"BackendData":{"PublicKey":"` + key + `","Port":51820}`,
		`"BackendV6Data":{"PublicKey":"` + key + `","Port":51821}`} {
		if !strings.Contains(raw, want) {
			t.Errorf("lease %s lacks %s", raw, want)
		}
	}
	links := Output(t, n1.NS, "ip", "-o", "link")
	if !strings.Contains(links, "flannel-wg:") || !strings.Contains(links, "flannel-wg-v6:") {
		t.Fatalf("devices:\n%s", links)
	}
	a, b := n1.CNI.AddPod(t, "a"), n2.CNI.AddPod(t, "b")
	t.Cleanup(func() {
		if t.Failed() {
			logState(t, n1.NS, n2.NS, a.NS, b.NS)
		}
	})
	// WireGuard retries a handshake only every 5 s: a first initiation that
	// reaches a node not yet holding our key (it had not seen our lease) is
	// answered at the next try. 20 s leaves room for three under load.
	Eventually(t, 20*time.Second, "IPv4 a → b", func() error { return Ping(a.NS, b.IP, "-W", "1") })
	Eventually(t, 20*time.Second, "IPv6 a → b", func() error { return Ping(a.NS, podIPv6(t, b), "-W", "1") })
	out := capture(t, n1, "ip6", func() {
		if err := Ping(a.NS, podIPv6(t, b)); err != nil {
			t.Error(err)
		}
	})
	udp := 0
	for _, l := range out {
		switch {
		case strings.Contains(l, "fd00:10:244"):
			t.Errorf("plaintext pod packet on the underlay: %s", l)
		case strings.Contains(l, "fd77::2.51821") && strings.Contains(l, "UDP"):
			udp++
		case linkControl(l):
		default:
			t.Errorf("not WireGuard UDP to 51821: %s", l)
		}
	}
	if udp == 0 {
		t.Errorf("no WireGuard datagram to [fd77::2]:51821 captured:\n%s", strings.Join(out, "\n"))
	}
}

// linkControl tells the underlay's own link-layer and multicast control
// traffic, which the hosts' kernels send whatever the overlay does: ARP,
// IGMP membership reports, and ICMPv6 neighbour discovery and multicast
// listener reports.
func linkControl(line string) bool {
	for _, w := range []string{" ARP, ", ": igmp ", " ICMP6, neighbor ", " ICMP6, router ", " ICMP6, multicast listener "} {
		if strings.Contains(line, w) {
			return true
		}
	}
	return false
}

// logState logs the addresses, routes and neighbours of each namespace,
// for a failure that a lost packet explains.
func logState(t *testing.T, nss ...*nettest.NS) {
	t.Helper()
	for _, ns := range nss {
		var b strings.Builder
		for _, argv := range [][]string{{"ip", "addr"}, {"ip", "route"}, {"ip", "-6", "route"}, {"ip", "neigh"}} {
			out, err := ns.Run(argv...)
			fmt.Fprintf(&b, "$ %s (%v)\n%s\n", strings.Join(argv, " "), err, out)
		}
		t.Logf("state of %s:\n%s", ns.Name, b.String())
	}
}
