package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/weft-net/weft/internal/testkit/nettest"
)

// The tests in this file are named after Flannel issues whose users lose pod
// traffic (docs/flannel-failures.md): each brings the fault about on real
// kernels and a real etcd and checks that weft recovers.

// TestFlannel1070UnderlayRestart answers flannel-io/flannel#1070 and #1759
// (routes lost after a network restart; flanneld does not watch the host
// network): on n1 the underlay link goes down and up, and its address is
// flushed and added again (with the default route, as a network manager
// would). Every route, neighbour and FDB entry weft programmed must come
// back, for vxlan and for host-gw (whose routes go via the underlay and
// which the kernel flushes silently). Last the address is replaced by a
// new one: weftd must move its lease there and start the node again on it
// in the same process, and n2 must reach n1 at the new address with n1's
// pods keeping theirs. The repair time and pings lost are logged.
func TestFlannel1070UnderlayRestart(t *testing.T) {
	for _, backend := range []string{"vxlan", "host-gw"} {
		t.Run(backend, func(t *testing.T) {
			c := NewCluster(t, Options{Nodes: 2, Config: `{"Network":"10.244.0.0/16","Backend":{"Type":"` + backend + `"}}`})
			n1, n2 := c.Nodes[0], c.Nodes[1]
			a, b := n1.CNI.AddPod(t, "a"), n2.CNI.AddPod(t, "b")
			// n1 learns n2's lease through its watch, maybe after both are ready.
			Eventually(t, 5*time.Second, "a reaches b", func() error { return Ping(a.NS, b.IP, "-W", "1") })
			want, err := peerState(n1, backend)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(want, n2.Subnet().String()) {
				t.Fatalf("n1 has no state for n2's subnet %s:\n%s", n2.Subnet(), want)
			}
			addr := fmt.Sprintf("%s/24", n1.Addr)
			gw := "192.168.77.254"
			for _, f := range []struct {
				name  string
				fault [][]string
				back  [][]string
				moved string // the new address, when it changes
			}{
				{"link down and up",
					[][]string{{"ip", "link", "set", "eth0", "down"}},
					[][]string{{"ip", "link", "set", "eth0", "up"}, {"ip", "route", "replace", "default", "via", gw, "dev", "eth0", "onlink"}}, ""},
				{"address flushed and added again",
					[][]string{{"ip", "addr", "flush", "dev", "eth0"}},
					[][]string{{"ip", "addr", "add", addr, "dev", "eth0"}, {"ip", "route", "replace", "default", "via", gw, "dev", "eth0", "onlink"}}, ""},
				{"address replaced with a new one",
					[][]string{{"ip", "addr", "flush", "dev", "eth0"}},
					[][]string{{"ip", "addr", "add", "192.168.77.102/24", "dev", "eth0"}, {"ip", "route", "replace", "default", "via", gw, "dev", "eth0", "onlink"}},
					"192.168.77.102"},
			} {
				t.Run(f.name, func(t *testing.T) {
					ps := StartPing(t, f.name, a.NS, b.IP)
					time.Sleep(300 * time.Millisecond)
					for _, cmd := range f.fault {
						nettest.MustRun(t, n1, cmd...)
					}
					time.Sleep(300 * time.Millisecond)
					for _, cmd := range f.back {
						nettest.MustRun(t, n1, cmd...)
					}
					start := time.Now()
					pid := n1.PID()
					Eventually(t, 10*time.Second, "n1's peer state back", func() error {
						// The overlay device is recreated when the address
						// changes, so it may be missing for a moment.
						got, err := peerState(n1, backend)
						if err != nil {
							return err
						}
						if got != want {
							return fmt.Errorf("got\n%s\nwant\n%s", got, want)
						}
						if f.moved != "" {
							on2, err := peerState(n2, backend)
							if err != nil {
								return err
							}
							if !strings.Contains(on2, f.moved) {
								return fmt.Errorf("n2 does not reach n1 at %s yet:\n%s", f.moved, on2)
							}
						}
						if err := Ping(b.NS, a.IP, "-W", "1"); err != nil {
							return err
						}
						return Ping(a.NS, b.IP, "-W", "1")
					})
					took := time.Since(start)
					if err, ok := n1.Exited(0); ok || n1.PID() != pid {
						t.Fatalf("weftd on n1 exited (%v) or was restarted: it must follow the underlay in place", err)
					}
					if log, _ := os.ReadFile(n1.LogFile); f.moved != "" && !strings.Contains(string(log), "is now "+f.moved) {
						t.Errorf("weftd on n1 did not log that the address is now %s", f.moved)
					}
					time.Sleep(200 * time.Millisecond)
					r, err := ps.Stop()
					if err != nil {
						t.Fatal(err)
					}
					recordFailure(t, "1070", fmt.Sprintf("%s, %s: state back %s after the underlay came back, %s",
						backend, f.name, took.Round(time.Millisecond), r))
				})
			}
		})
	}
}

