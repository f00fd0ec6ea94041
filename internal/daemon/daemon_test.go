package daemon

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/weft-net/weft/backend"
	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/vtep"
)

// fakeRegistry is an in-memory registry: the unit layer for the daemon's
// control flow. The etcd and Kubernetes registries have their own tests and
// the daemon runs against real etcd in the end-to-end tests.
type fakeRegistry struct {
	mu       sync.Mutex
	cfg      *subnet.Config
	next     int
	acquired []netip.Prefix
	hints    []netip.Prefix
	renewals int
	renewErr error
	watchers []chan<- []subnet.Event
	ttl      time.Duration
}

func (r *fakeRegistry) Config(context.Context) (*subnet.Config, error) { return r.cfg, nil }

func (r *fakeRegistry) Acquire(_ context.Context, attrs subnet.LeaseAttrs, hints ...netip.Prefix) (subnet.Lease, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var hint netip.Prefix // the IPv4 one: the fake hands out IPv4 subnets only
	for _, h := range hints {
		if h.IsValid() && h.Addr().Is4() {
			hint = h
		}
	}
	r.hints = append(r.hints, hint)
	p := hint
	if !p.IsValid() {
		p = r.cfg.SubnetAt(false, uint64(r.next))
		r.next++
	}
	r.acquired = append(r.acquired, p)
	l := subnet.Lease{Subnet: p, Attrs: attrs}
	if r.ttl > 0 {
		l.Expiration = time.Now().Add(r.ttl)
	}
	return l, nil
}

func (r *fakeRegistry) Renew(_ context.Context, l subnet.Lease) (subnet.Lease, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.renewals++
	if r.renewErr != nil {
		return l, r.renewErr
	}
	l.Expiration = time.Now().Add(r.ttl)
	return l, nil
}

func (r *fakeRegistry) Watch(ctx context.Context, ch chan<- []subnet.Event) error {
	r.mu.Lock()
	r.watchers = append(r.watchers, ch)
	r.mu.Unlock()
	<-ctx.Done()
	return ctx.Err()
}

func (r *fakeRegistry) send(t *testing.T, evs ...subnet.Event) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		r.mu.Lock()
		var ch chan<- []subnet.Event
		if n := len(r.watchers); n > 0 {
			ch = r.watchers[n-1]
		}
		r.mu.Unlock()
		if ch != nil {
			ch <- evs
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no watcher")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// fakeBackend records the tables it is given. Like a real dataplane, which
// is ready only once it has programmed the kernel, it is ready only when the
// test says so (markReady), not on its first Set.
type fakeBackend struct {
	tables chan vtep.Table
	ready  chan struct{}
	once   sync.Once
}

func newFakeBackend() *fakeBackend {
	return &fakeBackend{tables: make(chan vtep.Table, 100), ready: make(chan struct{})}
}

func (b *fakeBackend) Run(ctx context.Context) error { <-ctx.Done(); return nil }
func (b *fakeBackend) Set(t vtep.Table)              { b.tables <- t }
func (b *fakeBackend) Ready() <-chan struct{}        { return b.ready }
func (b *fakeBackend) Stats() backend.Stats          { return backend.Stats{} }
func (b *fakeBackend) markReady()                    { b.once.Do(func() { close(b.ready) }) }

func testConfig(t *testing.T) *subnet.Config {
	cfg, err := subnet.ParseConfig([]byte(`{"Network":"10.244.0.0/16"}`))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func startDaemon(t *testing.T, reg *fakeRegistry, file string) (*Daemon, *fakeBackend) {
	t.Helper()
	d, fb, _ := startDaemonMetrics(t, reg, file)
	return d, fb
}

// startDaemonMetrics starts a daemon on reg with a fake backend; mods
// change its Config first.
func startDaemonMetrics(t *testing.T, reg *fakeRegistry, file string, mods ...func(*Config)) (*Daemon, *fakeBackend, *prometheus.Registry) {
	t.Helper()
	fb := newFakeBackend()
	preg := prometheus.NewRegistry()
	cfg := Config{
		Registry:      reg,
		Node:          Node{PublicIP: netip.MustParseAddr("192.168.77.1"), UnderlayMTU: 1500},
		SubnetFile:    file,
		IPMasq:        true,
		RenewMargin:   time.Hour,
		RetryInterval: 20 * time.Millisecond,
		Metrics:       NewMetrics(preg),
		Factories: Factories{Dataplane: func(typ string, _ *subnet.Config, _ subnet.Lease, mtu int) (Dataplane, error) {
			if typ != "vxlan" || mtu != 1450 {
				t.Errorf("dataplane factory got %s mtu %d", typ, mtu)
			}
			return Dataplane{Backend: fb}, nil
		}},
	}
	for _, m := range mods {
		m(&cfg)
	}
	d, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return d, fb, preg
}

func peerLease(n int) subnet.Lease {
	ip := netip.AddrFrom4([4]byte{192, 168, 77, byte(n)})
	return subnet.Lease{
		Subnet: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(n), 0}), 24),
		Attrs: subnet.LeaseAttrs{PublicIP: ip, BackendType: "vxlan",
			BackendData: &subnet.VXLANData{VNI: 1, VtepMAC: vtep.DeviceMAC(ip, 1)}},
	}
}

