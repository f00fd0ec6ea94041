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
)

func TestRetryIn(t *testing.T) {
	for _, tt := range []struct{ every, spent, want time.Duration }{
		{5 * time.Second, 0, 5 * time.Second},                                  // failed at once: wait the interval
		{5 * time.Second, 2 * time.Second, 3 * time.Second},                    // the rest of it
		{5 * time.Second, 5 * time.Second, 0},                                  // used it all waiting: next at once
		{5 * time.Second, 10 * time.Second, 0},                                 // a request timeout longer than the interval
		{100 * time.Millisecond, 30 * time.Millisecond, 70 * time.Millisecond}, // near expiry
	} {
		if got := retryIn(tt.every, tt.spent); got != tt.want {
			t.Errorf("retryIn(%s, %s) = %s, want %s", tt.every, tt.spent, got, tt.want)
		}
	}
}

// outageRegistry is a registry whose datastore is unreachable until up is
// closed: like an etcd client waiting for its connection, a renewal waits
// for the datastore and fails after its request timeout.
type outageRegistry struct {
	*fakeRegistry
	up      chan struct{}
	timeout time.Duration
	failed  chan struct{} // one send per renewal that timed out
	renewed chan time.Time
}

func (r *outageRegistry) Renew(ctx context.Context, l subnet.Lease) (subnet.Lease, error) {
	select {
	case <-r.up:
		l, err := r.fakeRegistry.Renew(ctx, l)
		if err == nil {
			select {
			case r.renewed <- time.Now():
			default:
			}
		}
		return l, err
	case <-time.After(r.timeout):
		r.failed <- struct{}{}
		return l, context.DeadlineExceeded
	case <-ctx.Done():
		return l, ctx.Err()
	}
}

// TestDaemonRenewsWhenDatastoreReturns: the datastore returns just after a
// renewal attempt timed out. A renewal is already waiting then, so the
// lease is renewed at once, not one retry interval later.
func TestDaemonRenewsWhenDatastoreReturns(t *testing.T) {
	const retry = 2 * time.Second // the request timeout is as long: every attempt uses up the interval
	reg := &outageRegistry{fakeRegistry: &fakeRegistry{cfg: testConfig(t), ttl: time.Minute},
		up: make(chan struct{}), timeout: retry, failed: make(chan struct{}, 16), renewed: make(chan time.Time, 1)}
	fb := newFakeBackend()
	d, err := New(Config{
		Registry:      reg,
		Node:          Node{PublicIP: netip.MustParseAddr("192.168.77.1"), UnderlayMTU: 1500},
		SubnetFile:    filepath.Join(t.TempDir(), "subnet.env"),
		RenewMargin:   time.Minute - 100*time.Millisecond, // renew 100 ms after acquiring
		RetryInterval: retry,
		Factories: Factories{Dataplane: func(string, *subnet.Config, subnet.Lease, int) (Dataplane, error) {
			return Dataplane{Backend: fb}, nil
		}},
	}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	select {
	case <-reg.failed:
	case <-time.After(10 * time.Second):
		t.Fatal("no renewal attempted")
	}
	back := time.Now()
	close(reg.up)
	select {
	case at := <-reg.renewed:
		// Sleeping the retry interval after the failed attempt would renew
		// retry (2 s) after the return; half of it leaves room for a slow
		// machine and still tells the two apart.
		if took := at.Sub(back); took >= retry/2 {
			t.Errorf("renewed %s after the datastore returned; an attempt should have been waiting", took)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no renewal after the datastore returned")
	}
}
