package e2e

import (
	"encoding/json"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/weft-net/weft/backend"
	"github.com/weft-net/weft/subnet"
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
		attrs.BackendData.VtepMAC != backend.VTEPMAC(n.Addr, 1) || attrs.BackendData.VNI != 1 {
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
		{"bad backend", []string{"--backend", "udp"}, `--backend "udp"`},
		{"iface and regex", []string{"--iface", "eth0", "--iface-regex", "eth.*"}, "exclude each other"},
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