// peerState is what weft programmed on n for its peers: the routes (and for
// vxlan the neighbours and FDB entries of the overlay device), as text.
func peerState(n *Node, backend string) (string, error) {
	if backend == "host-gw" {
		return n.NS.Run("ip", "route", "show", "proto", "87")
	}
	var b strings.Builder
	for _, argv := range [][]string{
		{"ip", "route", "show", "dev", device},
		{"ip", "neigh", "show", "dev", device, "nud", "permanent"},
		{"bridge", "fdb", "show", "dev", device, "state", "permanent"},
	} {
		out, err := n.NS.Run(argv...)
		if err != nil {
			return "", err
		}
		b.WriteString(out)
	}
	return b.String(), nil
}

// TestFlannel2554StaleRoutes answers flannel-io/flannel#2554 (routes to
// removed nodes never cleaned up): while weftd is down on n1, n3's lease is
// deleted and n4's expires (its etcd lease revoked, as at the end of its
// TTL); when weftd starts on n1 their routes, neighbours and FDB entries go
// and n2's stay. At run time n2's lease expires and its state goes too.
func TestFlannel2554StaleRoutes(t *testing.T) {
	c := NewCluster(t, Options{Nodes: 4})
	n1, n2, n3, n4 := c.Nodes[0], c.Nodes[1], c.Nodes[2], c.Nodes[3]
	for _, n := range []*Node{n2, n3, n4} {
		Eventually(t, 5*time.Second, "n1 has n2, n3 and n4", func() error { return hasPeer(t, n1, n, true) })
	}
	n1.Stop()
	n3.Stop()
	n4.Stop()
	c.Delete(leaseKey(n3))
	c.Expire(leaseKey(n4))
	start := time.Now()
	n1.Start()
	n1.WaitReady()
	for _, n := range []*Node{n3, n4} {
		Eventually(t, 2*time.Second, "stale state of "+n.Label+" gone from n1 after its start", func() error { return hasPeer(t, n1, n, false) })
	}
	gone := time.Since(start)
	if err := hasPeer(t, n1, n2, true); err != nil {
		t.Fatalf("n2's state lost: %v", err)
	}
	n2.Stop()
	c.Expire(leaseKey(n2))
	took := Eventually(t, 2*time.Second, "n2's state gone from n1 after its lease expired", func() error { return hasPeer(t, n1, n2, false) })
	recordFailure(t, "2554", fmt.Sprintf("stale peers gone %s after weftd started; an expired lease's peer gone %s after expiry",
		gone.Round(time.Millisecond), took.Round(time.Millisecond)))
}

