package etcd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/weft-net/weft/subnet"
)

func leaseCount(t *testing.T, c *clientv3.Client) int {
	t.Helper()
	resp, err := c.Leases(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	return len(resp.Leases)
}

func TestRenewLost(t *testing.T) {
	t.Parallel()
	env := newEnv(t, netConf)
	ctx := testCtx(t)
	other, _ := json.Marshal(attrs(t, "10.0.0.99"))
	tests := []struct {
		name   string
		change func(key string)
		lost   bool
	}{
		{"key deleted", func(key string) {
			if _, err := env.client.Delete(ctx, key); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"taken over by another node", func(key string) { env.put(t, key, string(other)) }, true},
		{"turned into a reservation", func(key string) {
			v, _, _ := env.get(t, key)
			env.put(t, key, v) // same value, no etcd lease
		}, false},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, err := env.reg.Acquire(ctx, attrs(t, fmt.Sprintf("10.0.0.%d", i+1)), netip.Prefix{})
			if err != nil {
				t.Fatal(err)
			}
			key := subnetsKey(l)
			tt.change(key)
			before, _, _ := env.get(t, key)
			leases := leaseCount(t, env.client)
			got, err := env.reg.Renew(ctx, l)
			if tt.lost {
				if !errors.Is(err, subnet.ErrLeaseLost) || !strings.Contains(err.Error(), key) {
					t.Fatalf("Renew = %v, want ErrLeaseLost naming %s", err, key)
				}
			} else {
				if err != nil || !got.Expiration.IsZero() || got.Subnet != l.Subnet {
					t.Fatalf("Renew = %+v, %v; want the lease as a reservation", got, err)
				}
			}
			if after, leaseID, _ := env.get(t, key); after != before || leaseID != 0 {
				t.Errorf("Renew changed the key to %q (lease %x)", after, leaseID)
			}
			if n := leaseCount(t, env.client); n > leases {
				t.Errorf("Renew left %d etcd leases, had %d: the unused grant was not revoked", n, leases)
			}
		})
	}
	if _, err := env.reg.Renew(ctx, subnet.Lease{Expiration: time.Now()}); err == nil {
		t.Error("Renew of a lease without subnet succeeded")
	}
}

func TestRenewUnavailable(t *testing.T) {
	t.Parallel()
	_, env, proxy := newProxiedEnv(t, netConf)
	reg := env.registry(Options{TTL: 5 * time.Second, RequestTimeout: 500 * time.Millisecond})
	ctx := testCtx(t)
	l, err := reg.Acquire(ctx, attrs(t, "10.0.0.1"), netip.Prefix{})
	if err != nil {
		t.Fatal(err)
	}
	proxy.Pause()
	_, err = reg.Renew(ctx, l)
	if err == nil || errors.Is(err, subnet.ErrLeaseLost) {
		t.Fatalf("Renew with etcd unreachable = %v, want a plain error", err)
	}
	proxy.Resume()
	deadline := time.Now().Add(20 * time.Second)
	for {
		renewed, err := reg.Renew(ctx, l)
		if err == nil {
			if !renewed.Expiration.After(l.Expiration) {
				t.Errorf("renewed expiration %v, not after %v", renewed.Expiration, l.Expiration)
			}
			break
		}
		if errors.Is(err, subnet.ErrLeaseLost) || time.Now().After(deadline) {
			t.Fatalf("Renew after etcd came back: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := New(env.client, Options{}, nil).Renew(context.Background(), subnet.Lease{}); err != nil {
		t.Errorf("Renew of a reservation (zero lease) = %v, want no error", err)
	}
}

// TestMove: a moved lease keeps its key and etcd lease, and the next
// Acquire with the new address reuses it; a lease someone else rewrote is
// not moved.
func TestMove(t *testing.T) {
	t.Parallel()
	env := newEnv(t, netConf)
	ctx := testCtx(t)
	l, err := env.reg.Acquire(ctx, attrs(t, "10.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	key := subnetsKey(l)
	_, etcdLease, _ := env.get(t, key)
	moved, err := env.reg.Move(ctx, l, attrs(t, "10.0.0.2"))
	if err != nil {
		t.Fatal(err)
	}
	if v, id, _ := env.get(t, key); id != etcdLease || !strings.Contains(v, `"10.0.0.2"`) {
		t.Fatalf("after Move: %s with etcd lease %x, want 10.0.0.2 with %x", v, id, etcdLease)
	}
	again, err := env.reg.Acquire(ctx, attrs(t, "10.0.0.2"))
	if err != nil || again.Subnet != l.Subnet {
		t.Fatalf("Acquire at the new address: %v, %v; want the moved subnet %s", again.Subnet, err, l.Subnet)
	}
	env.put(t, key, string(must(json.Marshal(attrs(t, "10.0.0.9")))))
	if _, err := env.reg.Move(ctx, moved, attrs(t, "10.0.0.3")); !errors.Is(err, subnet.ErrLeaseLost) {
		t.Fatalf("Move of a lease another node rewrote: %v, want ErrLeaseLost", err)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
