package etcd

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/weft-net/weft/subnet"
)

const tinyConf = `{"Network": "10.1.0.0/28", "SubnetLen": 30}` // 10.1.0.4, .8 and .12

func subnetsKey(l subnet.Lease) string { return testPrefix + "/subnets/" + l.Key() }

func TestAcquireReusesByPublicIP(t *testing.T) {
	t.Parallel()
	env := newEnv(t, netConf)
	ctx := testCtx(t)
	a := attrs(t, "192.168.77.1")
	first, err := env.reg.Acquire(ctx, a, netip.Prefix{})
	if err != nil {
		t.Fatal(err)
	}
	_, leaseID, _ := env.get(t, subnetsKey(first))

	// Same node, new VTEP MAC: same subnet, new value, same etcd lease.
	a.BackendData = &subnet.VXLANData{VNI: 1, VtepMAC: subnet.MAC{0x4e, 1, 2, 3, 4, 5}}
	again, err := env.reg.Acquire(ctx, a, netip.MustParsePrefix("10.244.200.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	if again.Subnet != first.Subnet {
		t.Errorf("second Acquire got %s, want the same subnet %s", again.Subnet, first.Subnet)
	}
	value, leaseID2, _ := env.get(t, subnetsKey(first))
	want, _ := json.Marshal(a)
	if value != string(want) || leaseID2 != leaseID {
		t.Errorf("after reuse etcd holds %s with lease %x, want %s with lease %x", value, leaseID2, want, leaseID)
	}
	if again.Expiration.IsZero() || again.Revision <= first.Revision || again.Attrs.BackendData.VtepMAC != a.BackendData.VtepMAC {
		t.Errorf("reused lease %+v", again)
	}
	// Unchanged value: no write at all.
	third, err := env.reg.Acquire(ctx, a, netip.Prefix{})
	if err != nil || third.Revision != again.Revision {
		t.Errorf("third Acquire = %+v, %v; want revision %d (no write)", third, err, again.Revision)
	}

	other, err := env.reg.Acquire(ctx, attrs(t, "192.168.77.2"), first.Subnet)
	if err != nil {
		t.Fatal(err)
	}
	if other.Subnet == first.Subnet {
		t.Errorf("another node got our subnet %s (it was its hint)", other.Subnet)
	}
}

func TestAcquireHint(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		hint    string
		useHint bool
	}{
		{"free and fitting", "10.244.77.0/24", true},
		{"last subnet", "10.244.255.0/24", true},
		{"taken by another node", "10.244.9.0/24", false},
		{"below SubnetMin", "10.244.0.0/24", false},
		{"wrong length", "10.244.77.0/25", false},
		{"outside the network", "10.245.77.0/24", false},
		{"wrong family", "fd00::/64", false},
	}
	env := newEnv(t, netConf)
	ctx := testCtx(t)
	if _, err := env.reg.Acquire(ctx, attrs(t, "10.0.0.1"), netip.MustParsePrefix("10.244.9.0/24")); err != nil {
		t.Fatal(err)
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hint := netip.MustParsePrefix(tt.hint)
			l, err := env.reg.Acquire(ctx, attrs(t, fmt.Sprintf("10.0.1.%d", i+1)), hint)
			if err != nil {
				t.Fatal(err)
			}
			if (l.Subnet == hint) != tt.useHint {
				t.Errorf("hint %s: got %s", hint, l.Subnet)
			}
			if cfg, _ := env.reg.Config(ctx); !cfg.Fits(l.Subnet) {
				t.Errorf("got %s, which does not fit", l.Subnet)
			}
		})
	}
}