// hasPeer checks that n's route, neighbour and FDB entry on on are all
// there (want) or all gone.
func hasPeer(t *testing.T, on, n *Node, want bool) error {
	state, err := peerState(on, "vxlan")
	if err != nil {
		return err
	}
	for _, s := range []string{n.Subnet().String() + " via", n.Subnet().Addr().String() + " lladdr", "dst " + n.Addr.String() + " "} {
		if strings.Contains(state, s) != want {
			return fmt.Errorf("%q present: %v, want %v:\n%s", s, !want, want, state)
		}
	}
	return nil
}

// leaseKey is the etcd key of n's lease.
func leaseKey(n *Node) string {
	return Prefix + "/subnets/" + strings.ReplaceAll(n.Subnet().String(), "/", "-")
}

// Delete deletes a key from etcd.
func (c *Cluster) Delete(key string) {
	c.T.Helper()
	if _, err := c.Client.Delete(c.T.Context(), key); err != nil {
		c.T.Fatalf("etcd delete %s: %v", key, err)
	}
}

// Expire revokes the etcd lease of key, as its TTL running out would.
func (c *Cluster) Expire(key string) {
	c.T.Helper()
	resp, err := c.Client.Get(c.T.Context(), key)
	if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].Lease == 0 {
		c.T.Fatalf("etcd get %s: %v (%d keys), want one with an etcd lease", key, err, len(resp.Kvs))
	}
	if _, err := c.Client.Revoke(c.T.Context(), clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
		c.T.Fatalf("revoke the etcd lease of %s: %v", key, err)
	}
}

// TestFlannel2237RulesFlushed answers flannel-io/flannel#2237 (another
// program flushes FLANNEL-POSTRTG and pod egress stops): a pod on n1 pings
// a host outside the cluster network, which can answer only the node's
// address (masquerade) and only through n1's FORWARD chain, whose policy is
// DROP (weft's WEFT-FWD accepts pod traffic). Another program then flushes
// weft's masquerade table, deletes it, deletes its chain, flushes WEFT-FWD,
// and flushes the whole ruleset (an nftables.service reload). weft must log
// a repair and put everything back within its check interval
// (--iptables-resync, 1 s here; nftables changes are repaired on the
// kernel's notification, sooner) plus a second of slack; the
// pings lost are logged.
func TestFlannel2237RulesFlushed(t *testing.T) {
	if _, err := exec.LookPath("nft"); err != nil {
		nettest.CannotRun(t, nettest.SkipTools, "nft missing (test/setup.sh installs nftables)")
	}
	c := NewCluster(t, Options{})
	c.OnNode = func(n *Node) { nettest.MustRun(t, n, "iptables-nft", "-P", "FORWARD", "DROP") }
	n1 := c.AddNode("n1", "--iptables-resync=1")
	n1.WaitReady()
	ext := c.Underlay.AddHost(t, "ext", "eth0")
	a := n1.CNI.AddPod(t, "a")
	rulesBack := func() error {
		if out, err := n1.Run("nft", "list", "chain", "ip", "weft-ipv4", "postrouting"); err != nil || !strings.Contains(out, "masquerade") {
			return fmt.Errorf("masquerade chain: %v\n%s", err, out)
		}
		if out, err := n1.Run("iptables-nft", "-S", "FORWARD"); err != nil || !strings.Contains(out, "-j WEFT-FWD") {
			return fmt.Errorf("FORWARD: %v\n%s", err, out)
		}
		if out, err := n1.Run("iptables-nft", "-S", "WEFT-FWD"); err != nil || !strings.Contains(out, "-j ACCEPT") {
			return fmt.Errorf("WEFT-FWD: %v\n%s", err, out)
		}
		return Ping(a.NS, ext.Addr, "-W", "1")
	}
	Eventually(t, 5*time.Second, "pod reaches the outside host", rulesBack)
	// weftd logs each repair: one more after a fault shows the fault was
	// real and weft undid it.
	repairs := func() int {
		log, _ := os.ReadFile(n1.LogFile)
		return strings.Count(string(log), `msg="repaired masquerade table"`) + strings.Count(string(log), `msg="repaired forward accept rules"`)
	}
	for _, f := range []struct {
		name string
		cmd  []string
	}{
		{"masquerade table flushed", []string{"nft", "flush", "table", "ip", "weft-ipv4"}},
		{"masquerade table deleted", []string{"nft", "delete", "table", "ip", "weft-ipv4"}},
		{"masquerade chain deleted", []string{"sh", "-c", "nft flush chain ip weft-ipv4 postrouting && nft delete chain ip weft-ipv4 postrouting"}},
		{"WEFT-FWD flushed", []string{"iptables-nft", "-F", "WEFT-FWD"}},
		{"whole ruleset flushed", []string{"nft", "flush", "ruleset"}},
	} {
		t.Run(f.name, func(t *testing.T) {
			before := repairs()
			ps := StartPing(t, f.name, a.NS, ext.Addr)
			time.Sleep(200 * time.Millisecond)
			nettest.MustRun(t, n1, f.cmd...)
			if f.name == "whole ruleset flushed" { // the reload puts the host's own policy back
				nettest.MustRun(t, n1, "iptables-nft", "-P", "FORWARD", "DROP")
			}
			took := Eventually(t, 2*time.Second, "weft's rules back and egress working", func() error {
				if got := repairs(); got <= before {
					return fmt.Errorf("no repair logged yet (%d)", got)
				}
				return rulesBack()
			})
			time.Sleep(100 * time.Millisecond)
			r, err := ps.Stop()
			if err != nil {
				t.Fatal(err)
			}
			recordFailure(t, "2237", fmt.Sprintf("%s: back in %s, %s", f.name, took.Round(time.Millisecond), r))
		})
	}
}

