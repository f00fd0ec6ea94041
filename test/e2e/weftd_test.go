package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/vtep"
)

// lease reads a lease from etcd by subnet.
func (c *Cluster) lease(t *testing.T, sn netip.Prefix) (subnet.LeaseAttrs, int64) {
	t.Helper()
	resp, err := c.Client.Get(t.Context(), Prefix+"/subnets/"+subnet.MakeKey(sn, netip.Prefix{}))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 {
		t.Fatalf("no lease for %s in etcd", sn)
	}
	var a subnet.LeaseAttrs
	if err := json.Unmarshal(resp.Kvs[0].Value, &a); err != nil {
		t.Fatalf("lease value %s: %v", resp.Kvs[0].Value, err)
	}
	return a, resp.Kvs[0].Lease
}

func TestWeftdLeaseFileAndRestart(t *testing.T) {
	c := NewCluster(t, Options{Nodes: 1})
	n := c.Nodes[0]
	b, err := os.ReadFile(n.SubnetFile)
	if err != nil {
		t.Fatal(err)
	}
	sn := n.Subnet()
	want := "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=" + subnet.GatewayPrefix(sn).String() + "\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n"
	if string(b) != want {
		t.Fatalf("subnet file:\n%s\nwant:\n%s", b, want)
	}
	attrs, etcdLease := c.lease(t, sn)
	if attrs.PublicIP != n.Addr || attrs.BackendType != "vxlan" || attrs.BackendData == nil ||
		attrs.BackendData.VtepMAC != vtep.DeviceMAC(n.Addr, 1) || attrs.BackendData.VNI != 1 {
		t.Fatalf("lease value %+v", attrs)
	}
	if etcdLease == 0 {
		t.Fatal("lease key has no TTL")
	}
	ttl, err := c.Client.TimeToLive(t.Context(), clientv3.LeaseID(etcdLease))
	if err != nil || ttl.TTL < 86000 {
		t.Fatalf("lease TTL %v (%v), want about 24h", ttl.TTL, err)
	}
	mac := linkMAC(t, n)

	n.Restart()
	n.WaitReady()
	if got := n.Subnet(); got != sn {
		t.Fatalf("restart moved the node from %s to %s", sn, got)
	}
	if got := linkMAC(t, n); got != mac {
		t.Fatalf("restart changed the VTEP MAC from %s to %s", mac, got)
	}

	// A restart that lost its subnet file reuses the lease by public IP.
	n.Stop()
	os.Remove(n.SubnetFile)
	n.Start()
	n.WaitReady()
	if got := n.Subnet(); got != sn {
		t.Fatalf("restart without a subnet file moved the node from %s to %s", sn, got)
	}
}

func TestWeftdReacquiresDeletedLease(t *testing.T) {
	c := NewCluster(t, Options{Nodes: 1})
	n := c.Nodes[0]
	sn := n.Subnet()
	if _, err := c.Client.Delete(t.Context(), Prefix+"/subnets/"+subnet.MakeKey(sn, netip.Prefix{})); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 10*time.Second, "lease written again", func() error {
		resp, err := c.Client.Get(t.Context(), Prefix+"/subnets/", clientv3.WithPrefix())
		if err != nil {
			return err
		}
		if len(resp.Kvs) != 1 {
			return os.ErrNotExist
		}
		return nil
	})
	log, _ := os.ReadFile(n.LogFile)
	if !strings.Contains(string(log), "acquiring again") {
		t.Errorf("weftd did not log the lost lease:\n%s", tail(string(log), 20))
	}
}

func TestWeftdRejectsBadFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"bad backend", []string{"--backend", "udp"}, `--backend: backend "udp": Flannel's udp backend is not supported; use "uvxlan"`},
		{"renew margin neither minutes nor duration", []string{"--subnet-lease-renew-margin", "soon"}, "not a number of minutes"},
		{"flanneld's renew margin range", []string{"--flannel-compat", "--subnet-lease-renew-margin", "1440"}, "1 to 1439 minutes"},
		{"bad log format", []string{"--log-format", "xml"}, "--log-format"},
		{"stray argument", []string{"extra"}, "unexpected arguments"},
		{"kube without node name", []string{"--kube-subnet-mgr", "--node-name", ""}, "NODE_NAME"},
	}
	weftd := Binary(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := runOutput(weftd, tt.args...)
			if err == nil {
				t.Fatalf("weftd %v succeeded", tt.args)
			}
			if !strings.Contains(out, tt.want) {
				t.Fatalf("weftd %v: %q does not mention %q", tt.args, out, tt.want)
			}
		})
	}
}