func TestAcquireExhausted(t *testing.T) {
	t.Parallel()
	env := newEnv(t, tinyConf)
	ctx := testCtx(t)
	got := map[netip.Prefix]bool{}
	for i := 1; i <= 3; i++ {
		l, err := env.reg.Acquire(ctx, attrs(t, fmt.Sprintf("10.0.0.%d", i)), netip.Prefix{})
		if err != nil {
			t.Fatal(err)
		}
		got[l.Subnet] = true
	}
	for _, s := range []string{"10.1.0.4/30", "10.1.0.8/30", "10.1.0.12/30"} {
		if !got[netip.MustParsePrefix(s)] {
			t.Errorf("%s not handed out; got %v", s, got)
		}
	}
	_, err := env.reg.Acquire(ctx, attrs(t, "10.0.0.4"), netip.Prefix{})
	if !errors.Is(err, subnet.ErrExhausted) {
		t.Fatalf("fourth Acquire: %v, want ErrExhausted", err)
	}
	if !strings.Contains(err.Error(), "10.1.0.4/30") || !strings.Contains(err.Error(), "10.1.0.12/30") {
		t.Errorf("error %q does not name the range", err)
	}
}

func TestAcquireReservation(t *testing.T) {
	t.Parallel()
	env := newEnv(t, tinyConf)
	ctx := testCtx(t)
	owner := attrs(t, "10.0.0.50")
	reserved := netip.MustParsePrefix("10.1.0.8/30")
	key := testPrefix + "/subnets/10.1.0.8-30"
	old, _ := json.Marshal(subnet.LeaseAttrs{PublicIP: owner.PublicIP, BackendType: "vxlan"})
	env.put(t, key, string(old)) // no etcd lease: an admin's reservation

	// Other nodes never get it, even when they ask for it.
	for i := 1; i <= 2; i++ {
		l, err := env.reg.Acquire(ctx, attrs(t, fmt.Sprintf("10.0.0.%d", i)), reserved)
		if err != nil {
			t.Fatal(err)
		}
		if l.Subnet == reserved {
			t.Fatalf("node %d got the reserved subnet", i)
		}
	}
	if _, err := env.reg.Acquire(ctx, attrs(t, "10.0.0.3"), reserved); !errors.Is(err, subnet.ErrExhausted) {
		t.Fatalf("third node: %v, want ErrExhausted (only the reservation is left)", err)
	}

	// Its owner gets it; it stays without TTL, with the owner's new value.
	l, err := env.reg.Acquire(ctx, owner, netip.Prefix{})
	if err != nil {
		t.Fatal(err)
	}
	if l.Subnet != reserved || !l.Expiration.IsZero() {
		t.Errorf("owner got %s expiring %v, want %s with no expiration", l.Subnet, l.Expiration, reserved)
	}
	value, leaseID, _ := env.get(t, key)
	want, _ := json.Marshal(owner)
	if value != string(want) || leaseID != 0 {
		t.Errorf("reservation now holds %s with lease %x, want %s without lease", value, leaseID, want)
	}
	renewed, err := env.reg.Renew(ctx, l)
	if err != nil || renewed != l {
		t.Errorf("Renew(reservation) = %+v, %v; want it unchanged", renewed, err)
	}
	if _, leaseID, _ := env.get(t, key); leaseID != 0 {
		t.Errorf("Renew attached etcd lease %x to the reservation", leaseID)
	}
}

func TestAcquireConcurrent(t *testing.T) {
	t.Parallel()
	env := newEnv(t, netConf)
	ctx := testCtx(t)
	const n = 100
	leases := make([]subnet.Lease, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			leases[i], errs[i] = env.reg.Acquire(ctx, attrs(t, fmt.Sprintf("10.0.%d.%d", i/200, i%200+1)), netip.Prefix{})
		}()
	}
	close(start)
	wg.Wait()
	seen := map[netip.Prefix]int{}
	for i, l := range leases {
		if errs[i] != nil {
			t.Fatalf("node %d: %v", i, errs[i])
		}
		if j, dup := seen[l.Subnet]; dup {
			t.Fatalf("nodes %d and %d both got %s", j, i, l.Subnet)
		}
		seen[l.Subnet] = i
	}
	for p := range seen {
		for q := range seen {
			if p != q && p.Overlaps(q) {
				t.Fatalf("%s overlaps %s", p, q)
			}
		}
	}
	resp, err := env.client.Get(ctx, testPrefix+"/subnets/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != n {
		t.Errorf("etcd holds %d leases, want %d (no orphans)", len(resp.Kvs), n)
	}
	for _, kv := range resp.Kvs {
		var a subnet.LeaseAttrs
		if err := json.Unmarshal(kv.Value, &a); err != nil {
			t.Fatal(err)
		}
		v4, _, _ := subnet.ParseKey(strings.TrimPrefix(string(kv.Key), testPrefix+"/subnets/"))
		if i, ok := seen[v4]; !ok || leases[i].Attrs.PublicIP != a.PublicIP {
			t.Errorf("key %s holds %s, not the node Acquire returned it to", kv.Key, a.PublicIP)
		}
	}
	t.Logf("lost races: %d", countLines(env.logs.String(), "lost a race"))
}