// TestFlannel1060LeftoverDevice answers flannel-io/flannel#1060 ("link has
// incompatible addresses" after a restart: flanneld crash-loops): before
// weftd starts on n2, a leftover overlay device is there, with a foreign
// address, a wrong MAC, a wrong VNI, a wrong port, down, or flanneld's
// flannel.1 holding weft's VNI and port. weftd must get ready on its first
// start with weft.1 as it programs it (VNI 1, port 8472, its stable MAC, up,
// only its own address), and pods on n1 and n2 must reach each other.
func TestFlannel1060LeftoverDevice(t *testing.T) {
	c := NewCluster(t, Options{Nodes: 2})
	n1, n2 := c.Nodes[0], c.Nodes[1]
	a, b := n1.CNI.AddPod(t, "a"), n2.CNI.AddPod(t, "b")
	mac := linkMAC(t, n2)
	own := n2.Subnet().Addr().String() + "/32"
	local := "local " + n2.Addr.String() + " dev eth0"
	for _, tt := range []struct{ name, setup string }{
		{"foreign address", "ip link add weft.1 type vxlan id 1 dstport 8472 nolearning " + local +
			" && ip addr add 10.99.0.1/24 dev weft.1 && ip link set weft.1 up"},
		{"wrong MAC", "ip link add weft.1 address 02:00:00:00:00:01 type vxlan id 1 dstport 8472 nolearning " + local +
			" && ip link set weft.1 up"},
		{"wrong VNI", "ip link add weft.1 type vxlan id 7 dstport 8472 nolearning " + local + " && ip link set weft.1 up"},
		{"wrong port", "ip link add weft.1 type vxlan id 1 dstport 4789 nolearning " + local + " && ip link set weft.1 up"},
		{"down", "ip link add weft.1 type vxlan id 1 dstport 8472 nolearning " + local},
		{"flannel.1 on weft's VNI and port", "ip link add flannel.1 type vxlan id 1 dstport 8472 nolearning " + local +
			" && ip addr add " + own + " dev flannel.1 && ip link set flannel.1 up"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			n2.Stop()
			nettest.MustRun(t, n2, "ip", "link", "del", device)
			nettest.MustRun(t, n2, "sh", "-c", tt.setup)
			n2.Start()
			n2.WaitReady() // fails if weftd exits
			Eventually(t, 5*time.Second, "pods reach each other", func() error {
				if err := Ping(a.NS, b.IP, "-W", "1"); err != nil {
					return err
				}
				return Ping(b.NS, a.IP, "-W", "1")
			})
			link := Output(t, n2.NS, "ip", "-d", "link", "show", device)
			for _, want := range []string{"vxlan id 1 ", "dstport 8472 ", "link/ether " + mac + " ", ",UP,"} {
				if !strings.Contains(link, want) {
					t.Errorf("weft.1 lacks %q:\n%s", want, link)
				}
			}
			addrs := Output(t, n2.NS, "ip", "-4", "-o", "addr", "show", "dev", device)
			if strings.Count(addrs, " inet ") != 1 || !strings.Contains(addrs, " inet "+own+" ") {
				t.Errorf("weft.1 addresses, want only %s:\n%s", own, addrs)
			}
			if out := Output(t, n2.NS, "ip", "-o", "link", "show", "type", "vxlan"); strings.Contains(out, "flannel.1") {
				t.Errorf("flannel.1 on weft's VNI and port left in place:\n%s", out)
			}
			if err, exited := n2.Exited(100 * time.Millisecond); exited {
				t.Fatalf("weftd on n2 exited by itself: %v", err)
			}
			if !t.Failed() {
				recordFailure(t, "1060", tt.name+": ready on the first start, pods reach each other")
			}
		})
	}
}

