package faults

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/weft-net/weft/internal/etcdlocal"
	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/subnet/etcd"
	"github.com/weft-net/weft/vtep"
)

// nodeAttrs are the lease attrs of a node at 172.16.i/256.i%256.
func nodeAttrs(i int) subnet.LeaseAttrs {
	ip := netip.AddrFrom4([4]byte{172, 16, byte(i / 256), byte(i % 256)})
	return subnet.LeaseAttrs{PublicIP: ip, BackendType: subnet.BackendTypeVXLAN,
		BackendData: &subnet.VXLANData{VNI: 1, VtepMAC: vtep.DeviceMAC(ip, 1)}}
}

// TestRegistryStampede: N nodes (registry clients, each with its own etcd
// connection) acquire at once; then an admin deletes one node's lease and
// writes that subnet for another node, and the first node's renewal comes
// late. Goal: no subnet handed out twice, no overwritten lease, the late
// renewal is told its lease is lost.
func TestRegistryStampede(t *testing.T) {
	nodes := scale(50, 200)
	srv, err := etcdlocal.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	admin := newClient(t, srv.Endpoint)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	if _, err := admin.Put(ctx, etcd.DefaultPrefix+"/config", `{"Network":"10.0.0.0/8","SubnetLen":24}`); err != nil {
		t.Fatal(err)
	}
	leases := make([]subnet.Lease, nodes)
	regs := make([]*etcd.Registry, nodes)
	for i := range nodes {
		regs[i] = etcd.New(newClient(t, srv.Endpoint), etcd.Options{TTL: time.Minute, RaceRetries: 1000}, nil)
	}
	failed := each(nodes, func(i int) (err error) {
		leases[i], err = regs[i].Acquire(ctx, nodeAttrs(i), netip.Prefix{})
		if err != nil {
			t.Logf("node %d: %v", i, err)
		}
		return err
	})
	seen := map[netip.Prefix]int{}
	dups := 0
	for i, l := range leases {
		if l.Subnet.IsValid() {
			if _, dup := seen[l.Subnet]; dup {
				dups++
			}
			seen[l.Subnet] = i
		}
	}
	resp, err := admin.Get(ctx, etcd.DefaultPrefix+"/subnets/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	overwritten := len(seen) - int(resp.Count)

	// The admin gives node 0's subnet to a newcomer; node 0 renews late.
	victim := leases[0]
	key := etcd.DefaultPrefix + "/subnets/" + victim.Key()
	if _, err := admin.Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	newcomer := etcd.New(newClient(t, srv.Endpoint), etcd.Options{TTL: time.Minute}, nil)
	taken, err := newcomer.Acquire(ctx, nodeAttrs(nodes+1), victim.Subnet)
	if err != nil || taken.Subnet != victim.Subnet {
		t.Fatalf("admin retake: %v %v", taken.Subnet, err)
	}
	_, rerr := regs[0].Renew(ctx, victim)
	lostOK := errors.Is(rerr, subnet.ErrLeaseLost)
	v, err := admin.Get(ctx, key)
	if err != nil || len(v.Kvs) != 1 {
		t.Fatalf("retaken key: %v", err)
	}
	var after subnet.LeaseAttrs
	if err := json.Unmarshal(v.Kvs[0].Value, &after); err != nil || after.PublicIP != nodeAttrs(nodes+1).PublicIP {
		overwritten++
		t.Errorf("late renewal overwrote the retaken lease: %s", v.Kvs[0].Value)
	}
	record(t, row{fmt.Sprintf("%d registry clients acquiring at once; a late renewal after an admin gave its subnet to another node", nodes),
		"failed acquisitions; duplicate subnets; overwritten leases; late renewal told ErrLeaseLost",
		fmt.Sprintf("%d; %d; %d; %s", failed, dups, overwritten, yesNo(lostOK)),
		"0; 0; 0; yes", failed == 0 && dups == 0 && overwritten == 0 && lostOK, ""})
}

func newClient(t *testing.T, endpoint string) *clientv3.Client {
	t.Helper()
	c, err := etcd.NewClient(etcd.ClientConfig{Endpoints: []string{endpoint}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