func TestAcquireDualStackAndIPv6Only(t *testing.T) {
	t.Parallel()
	v6mac := subnet.MAC{0xc6, 0, 0, 0, 0, 1}
	tests := []struct {
		name  string
		conf  string
		attrs subnet.LeaseAttrs
		v4    bool
	}{
		{
			name: "dual-stack",
			conf: `{"EnableIPv6": true, "Network": "10.42.0.0/16", "IPv6Network": "fd00:10:42::/56"}`,
			attrs: subnet.LeaseAttrs{PublicIP: netip.MustParseAddr("192.168.1.1"), PublicIPv6: netip.MustParseAddr("fd77::1"),
				BackendType: "vxlan", BackendData: &subnet.VXLANData{VNI: 1, VtepMAC: subnet.MAC{0x4e, 0, 0, 0, 0, 1}},
				BackendV6Data: &subnet.VXLANData{VNI: 1, VtepMAC: v6mac}},
			v4: true,
		},
		{
			name: "IPv6-only",
			conf: `{"EnableIPv4": false, "EnableIPv6": true, "IPv6Network": "fd00:10:42::/56"}`,
			attrs: subnet.LeaseAttrs{PublicIPv6: netip.MustParseAddr("fd77::1"),
				BackendType: "vxlan", BackendV6Data: &subnet.VXLANData{VNI: 1, VtepMAC: v6mac}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := newEnv(t, tt.conf)
			ctx := testCtx(t)
			cfg, err := env.reg.Config(ctx)
			if err != nil {
				t.Fatal(err)
			}
			l, err := env.reg.Acquire(ctx, tt.attrs, netip.Prefix{})
			if err != nil {
				t.Fatal(err)
			}
			if l.Subnet.IsValid() != tt.v4 || (tt.v4 && !cfg.Fits(l.Subnet)) || !cfg.Fits(l.IPv6Subnet) {
				t.Fatalf("acquired %s / %s", l.Subnet, l.IPv6Subnet)
			}
			if !strings.Contains(l.Key(), "&") {
				t.Errorf("key %q does not carry the IPv6 subnet", l.Key())
			}
			if _, _, ok := env.get(t, subnetsKey(l)); !ok {
				t.Fatalf("no key %s in etcd", subnetsKey(l))
			}
			// Reused by the same node, found by PublicIPv6 when IPv4 is off.
			again, err := env.reg.Acquire(ctx, tt.attrs, netip.Prefix{})
			if err != nil || again.Key() != l.Key() {
				t.Errorf("second Acquire = %s, %v; want %s", again.Key(), err, l.Key())
			}
			other := tt.attrs
			other.PublicIP, other.PublicIPv6 = netip.Addr{}, netip.MustParseAddr("fd77::2")
			if tt.v4 {
				other.PublicIP = netip.MustParseAddr("192.168.1.2")
			}
			o, err := env.reg.Acquire(ctx, other, netip.Prefix{})
			if err != nil {
				t.Fatal(err)
			}
			if o.IPv6Subnet == l.IPv6Subnet || (tt.v4 && o.Subnet == l.Subnet) {
				t.Errorf("second node got %s, overlapping %s", o.Key(), l.Key())
			}
		})
	}
}

