package e2e

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/weft-net/weft/internal/etcdlocal"
	"github.com/weft-net/weft/internal/testkit/testlog"
	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/subnet/etcd"
)

// TestFlannel954SubnetChurn answers flannel-io/flannel#954, #875 and #904
// (leases of nodes that went away are never freed, and new nodes get "out
// of subnets"): 300 short-lived nodes, each with a fresh address, join and
// leave a /16 of /24s (256 subnets) with a 4 s lease TTL, on a real etcd,
// one joining every 10 ms.
// Each node is a Registry of its own (as each weftd has one) that acquires,
// renews at half the TTL while it lives (0.3 s to the TTL and 0.3 s), then
// stops renewing without releasing anything, as a deleted VM does. A node
// joins only while fewer than 256 leases can be held: the live nodes plus
// those that left within the TTL and a quarter of it (etcd expires leases on
// a 0.5 s tick, later when busy). Every
// acquisition must then succeed at its first call: "out of subnets" (or
// any other error) while a subnet is free fails the test, as does a subnet
// handed to two live nodes. At the end every lease must be gone within 1.25
// TTL of the last node leaving. This drives the real lease code
// in-process (300 weftd processes would not fit a 2-core machine); the
// renewal timer is the test's, weftd's own is tested in internal/daemon.
func TestFlannel954SubnetChurn(t *testing.T) {
	const (
		nodes = 300
		pace  = 10 * time.Millisecond // between joins: 100 nodes a second
	)
	ttl := 4 * time.Second
	slack := ttl / 4 // etcd expires leases on a 0.5 s tick, later when busy
	srv, err := etcdlocal.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	client, err := etcd.NewClient(etcd.ClientConfig{Endpoints: []string{srv.Endpoint}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	if _, err := client.Put(ctx, etcd.DefaultPrefix+"/config",
		`{"Network":"10.244.0.0/16","SubnetLen":24,"SubnetMin":"10.244.0.0","SubnetMax":"10.244.255.0","Backend":{"Type":"vxlan"}}`); err != nil {
		t.Fatal(err)
	}
	logs := &testlog.Buffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg, err := etcd.New(client, etcd.Options{}, log).Config(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pool := int(cfg.SubnetCount(false))
	if pool != 256 {
		t.Fatalf("the config has %d subnets, want 256", pool)
	}

	var (
		mu       sync.Mutex
		alive    int
		departed []time.Time
		live     = map[netip.Prefix]int{} // subnet → node holding it
		maxHeld  int
		errs     []error
		wg       sync.WaitGroup
	)
	// held bounds the leases in etcd: live nodes plus those that left
	// within the TTL and the slack. Call with mu held.
	held := func(now time.Time) int {
		n := alive
		for _, d := range departed {
			if now.Sub(d) < ttl+slack {
				n++
			}
		}
		return n
	}
	fail := func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}
	start := time.Now()
	for i := range nodes {
		for {
			mu.Lock()
			if held(time.Now()) < pool {
				alive++
				maxHeld = max(maxHeld, held(time.Now()))
				mu.Unlock()
				break
			}
			mu.Unlock()
			time.Sleep(20 * time.Millisecond)
		}
		time.Sleep(pace)
		ip := netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)})
		life := 300*time.Millisecond + rand.N(ttl)
		reg := etcd.New(client, etcd.Options{TTL: ttl}, log)
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := ip.As4()
			l, err := reg.Acquire(ctx, subnet.LeaseAttrs{PublicIP: ip, BackendType: subnet.BackendTypeVXLAN,
				BackendData: &subnet.VXLANData{VNI: 1, VtepMAC: subnet.MAC{0x4e, 0xfb, b[0], b[1], b[2], b[3]}}})
			if err != nil {
				mu.Lock()
				h := held(time.Now()) - 1 // the others
				alive--
				mu.Unlock()
				if errors.Is(err, subnet.ErrExhausted) {
					err = fmt.Errorf("out of subnets with at most %d other leases held of %d: %w", h, pool, err)
				}
				fail(fmt.Errorf("node %d (%s): %w", i, ip, err))
				return
			}
			mu.Lock()
			if other, ok := live[l.Subnet]; ok {
				errs = append(errs, fmt.Errorf("node %d got %s, held by live node %d", i, l.Subnet, other))
			}
			live[l.Subnet] = i
			mu.Unlock()
			end := time.Now().Add(life)
			for {
				// As weftd: renew when half the TTL is left, by the
				// expiry the registry reported (not after a fixed
				// sleep, which a slow call would stretch).
				time.Sleep(min(time.Until(l.Expiration.Add(-ttl/2)), time.Until(end)))
				if time.Until(end) <= 0 {
					break
				}
				left, began := time.Until(l.Expiration), time.Now()
				if l, err = reg.Renew(ctx, l); err != nil {
					fail(fmt.Errorf("node %d (%s) renew %s with %s left, %s: %w", i, ip, l.Subnet,
						left.Round(time.Millisecond), time.Since(began).Round(time.Millisecond), err))
					break
				}
			}
			mu.Lock()
			alive--
			departed = append(departed, time.Now())
			delete(live, l.Subnet)
			mu.Unlock()
		}()
	}
	wg.Wait()
	last := time.Now()
	took := time.Since(start)
	for _, err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		t.FailNow()
	}
	// Nothing renews any more: every lease must expire.
	var left int64
	for {
		resp, err := client.Get(ctx, etcd.DefaultPrefix+"/subnets/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		if left = resp.Count; left == 0 {
			break
		}
		if time.Since(last) > ttl+slack {
			t.Fatalf("%d leases still in etcd %s after the last node stopped renewing (TTL %s)", left, time.Since(last).Round(time.Millisecond), ttl)
		}
		time.Sleep(50 * time.Millisecond)
	}
	recordFailure(t, "954", fmt.Sprintf("churn: %d nodes joined and left %d subnets in %s, up to %d leases held at once, no acquisition failed (%d lost races retried); "+
		"all leases gone %s after the last node stopped renewing (TTL %s)",
		nodes, pool, took.Round(time.Millisecond), maxHeld, strings.Count(logs.String(), "lost a race for a subnet"),
		time.Since(last).Round(time.Millisecond), ttl))
}