// TestFlannel841MTU answers flannel-io/flannel#841 (a wrong MTU on
// jumbo-frame networks black-holes large packets): on underlays of MTU 9001
// and 1400 the overlay MTU (subnet file, weft.1, the pod's eth0) is the
// underlay's minus VXLAN's 50 bytes; a DF ping of exactly that size crosses,
// and one byte more fails in the sending pod with "message too long"
// instead of vanishing on the way.
func TestFlannel841MTU(t *testing.T) {
	for _, underlay := range []int{9001, 1400} {
		t.Run(fmt.Sprint(underlay), func(t *testing.T) {
			c := NewCluster(t, Options{Nodes: 2, UnderlayMTU: underlay})
			n1, n2 := c.Nodes[0], c.Nodes[1]
			a, b := n1.CNI.AddPod(t, "a"), n2.CNI.AddPod(t, "b")
			want := underlay - 50
			if got := fileMTU(t, n1); got != want {
				t.Errorf("FLANNEL_MTU %d, want %d", got, want)
			}
			for what, out := range map[string]string{
				"weft.1":     Output(t, n1.NS, "ip", "link", "show", device),
				"pod's eth0": Output(t, a.NS, "ip", "link", "show", "eth0"),
			} {
				if !strings.Contains(out, fmt.Sprintf(" mtu %d ", want)) {
					t.Errorf("%s MTU, want %d:\n%s", what, want, out)
				}
			}
			Eventually(t, 5*time.Second, "a reaches b", func() error { return Ping(a.NS, b.IP, "-W", "1") })
			payload := want - 28 // IPv4 and ICMP headers
			if err := Ping(a.NS, b.IP, "-M", "do", "-s", fmt.Sprint(payload)); err != nil {
				t.Errorf("DF ping of %d bytes (the overlay MTU) must cross: %v", want, err)
			}
			out, err := a.NS.Run("ping", "-c", "1", "-W", "1", "-M", "do", "-s", fmt.Sprint(payload+1), b.IP.String())
			if err == nil || !strings.Contains(strings.ToLower(out), "message too long") {
				t.Errorf("DF ping of %d bytes must fail in the pod with \"message too long\" (err %v):\n%s", want+1, err, out)
			}
			if !t.Failed() {
				recordFailure(t, "841", fmt.Sprintf("underlay MTU %d: overlay MTU %d; a DF packet of %d bytes crosses, %d fails in the pod", underlay, want, want, want+1))
			}
		})
	}
}