func TestAcquireDeletesOwnStaleLease(t *testing.T) {
	t.Parallel()
	env := newEnv(t, netConf)
	ctx := testCtx(t)
	a := attrs(t, "10.0.0.1")
	value, _ := json.Marshal(a)
	grant, err := env.client.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	staleKey := testPrefix + "/subnets/10.99.0.0-24" // from an older config
	env.put(t, staleKey, string(value), clientv3.WithLease(grant.ID))
	reservedKey := testPrefix + "/subnets/10.98.0.0-24" // an admin's, also outside
	env.put(t, reservedKey, string(value))

	l, err := env.reg.Acquire(ctx, a, netip.Prefix{})
	if err != nil {
		t.Fatal(err)
	}
	if cfg, _ := env.reg.Config(ctx); !cfg.Fits(l.Subnet) {
		t.Errorf("got %s", l.Subnet)
	}
	if _, _, ok := env.get(t, staleKey); ok {
		t.Error("our lease outside the config was not deleted")
	}
	if _, _, ok := env.get(t, reservedKey); !ok {
		t.Error("an admin's reservation outside the config was deleted")
	}
}

func TestAcquireErrors(t *testing.T) {
	t.Parallel()
	env := newEnv(t, netConf)
	ctx := testCtx(t)
	tests := []struct {
		name  string
		reg   *Registry
		attrs subnet.LeaseAttrs
		want  string
	}{
		{"no PublicIP", env.reg, subnet.LeaseAttrs{BackendType: "vxlan"}, "no PublicIP"},
		{"IPv6 in PublicIP", env.reg, subnet.LeaseAttrs{PublicIP: netip.MustParseAddr("fd00::1")}, "not an IPv4 address"},
		{"nil client", New(nil, Options{}, nil), attrs(t, "10.0.0.1"), "no client"},
		{"negative TTL", env.registry(Options{TTL: -1}), attrs(t, "10.0.0.1"), "TTL -1ns: must be positive"},
		{"no config", env.registry(Options{Prefix: "/nothing"}), attrs(t, "10.0.0.1"), "/nothing/config: key not found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.reg.Acquire(ctx, tt.attrs, netip.Prefix{})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Acquire error %v, want one containing %q", err, tt.want)
			}
		})
	}
	v6only := newEnv(t, `{"EnableIPv4": false, "EnableIPv6": true, "IPv6Network": "fd00::/56"}`)
	if _, err := v6only.reg.Acquire(ctx, attrs(t, "10.0.0.1"), netip.Prefix{}); err == nil || !strings.Contains(err.Error(), "no PublicIPv6") {
		t.Errorf("IPv6-only without PublicIPv6: %v", err)
	}
}

// TestAcquireConcurrentDualStack: a dual-stack key names two subnets, so
// two nodes that pick different IPv4 subnets and the same IPv6 one write
// different keys; the create must still see the race. 12 nodes start at
// once with 16 IPv6 subnets to pick from, where random picks collide.
func TestAcquireConcurrentDualStack(t *testing.T) {
	t.Parallel()
	env := newEnv(t, `{"EnableIPv6": true, "Network": "10.42.0.0/16", "IPv6Network": "fd00:10:42::/60", "IPv6SubnetLen": 64}`)
	ctx := testCtx(t)
	const n = 12
	leases := make([]subnet.Lease, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			a := attrs(t, fmt.Sprintf("10.0.0.%d", i+1))
			a.PublicIPv6 = netip.MustParseAddr(fmt.Sprintf("fd77::%d", i+1))
			leases[i], errs[i] = env.reg.Acquire(ctx, a, netip.Prefix{})
		})
	}
	close(start)
	wg.Wait()
	v4, v6 := map[netip.Prefix]int{}, map[netip.Prefix]int{}
	for i, l := range leases {
		if errs[i] != nil {
			t.Fatalf("node %d: %v", i, errs[i])
		}
		if j, dup := v4[l.Subnet]; dup {
			t.Errorf("nodes %d and %d both got %s", j, i, l.Subnet)
		}
		if j, dup := v6[l.IPv6Subnet]; dup {
			t.Errorf("nodes %d and %d both got %s", j, i, l.IPv6Subnet)
		}
		v4[l.Subnet], v6[l.IPv6Subnet] = i, i
	}
	t.Logf("lost races: %d", countLines(env.logs.String(), "lost a race"))
}
