package etcd

import (
	"context"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/weft-net/weft/internal/etcdlocal"
	"github.com/weft-net/weft/internal/testkit/testlog"
	"github.com/weft-net/weft/subnet"
)

const testPrefix = "/coreos.com/network"

// testlog.Buffer collects log output safely from many goroutines.

// testEnv is one embedded etcd with a client and a registry on it.
type testEnv struct {
	srv    *etcdlocal.Server
	client *clientv3.Client
	reg    *Registry
	logs   *testlog.Buffer
}

// newEnv starts etcd, writes config (unless empty) and returns a registry
// with a short TTL.
func newEnv(t *testing.T, config string) *testEnv {
	t.Helper()
	srv, err := etcdlocal.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	env := &testEnv{srv: srv, client: newTestClient(t, srv.Endpoint), logs: &testlog.Buffer{}}
	if config != "" {
		env.put(t, testPrefix+"/config", config)
	}
	env.reg = env.registry(Options{TTL: 5 * time.Second})
	return env
}

// newProxiedEnv starts etcd with the network config and returns an admin
// env talking to etcd directly and a node env talking through a proxy that
// the test can pause to cut the node off.
func newProxiedEnv(t *testing.T, config string) (admin, node *testEnv, proxy *etcdlocal.Proxy) {
	t.Helper()
	dir := t.TempDir()
	srv, err := etcdlocal.Start(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	proxy, err = etcdlocal.NewProxy(dir, srv.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	admin = &testEnv{srv: srv, client: newTestClient(t, srv.Endpoint), logs: &testlog.Buffer{}}
	admin.put(t, testPrefix+"/config", config)
	admin.reg = admin.registry(Options{TTL: 60 * time.Second})
	node = &testEnv{srv: srv, client: newTestClient(t, proxy.Endpoint), logs: &testlog.Buffer{}}
	return admin, node, proxy
}

func newTestClient(t *testing.T, endpoints ...string) *clientv3.Client {
	t.Helper()
	c, err := NewClient(ClientConfig{Endpoints: endpoints})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func (e *testEnv) registry(opts Options) *Registry {
	log := slog.New(slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	return New(e.client, opts, log)
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func (e *testEnv) put(t *testing.T, key, value string, opts ...clientv3.OpOption) {
	t.Helper()
	if _, err := e.client.Put(testCtx(t), key, value, opts...); err != nil {
		t.Fatal(err)
	}
}

// get returns the value and etcd lease of key; ok is false when it is missing.
func (e *testEnv) get(t *testing.T, key string) (value string, lease clientv3.LeaseID, ok bool) {
	t.Helper()
	resp, err := e.client.Get(testCtx(t), key)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return "", 0, false
	}
	return string(resp.Kvs[0].Value), clientv3.LeaseID(resp.Kvs[0].Lease), true
}

// attrs returns vxlan lease attrs for a node with IPv4 address ip.
func attrs(t *testing.T, ip string) subnet.LeaseAttrs {
	t.Helper()
	a := netip.MustParseAddr(ip)
	b := a.As4()
	return subnet.LeaseAttrs{PublicIP: a, BackendType: subnet.BackendTypeVXLAN,
		BackendData: &subnet.VXLANData{VNI: 1, VtepMAC: subnet.MAC{0x4e, 0xfb, b[0], b[1], b[2], b[3]}}}
}

// watchRun runs Watch in the background and returns its event channel and
// a function that stops it and returns its error.
func watchRun(t *testing.T, reg *Registry) (<-chan []subnet.Event, func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	ch := make(chan []subnet.Event, 100)
	done := make(chan error, 1)
	go func() { done <- reg.Watch(ctx, ch) }()
	var once sync.Once
	var err error
	stop := func() error {
		once.Do(func() { cancel(); err = <-done })
		return err
	}
	t.Cleanup(func() { stop() })
	return ch, stop
}

// leaseSet follows watch batches into the set of leases they describe.
type leaseSet map[string]subnet.Lease

func (s leaseSet) apply(t *testing.T, batch []subnet.Event) {
	t.Helper()
	if len(batch) == 0 {
		t.Error("Watch sent an empty batch")
	}
	for _, ev := range batch {
		if ev.Type == subnet.EventRemoved {
			delete(s, ev.Lease.Key())
		} else {
			s[ev.Lease.Key()] = ev.Lease
		}
	}
}

// waitFor reads batches into s until cond holds or 20s pass.
func waitFor(t *testing.T, ch <-chan []subnet.Event, s leaseSet, what string, cond func(leaseSet) bool) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for !cond(s) {
		select {
		case batch := <-ch:
			s.apply(t, batch)
		case <-deadline:
			t.Fatalf("timed out waiting for %s; have %v", what, keys(s))
		}
	}
}

// nextBatch returns the next batch within 20s.
func nextBatch(t *testing.T, ch <-chan []subnet.Event) []subnet.Event {
	t.Helper()
	select {
	case b := <-ch:
		return b
	case <-time.After(20 * time.Second):
		t.Fatal("no watch batch within 20s")
		return nil
	}
}

// noBatch fails if a batch arrives within d.
func noBatch(t *testing.T, ch <-chan []subnet.Event, d time.Duration) {
	t.Helper()
	select {
	case b := <-ch:
		t.Errorf("unexpected watch batch %v", b)
	case <-time.After(d):
	}
}

func keys(s leaseSet) []string {
	var out []string
	for k := range s {
		out = append(out, k)
	}
	return out
}

func hasKey(key string) func(leaseSet) bool {
	return func(s leaseSet) bool { _, ok := s[key]; return ok }
}

func lacksKey(key string) func(leaseSet) bool {
	return func(s leaseSet) bool { _, ok := s[key]; return !ok }
}

func countLines(logs, substr string) int {
	n := 0
	for _, line := range strings.Split(logs, "\n") {
		if strings.Contains(line, substr) {
			n++
		}
	}
	return n
}
