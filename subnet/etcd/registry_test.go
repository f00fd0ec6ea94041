package etcd

import (
	"context"
	"encoding/json"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/weft-net/weft/subnet"
)

const netConf = `{"Network": "10.244.0.0/16", "Backend": {"Type": "vxlan"}}`

func TestConfig(t *testing.T) {
	t.Parallel()
	env := newEnv(t, "")
	ctx := testCtx(t)
	_, err := env.reg.Config(ctx)
	if err == nil || !strings.Contains(err.Error(), testPrefix+"/config") || !strings.Contains(err.Error(), "not found") {
		t.Errorf("missing config: error %v, want one naming %s/config", err, testPrefix)
	}
	env.put(t, testPrefix+"/config", `{"Network": "10.244.0.0/33"}`)
	if _, err := env.reg.Config(ctx); err == nil || !strings.Contains(err.Error(), "not a CIDR") {
		t.Errorf("bad config: error %v", err)
	}
	env.put(t, testPrefix+"/config", netConf)
	cfg, err := env.reg.Config(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Network != netip.MustParsePrefix("10.244.0.0/16") || cfg.SubnetLen != 24 {
		t.Errorf("Config = %+v", cfg)
	}
	// Another prefix, with a trailing slash.
	env.put(t, "/weft/net/config", `{"Network": "10.9.0.0/16"}`)
	other := env.registry(Options{Prefix: "/weft/net/"})
	if cfg, err := other.Config(ctx); err != nil || cfg.Network != netip.MustParsePrefix("10.9.0.0/16") {
		t.Errorf("Config under /weft/net = %+v, %v", cfg, err)
	}
}

func TestAcquireRenewWatch(t *testing.T) {
	t.Parallel()
	env := newEnv(t, netConf)
	ctx := testCtx(t)
	ch, stop := watchRun(t, env.reg)

	a := attrs(t, "192.168.77.1")
	l, err := env.reg.Acquire(ctx, a, netip.Prefix{})
	if err != nil {
		t.Fatal(err)
	}
	cfg, _ := env.reg.Config(ctx)
	if !cfg.Fits(l.Subnet) || l.IPv6Subnet.IsValid() {
		t.Errorf("acquired %v / %v, which the config cannot hand out", l.Subnet, l.IPv6Subnet)
	}
	if l.Expiration.IsZero() || time.Until(l.Expiration) > 5*time.Second || l.Revision == 0 {
		t.Errorf("lease expiration %v, revision %d", l.Expiration, l.Revision)
	}
	key := testPrefix + "/subnets/" + l.Key()
	value, leaseID, ok := env.get(t, key)
	want, _ := json.Marshal(a)
	if !ok || value != string(want) || leaseID == 0 {
		t.Fatalf("etcd holds %q (lease %x, present %t), want %s with a lease", value, leaseID, ok, want)
	}

	s := leaseSet{}
	waitFor(t, ch, s, "our lease in the watch", hasKey(l.Key()))
	if got := s[l.Key()]; got.Attrs.PublicIP != a.PublicIP || got.Revision != l.Revision {
		t.Errorf("watched lease %+v, want %+v", got, l)
	}

	time.Sleep(1100 * time.Millisecond) // so that the new expiration is later
	renewed, err := env.reg.Renew(ctx, l)
	if err != nil {
		t.Fatal(err)
	}
	if !renewed.Expiration.After(l.Expiration) || renewed.Subnet != l.Subnet || renewed.Revision <= l.Revision {
		t.Errorf("renewed %+v from %+v", renewed, l)
	}
	if _, newID, _ := env.get(t, key); newID == leaseID || newID == 0 {
		t.Errorf("renewal left etcd lease %x (was %x)", newID, leaseID)
	}
	// The replaced etcd lease is revoked.
	if ttl, err := env.client.TimeToLive(ctx, leaseID); err != nil || ttl.TTL != -1 {
		t.Errorf("old etcd lease: TTL %v, %v; want revoked (-1)", ttl, err)
	}
	noBatch(t, ch, 200*time.Millisecond) // a renewal is no change

	if err := stop(); !errors.Is(err, context.Canceled) {
		t.Errorf("Watch returned %v after cancel, want context.Canceled", err)
	}
}

func TestMethodsReportBadOptions(t *testing.T) {
	t.Parallel()
	env := newEnv(t, netConf)
	ctx := testCtx(t)
	tests := []struct {
		name string
		reg  *Registry
		want string
	}{
		{"nil client", New(nil, Options{}, nil), "no client"},
		{"negative TTL", env.registry(Options{TTL: -time.Second}), "TTL -1s"},
		{"negative retries", env.registry(Options{RaceRetries: -1}), "RaceRetries -1"},
		{"negative timeout", env.registry(Options{RequestTimeout: -time.Second}), "RequestTimeout -1s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			errs := map[string]error{}
			_, errs["Config"] = tt.reg.Config(ctx)
			_, errs["Acquire"] = tt.reg.Acquire(ctx, attrs(t, "10.0.0.1"), netip.Prefix{})
			_, errs["Renew"] = tt.reg.Renew(ctx, subnet.Lease{Subnet: netip.MustParsePrefix("10.244.1.0/24"), Expiration: time.Now()})
			errs["Watch"] = tt.reg.Watch(ctx, make(chan []subnet.Event))
			for method, err := range errs {
				if err == nil || !strings.Contains(err.Error(), tt.want) {
					t.Errorf("%s: %v, want an error containing %q", method, err, tt.want)
				}
			}
		})
	}
	if err := env.reg.Watch(ctx, nil); err == nil {
		t.Error("Watch with a nil channel succeeded")
	}
}