func waitTable(t *testing.T, fb *fakeBackend, want int) vtep.Table {
	t.Helper()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case tb := <-fb.tables:
			if len(tb) == want {
				return tb
			}
		case <-timeout:
			t.Fatalf("no table with %d peers", want)
		}
	}
}

func TestDaemonWritesFileAndProgramsPeers(t *testing.T) {
	reg := &fakeRegistry{cfg: testConfig(t)}
	file := filepath.Join(t.TempDir(), "subnet.env")
	d, fb, preg := startDaemonMetrics(t, reg, file)
	self := peerLease(1)
	self.Subnet = netip.MustParsePrefix("10.244.1.0/24")
	reg.send(t, subnet.Event{Lease: self}, subnet.Event{Lease: peerLease(2)}, subnet.Event{Lease: peerLease(3)})
	tb := waitTable(t, fb, 2)
	if v := tb[netip.MustParsePrefix("10.244.2.0/24")]; v.Addr.String() != "192.168.77.2" {
		t.Fatalf("peer 2: %+v", v)
	}
	f, err := subnet.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if f.Subnet.String() != "10.244.1.1/24" || f.MTU != 1450 || !f.IPMasq || f.Network.String() != "10.244.0.0/16" {
		t.Fatalf("subnet file %+v", f)
	}
	reg.send(t, subnet.Event{Type: subnet.EventRemoved, Lease: peerLease(2)})
	waitTable(t, fb, 1)
	waitFor(t, func() bool {
		return gauge(t, preg, "weft_peers") == 1 && gauge(t, preg, "weft_leases") == 2
	})
	// Tables handed over and the file written, but the dataplane has not
	// said it is programmed: the daemon must not report ready.
	if d.Ready() || gauge(t, preg, "weft_ready") != 0 {
		t.Fatal("daemon ready before its dataplane")
	}
	fb.markReady()
	waitFor(t, func() bool { return d.Ready() && gauge(t, preg, "weft_ready") == 1 })
}

// gauge sums the samples of a metric family gathered from reg.
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	return sum
}

func TestDaemonReacquiresLostLease(t *testing.T) {
	tests := []struct {
		name string
		ev   func(self subnet.Lease) subnet.Event
	}{
		{"deleted by an admin", func(self subnet.Lease) subnet.Event { return subnet.Event{Type: subnet.EventRemoved, Lease: self} }},
		{"taken over", func(self subnet.Lease) subnet.Event {
			other := self
			other.Attrs.PublicIP = netip.MustParseAddr("192.168.77.9")
			return subnet.Event{Lease: other}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := &fakeRegistry{cfg: testConfig(t)}
			d, _ := startDaemon(t, reg, filepath.Join(t.TempDir(), "subnet.env"))
			var self subnet.Lease
			waitFor(t, func() bool { l := d.Lease(); return l != nil && l.Subnet.IsValid() })
			self = *d.Lease()
			reg.send(t, tt.ev(self))
			waitFor(t, func() bool { reg.mu.Lock(); defer reg.mu.Unlock(); return len(reg.acquired) == 2 })
			reg.mu.Lock()
			defer reg.mu.Unlock()
			if reg.hints[1] != self.Subnet {
				t.Fatalf("re-acquired with hint %v, want %v", reg.hints[1], self.Subnet)
			}
		})
	}
}

func TestDaemonReusesSubnetFromFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "subnet.env")
	if err := subnet.WriteFile(file, subnet.File{Network: netip.MustParsePrefix("10.244.0.0/16"),
		Subnet: netip.MustParsePrefix("10.244.42.1/24"), MTU: 1450, IPMasq: true}); err != nil {
		t.Fatal(err)
	}
	reg := &fakeRegistry{cfg: testConfig(t)}
	d, _ := startDaemon(t, reg, file)
	waitFor(t, func() bool { return d.Lease() != nil })
	if got := d.Lease().Subnet.String(); got != "10.244.42.0/24" {
		t.Fatalf("lease %s, want the subnet from the file", got)
	}
}

func TestDaemonRenewsAndRetries(t *testing.T) {
	reg := &fakeRegistry{cfg: testConfig(t), ttl: 300 * time.Millisecond}
	reg.renewErr = context.DeadlineExceeded // a transient failure first
	startDaemon(t, reg, filepath.Join(t.TempDir(), "subnet.env"))
	waitFor(t, func() bool { reg.mu.Lock(); defer reg.mu.Unlock(); return reg.renewals >= 2 })
	reg.mu.Lock()
	reg.renewErr = nil
	n := reg.renewals
	reg.mu.Unlock()
	waitFor(t, func() bool { reg.mu.Lock(); defer reg.mu.Unlock(); return reg.renewals >= n+2 })
	reg.mu.Lock()
	defer reg.mu.Unlock()
	if len(reg.acquired) != 1 {
		t.Fatalf("acquired %d times; a transient renew failure must not drop the lease", len(reg.acquired))
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
