package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/weft-net/weft/internal/testkit/nettest"
)

// Flannel failure tests of leases: nodes that share a public address,
// leases lost, leases of departed nodes (docs/flannel-failures.md).

// TestFlannel98SamePublicIP answers flannel-io/flannel#98 (every Vagrant VM
// reports 10.0.2.15, the nodes share one subnet): weftd on n1 and on n2
// advertises 10.0.2.15 (--public-ip, as a VM's NAT address would be). While
// n1 runs, n2 must refuse to take n1's lease, leave it untouched, stay not
// ready and say why in its log and its /readyz answer, and `weftctl doctor`
// on n2 must fail naming the cause. A restart of n1 must take its address
// back at once with n2 kept out. When n1 dies, n2 must take the lease over
// within the record's TTL (5 s here), as a machine that replaced n1 with
// its address must.
func TestFlannel98SamePublicIP(t *testing.T) {
	c := NewCluster(t, Options{})
	n1 := c.AddNode("n1", "--public-ip=10.0.2.15", "--node-name=n1", "--presence-ttl=5s")
	n1.WaitReady()
	key := leaseKey(n1)
	before := c.get(key)
	n2 := c.AddNode("n2", "--public-ip=10.0.2.15", "--node-name=n2", "--presence-ttl=5s")
	const why = `10.0.2.15 is advertised by the running node "n1", and this node is "n2"`
	Eventually(t, 10*time.Second, "n2 refuses n1's address and says so", func() error {
		code, body, err := n2.HTTPGet("http://127.0.0.1:9470/readyz")
		if err != nil || code != 503 || !strings.Contains(body, why) {
			return fmt.Errorf("readyz: %d %q %v", code, body, err)
		}
		if log, _ := os.ReadFile(n2.LogFile); !strings.Contains(string(log), strings.ReplaceAll(why, `"`, `\"`)) {
			return fmt.Errorf("n2's log does not say why")
		}
		return nil
	})
	if err, exited := n2.Exited(0); exited {
		t.Fatalf("weftd on n2 exited: %v", err)
	}
	if after := c.get(key); after != before {
		t.Errorf("n1's lease changed from %s to %s", before, after)
	}
	if resp, err := c.Client.Get(t.Context(), Prefix+"/subnets/", clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || resp.Count != 1 {
		t.Errorf("want only n1's lease: %v leases (%v)", resp.Count, err)
	}
	out, err := n2.Run(nettest.Binary(t, "weftctl"), "doctor", "--etcd-endpoints", c.endpoints, "--subnet-file", n2.SubnetFile,
		"--cni-conf-dir", "", "--no-probe")
	if err == nil || !strings.Contains(out, "weftd/ready") || !strings.Contains(out, "another running node advertises this node's public IP") {
		t.Errorf("weftctl doctor on n2 must fail weftd/ready naming the duplicate address (err %v):\n%s", err, out)
	}
	// A restart of n1 (its record stays, and its instance token in
	// <subnet file>.instance) takes the address back at once; n2 stays out.
	logged, _ := os.ReadFile(n1.LogFile)
	restart := time.Now()
	n1.Restart()
	n1.WaitReady()
	restarted := time.Since(restart)
	if after, _ := os.ReadFile(n1.LogFile); strings.Contains(string(after[len(logged):]), "cannot record this node's public address") {
		t.Errorf("n1 was refused its own address after a restart (its instance token not kept): it waits out its own record")
	}
	if got := c.get(key); got != before {
		t.Errorf("n1's lease after its restart: %s, want %s", got, before)
	}
	if code, body, err := n2.HTTPGet("http://127.0.0.1:9470/readyz"); err != nil || code != 503 || !strings.Contains(body, why) {
		t.Errorf("n2 after n1's restart: readyz %d %q %v, want still refused", code, body, err)
	}
	n1.Kill()
	start := time.Now()
	n2.WaitReady()
	took := time.Since(start)
	if got := n2.Subnet(); got != n1.Subnet() {
		t.Errorf("n2 took %s, want n1's lease %s (found by the address it now holds alone)", got, n1.Subnet())
	}
	if took > 12*time.Second {
		t.Errorf("n2 took n1's lease %s after n1 died, want within the 5 s TTL plus n2's 5 s retry", took.Round(time.Millisecond))
	}
	recordFailure(t, "98", fmt.Sprintf("n2 refused, not ready, doctor names the cause while n1 runs; n1 restarted and ready again in %s with n2 kept out; "+
		"n2 held n1's lease %s after n1 was killed (presence TTL 5 s, retry 5 s)",
		restarted.Round(100*time.Millisecond), took.Round(100*time.Millisecond)))
}

// get returns the value of an etcd key ("" if none).
func (c *Cluster) get(key string) string {
	c.T.Helper()
	resp, err := c.Client.Get(c.T.Context(), key)
	if err != nil {
		c.T.Fatalf("etcd get %s: %v", key, err)
	}
	if len(resp.Kvs) == 0 {
		return ""
	}
	return string(resp.Kvs[0].Value)
}

// TestFlannel1240LeaseLost answers flannel-io/flannel#1240 and #875
// (flanneld exits when its lease is revoked or deleted, and the node drops
// off): while a pod on n1 pings a pod on n2, n1's lease key is deleted;
// then its etcd lease is revoked; then n1 is cut off from etcd (nftables
// drops in its namespace; nodes reach etcd over the underlay) until its
// lease, of a 6 s TTL, has expired, and the cut is lifted. weftd on n1 must
// keep running, acquire its lease again with the same subnet (its pods
// keep their addresses), and the pods must reach each other both ways. The
// time until the lease is back, until pods reach each other again (from
// the fault, or from the end of the cut), and the pings lost are logged.
func TestFlannel1240LeaseLost(t *testing.T) {
	if _, err := exec.LookPath("nft"); err != nil {
		nettest.CannotRun(t, nettest.SkipTools, "nft missing (test/setup.sh installs nftables)")
	}
	c := NewCluster(t, Options{Nodes: 2, EtcdOnUnderlay: true, Args: []string{"--subnet-lease-ttl", "6s"}})
	n1, n2 := c.Nodes[0], c.Nodes[1]
	a, b := n1.CNI.AddPod(t, "a"), n2.CNI.AddPod(t, "b")
	Eventually(t, 5*time.Second, "a reaches b", func() error { return Ping(a.NS, b.IP, "-W", "1") })
	sn := n1.Subnet()
	key := leaseKey(n1)
	for _, f := range []struct {
		name  string
		fault func(t *testing.T) // returns when recovery may begin
	}{
		{"lease key deleted", func(t *testing.T) {
			if _, err := c.Client.Delete(t.Context(), key); err != nil {
				t.Fatal(err)
			}
		}},
		{"etcd lease revoked", func(t *testing.T) {
			resp, err := c.Client.Get(t.Context(), key)
			if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].Lease == 0 {
				t.Fatalf("etcd get %s: %v (%d keys), want one with an etcd lease", key, err, len(resp.Kvs))
			}
			if _, err := c.Client.Revoke(t.Context(), clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
				t.Fatal(err)
			}
		}},
		{"lease expired while cut off from etcd", func(t *testing.T) {
			etcd := c.EtcdHost.Addr
			rules := fmt.Sprintf(`table ip wefttest-cut {
	chain out { type filter hook output priority 0; ip daddr %s tcp dport %d drop; }
	chain in { type filter hook input priority 0; ip saddr %s tcp sport %d drop; }
}`, etcd.Addr(), etcd.Port(), etcd.Addr(), etcd.Port())
			nettest.MustRun(t, n1, "nft", "-f", writeTemp(t, "cut.nft", rules))
			t.Cleanup(func() { n1.Run("nft", "delete", "table", "ip", "wefttest-cut") })
			cut := time.Now()
			Eventually(t, 15*time.Second, "n1's lease expired", func() error {
				if rev := leaseRev(t, c, key); rev != 0 {
					return fmt.Errorf("%s still in etcd", key)
				}
				return nil
			})
			if err, exited := n1.Exited(10 * time.Millisecond); exited {
				t.Fatalf("weftd on n1 exited while cut off from etcd: %v", err)
			}
			nettest.MustRun(t, n1, "nft", "delete", "table", "ip", "wefttest-cut")
			t.Logf("n1 cut off from etcd for %s, until its lease expired", time.Since(cut).Round(time.Millisecond))
		}},
	} {
		t.Run(f.name, func(t *testing.T) {
			before := leaseRev(t, c, key)
			again := func() int {
				log, _ := os.ReadFile(n1.LogFile)
				return strings.Count(string(log), "acquiring again")
			}
			againBefore := again()
			ps := StartPing(t, f.name, a.NS, b.IP)
			time.Sleep(300 * time.Millisecond)
			f.fault(t)
			start := time.Now()
			back := Eventually(t, 20*time.Second, "n1's lease back in etcd", func() error {
				if rev := leaseRev(t, c, key); rev <= before {
					return fmt.Errorf("lease %s not written again (revision %d)", key, rev)
				}
				return nil
			})
			Eventually(t, 10*time.Second, "pods reach each other both ways", func() error {
				if err := Ping(b.NS, a.IP, "-W", "1"); err != nil {
					return err
				}
				return Ping(a.NS, b.IP, "-W", "1")
			})
			reached := time.Since(start)
			time.Sleep(200 * time.Millisecond)
			r, err := ps.Stop()
			if err != nil {
				t.Fatal(err)
			}
			if err, exited := n1.Exited(100 * time.Millisecond); exited {
				t.Fatalf("weftd on n1 exited: %v", err)
			}
			if got := n1.Subnet(); got != sn {
				t.Errorf("n1's subnet is now %s, want %s again", got, sn)
			}
			if again() <= againBefore {
				t.Error("weftd on n1 did not log that it acquires its lease again")
			}
			if !t.Failed() {
				recordFailure(t, "954", fmt.Sprintf("lost lease, %s: back in %s, pods reach each other after %s; %s", f.name,
					back.Round(time.Millisecond), reached.Round(time.Millisecond), r))
			}
		})
	}
}

