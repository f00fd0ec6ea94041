package daemon

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/subnet/etcd"
)

// TestDaemonReusesBothSubnetsOfTheSubnetFile restarts a dual-stack node
// whose lease is gone from etcd (expired while the node was down): as
// flanneld does, the daemon takes again both subnets its subnet file names,
// FLANNEL_SUBNET and FLANNEL_IPV6_SUBNET. Both lie beyond the first 100 free
// subnets, among which a fresh lease is picked, so neither comes back by
// chance.
func TestDaemonReusesBothSubnetsOfTheSubnetFile(t *testing.T) {
	client := startEtcd(t)
	ctx := t.Context()
	conf := `{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10:244::/56","Backend":{"Type":"vxlan"}}`
	if _, err := client.Put(ctx, etcd.DefaultPrefix+"/config", conf); err != nil {
		t.Fatal(err)
	}
	v4, v6 := netip.MustParsePrefix("10.244.200.0/24"), netip.MustParsePrefix("fd00:10:244:f0::/64")
	file := filepath.Join(t.TempDir(), "subnet.env")
	if err := subnet.WriteFile(file, subnet.File{
		Network: netip.MustParsePrefix("10.244.0.0/16"), Subnet: subnet.GatewayPrefix(v4),
		IPv6Network: netip.MustParsePrefix("fd00:10:244::/56"), IPv6Subnet: subnet.GatewayPrefix(v6),
		MTU: 1450}); err != nil {
		t.Fatal(err)
	}

	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	fb := newFakeBackend()
	d, err := New(Config{
		Registry: etcd.New(client, etcd.Options{TTL: time.Minute}, log),
		Node: Node{PublicIP: netip.MustParseAddr("192.168.77.1"), PublicIPv6: netip.MustParseAddr("fd77::1"),
			UnderlayMTU: 1500},
		SubnetFile: file,
		Factories: Factories{Dataplane: func(string, *subnet.Config, subnet.Lease, int) (Dataplane, error) {
			return Dataplane{Backend: fb}, nil
		}},
	}, log)
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(rctx) }()
	t.Cleanup(func() { cancel(); <-done })

	waitFor(t, func() bool { return d.Lease() != nil })
	l := d.Lease()
	if l.Subnet != v4 || l.IPv6Subnet != v6 {
		t.Fatalf("acquired %s and %s, want the subnet file's %s and %s", l.Subnet, l.IPv6Subnet, v4, v6)
	}
	resp, err := client.Get(ctx, etcd.DefaultPrefix+"/subnets/"+subnet.MakeKey(v4, v6))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || resp.Kvs[0].Lease == 0 {
		t.Fatalf("etcd holds no leased key %s: %v", subnet.MakeKey(v4, v6), resp.Kvs)
	}
	f, err := subnet.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if f.Subnet != subnet.GatewayPrefix(v4) || f.IPv6Subnet != subnet.GatewayPrefix(v6) {
		t.Fatalf("subnet file rewritten with %s and %s", f.Subnet, f.IPv6Subnet)
	}
}