// TestWeftdSurvivesEtcdLeaderKill kills the etcd leader while weftd renews
// its lease every few seconds and watches: renewals go on against the
// new leader, a lease written after the kill reaches every node, and no node
// loses its lease or exits.
func TestWeftdSurvivesEtcdLeaderKill(t *testing.T) {
	c := NewCluster(t, Options{Nodes: 2, EtcdMembers: 3,
		Args: []string{"--subnet-lease-ttl", "12s", "--subnet-lease-renew-margin", "9s"}})
	n1 := c.Nodes[0]
	subnets := []netip.Prefix{c.Nodes[0].Subnet(), c.Nodes[1].Subnet()}
	leader, err := c.EtcdHA.Leader(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	leader.Kill()
	t.Logf("killed etcd leader %s", leader.Name)

	n3 := c.AddNode("n3")
	n3.WaitReady()
	fresh := n3.Subnet()
	Eventually(t, 10*time.Second, "route to a node that joined after the kill, on n1", func() error {
		if !strings.Contains(nettest.MustRun(t, n1, "ip", "route", "show", "dev", device), fresh.String()) {
			return fmt.Errorf("no route to %s", fresh)
		}
		return nil
	})
	// Renewals of a 12 s lease come every ~3 s: wait for two more on each
	// node after the kill, so they went to the new leader.
	before := make([]int, len(subnets))
	for i := range subnets {
		before[i] = renewals(c.Nodes[i])
	}
	for i := range subnets {
		Eventually(t, 20*time.Second, fmt.Sprintf("two renewals on n%d after the kill", i+1), func() error {
			if n := renewals(c.Nodes[i]); n < before[i]+2 {
				return fmt.Errorf("%d renewals, want %d", n, before[i]+2)
			}
			return nil
		})
	}
	for i, sn := range subnets {
		if _, id := c.lease(t, sn); id == 0 {
			t.Errorf("n%d's lease lost its TTL", i+1)
		}
		log, _ := os.ReadFile(c.Nodes[i].LogFile)
		if strings.Contains(string(log), "acquiring again") {
			t.Errorf("n%d lost its lease across the leader kill:\n%s", i+1, tail(string(log), 30))
		}
		if strings.Contains(string(log), "level=ERROR") {
			t.Errorf("n%d logged an error, not just a retry:\n%s", i+1, tail(string(log), 30))
		}
		if !strings.Contains(string(log), "renewed lease") {
			t.Errorf("n%d never renewed its lease:\n%s", i+1, tail(string(log), 30))
		}
		if c.Nodes[i].PID() == 0 {
			t.Errorf("weftd on n%d is gone", i+1)
		}
		if code, _, err := c.Nodes[i].HTTPGet("http://127.0.0.1:9470/readyz"); err != nil || code != 200 {
			t.Errorf("n%d not ready after the kill: %d %v", i+1, code, err)
		}
	}
}

// TestReadiness: /healthz answers as soon as weftd runs; /readyz only once
// the subnet file is written and the dataplane programmed, which cannot
// happen before the network config exists.
func TestReadiness(t *testing.T) {
	c := NewCluster(t, Options{Nodes: 0, NoConfig: true})
	n := c.AddNode("n1")
	Eventually(t, 10*time.Second, "/healthz", func() error {
		code, _, err := n.HTTPGet("http://127.0.0.1:9470/healthz")
		if err == nil && code != 200 {
			err = fmt.Errorf("/healthz answered %d", code)
		}
		return err
	})
	// Not ready is only meaningful once weftd has looked for the config.
	Eventually(t, 10*time.Second, "weftd has found no network config", func() error {
		if log, _ := os.ReadFile(n.LogFile); !strings.Contains(string(log), "cannot read the network config") {
			return errors.New("not yet")
		}
		return nil
	})
	if code, body, err := n.HTTPGet("http://127.0.0.1:9470/readyz"); err != nil || code != 503 {
		t.Fatalf("/readyz without a network config: %d %q %v, want 503", code, body, err)
	}
	if _, err := os.Stat(n.SubnetFile); err == nil {
		t.Fatal("subnet file written before there is a network config")
	}
	if v, err := n.Metric("weft_ready"); err != nil || v != 0 {
		t.Fatalf("weft_ready = %v (%v), want 0", v, err)
	}
	c.Put(Prefix+"/config", `{"Network":"10.244.0.0/16"}`)
	n.WaitReady()
	if _, err := os.Stat(n.SubnetFile); err != nil {
		t.Fatalf("ready without a subnet file: %v", err)
	}
	if out := nettest.MustRun(t, n, "ip", "link", "show", device); !strings.Contains(out, "UP") {
		t.Fatalf("ready without the device up:\n%s", out)
	}
	if v, err := n.Metric("weft_ready"); err != nil || v != 1 {
		t.Fatalf("weft_ready = %v (%v), want 1", v, err)
	}
}

// renewals counts the lease renewals n's weftd has logged.
func renewals(n *Node) int {
	log, _ := os.ReadFile(n.LogFile)
	return strings.Count(string(log), "renewed lease")
}