// leaseRev is the revision at which key was last written, 0 if it is absent.
func leaseRev(t *testing.T, c *Cluster, key string) int64 {
	t.Helper()
	resp, err := c.Client.Get(t.Context(), key)
	if err != nil {
		t.Fatalf("etcd get %s: %v", key, err)
	}
	if len(resp.Kvs) == 0 {
		return 0
	}
	return resp.Kvs[0].ModRevision
}

// TestFlannel954StaleLeaseShown answers the operator's side of
// flannel-io/flannel#954 and #904 (leases of departed nodes hold subnets
// and nothing says which): nodes run with a 16 s lease TTL (renewed at half
// of it, the margin being longer); weftd on n3 stops, leaving its lease to
// expire. `weftctl leases` must mark n3's lease OVERDUE once its renewal is
// late by the grace, and `weftctl leases --stale` must list it alone, never
// the leases of the running n1 and n2. The time from the stop until the
// lease shows as overdue, and until it expires, is logged.
func TestFlannel954StaleLeaseShown(t *testing.T) {
	c := NewCluster(t, Options{Nodes: 3, Args: []string{"--subnet-lease-ttl", "16s"}})
	n1, n2, n3 := c.Nodes[0], c.Nodes[1], c.Nodes[2]
	weftctl := nettest.Binary(t, "weftctl")
	leases := func(extra ...string) string {
		out, err := runOutput(weftctl, append([]string{"leases", "--etcd-endpoints", c.endpoints}, extra...)...)
		if err != nil {
			t.Fatalf("weftctl leases %v: %v\n%s", extra, err, out)
		}
		return out
	}
	row := func(out string, n *Node) string {
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, n.Subnet().String()+" ") {
				return l
			}
		}
		return ""
	}
	sn3 := n3.Subnet()
	// Running nodes renew on time, through at least one renewal.
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		if out := leases("--stale"); !strings.HasPrefix(out, "0 of 3 leases") {
			t.Fatalf("weftctl leases --stale with every node running:\n%s", out)
		}
	}
	n3.Stop()
	shown := Eventually(t, 15*time.Second, "n3's lease shown overdue", func() error {
		out := leases("--stale")
		if !strings.HasPrefix(out, "1 of 3 leases") || !strings.Contains(out, sn3.String()+" ") {
			return fmt.Errorf("weftctl leases --stale:\n%s", out)
		}
		return nil
	})
	out := leases()
	if r := row(out, n3); !strings.Contains(r, "OVERDUE") {
		t.Errorf("n3's row is not OVERDUE:\n%s", out)
	}
	for _, n := range []*Node{n1, n2} {
		if r := row(out, n); !strings.Contains(r, "due in") && !strings.Contains(r, "due now") {
			t.Errorf("%s's row, want its renewal due:\n%s", n.Label, out)
		}
	}
	gone := Eventually(t, 10*time.Second, "n3's lease expired", func() error {
		if strings.Contains(leases(), sn3.String()+" ") {
			return fmt.Errorf("n3's lease %s still listed", sn3)
		}
		return nil
	})
	recordFailure(t, "954", fmt.Sprintf("stopped node: its lease alone shown OVERDUE %s after weftd stopped (TTL 16 s, renewed at 8 s left), expired %s after",
		shown.Round(100*time.Millisecond), (shown+gone).Round(100*time.Millisecond)))
}

// writeTemp writes content to a file named name in a temporary directory
// of the test and returns its path.
func writeTemp(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}
