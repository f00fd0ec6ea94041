package etcd

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/weft-net/weft/subnet"
)

// runPresence starts p.Run until the test ends or stop is called.
func runPresence(t *testing.T, p *Presence) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return stop
}

func newTestPresence(t *testing.T, c *clientv3.Client, node string) *Presence {
	t.Helper()
	p, err := NewPresence(c, node, []netip.Addr{netip.MustParseAddr("10.0.2.15")},
		PresenceOptions{TTL: 5 * time.Second, Retry: 100 * time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func waitClaimed(t *testing.T, p *Presence, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	select {
	case <-p.Claimed():
		return time.Since(start)
	case <-time.After(within):
		t.Fatalf("not claimed within %s: %v", within, p.Err())
		return 0
	}
}

// TestPresenceRefusesALiveNodesAddress: a second node that advertises the
// first's address is refused while the first runs, names it, and gets the
// address at once when the first stops (its record deleted), or within
// the TTL when it dies without deleting it. The same node name starting
// again (a restart) gets the address at once.
func TestPresenceRefusesALiveNodesAddress(t *testing.T) {
	t.Parallel()
	env := newEnv(t, "")
	key := DefaultPrefix + "/weft-presence/10.0.2.15"

	n1 := newTestPresence(t, env.client, "n1")
	stop1 := runPresence(t, n1)
	waitClaimed(t, n1, 5*time.Second)
	if v, _, _ := env.get(t, key); v != "n1" {
		t.Fatalf("presence record %q, want n1", v)
	}

	n2 := newTestPresence(t, env.client, "n2")
	stop2 := runPresence(t, n2)
	time.Sleep(500 * time.Millisecond)
	select {
	case <-n2.Claimed():
		t.Fatal("n2 claimed the address n1 advertises while n1 runs")
	default:
	}
	if err := n2.Err(); !errors.Is(err, subnet.ErrPublicIPTaken) || !strings.Contains(err.Error(), `running node "n1"`) {
		t.Fatalf("n2's error %v, want ErrPublicIPTaken naming n1", err)
	}

	stop1() // a clean stop deletes the record
	took := waitClaimed(t, n2, 2*time.Second)
	t.Logf("n2 claimed the address %s after n1 stopped", took.Round(time.Millisecond))
	if v, _, _ := env.get(t, key); v != "n2" {
		t.Fatalf("presence record %q, want n2", v)
	}

	// n2 dies without deleting its record: its client is closed.
	stop2()
	dead := newTestClient(t, env.srv.Endpoint)
	n2 = newTestPresence(t, dead, "n2")
	runPresence(t, n2)
	waitClaimed(t, n2, 5*time.Second)
	dead.Close()

	// n2 restarting (the same name) does not wait for its old record.
	again := newTestClient(t, env.srv.Endpoint)
	n2b := newTestPresence(t, again, "n2")
	runPresence(t, n2b)
	waitClaimed(t, n2b, 2*time.Second)
	again.Close()

	// A new machine with n2's address waits at most the TTL.
	n3 := newTestPresence(t, env.client, "n3")
	runPresence(t, n3)
	took = waitClaimed(t, n3, 8*time.Second)
	t.Logf("n3 claimed the address %s after n2 died (TTL 5s)", took.Round(time.Millisecond))
}

// TestPresenceClaimsAgainAfterALapse: when the record's etcd lease is gone
// (etcd out of reach for longer than the TTL), Run puts it back.
func TestPresenceClaimsAgainAfterALapse(t *testing.T) {
	t.Parallel()
	env := newEnv(t, "")
	ctx := testCtx(t)
	key := DefaultPrefix + "/weft-presence/10.0.2.15"
	p := newTestPresence(t, env.client, "n1")
	runPresence(t, p)
	waitClaimed(t, p, 5*time.Second)
	resp, err := env.client.Get(ctx, key)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("get %s: %v", key, err)
	}
	if _, err := env.client.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if v, _, _ := env.get(t, key); v == "n1" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the record was not put back within 5s of its lease being revoked")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestPresenceOptions: bad options are refused.
func TestPresenceOptions(t *testing.T) {
	t.Parallel()
	env := newEnv(t, "")
	a := []netip.Addr{netip.MustParseAddr("10.0.2.15")}
	for _, tc := range []struct {
		name  string
		node  string
		addrs []netip.Addr
		opts  PresenceOptions
		want  string
	}{
		{"no node", "", a, PresenceOptions{}, "no node name"},
		{"no address", "n1", []netip.Addr{{}}, PresenceOptions{}, "no public address"},
		{"short TTL", "n1", a, PresenceOptions{TTL: time.Second}, "at least 5s"},
	} {
		if _, err := NewPresence(env.client, tc.node, tc.addrs, tc.opts, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}
