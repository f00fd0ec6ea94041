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

const testPresenceTTL = 5 * time.Second

func newTestPresence(t *testing.T, c *clientv3.Client, node, instance string) *Presence {
	t.Helper()
	p, err := NewPresence(c, PresenceOwner{Node: node, Instance: instance}, []netip.Addr{netip.MustParseAddr("10.0.2.15")},
		PresenceOptions{TTL: testPresenceTTL, Retry: 100 * time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// waitHeld waits until p holds its claim and returns how long that took.
func waitHeld(t *testing.T, p *Presence, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		held, err := p.Held()
		if held {
			return time.Since(start)
		}
		if time.Since(start) > within {
			t.Fatalf("not held within %s: %v", within, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// refused checks that p does not hold its claim because of another owner
// whose error says want.
func refused(t *testing.T, p *Presence, want string) {
	t.Helper()
	held, err := p.Held()
	if held || !errors.Is(err, subnet.ErrPublicIPTaken) || !strings.Contains(err.Error(), want) {
		t.Fatalf("held %v, error %v; want refused with ErrPublicIPTaken saying %q", held, err, want)
	}
}

// TestPresenceRefusesALiveNodesAddress: a second node that advertises the
// first's address is refused while the first runs, and names it. A stop of
// the first does not let the second in: the same instance starting again
// takes its address back at once, and only when it is gone for the TTL
// does the second get it. Another instance with the first's name (a clone)
// is refused too.
func TestPresenceRefusesALiveNodesAddress(t *testing.T) {
	t.Parallel()
	env := newEnv(t, "")
	key := DefaultPrefix + "/weft-presence/10.0.2.15"

	n1 := newTestPresence(t, env.client, "n1", "i1")
	stop1 := runPresence(t, n1)
	waitHeld(t, n1, 5*time.Second)
	if v, _, _ := env.get(t, key); v != `{"node":"n1","instance":"i1"}` {
		t.Fatalf("presence record %q, want n1's", v)
	}

	n2 := newTestPresence(t, env.client, "n2", "i2")
	runPresence(t, n2)
	time.Sleep(500 * time.Millisecond)
	refused(t, n2, `advertised by the running node "n1", and this node is "n2"`)

	clone := newTestPresence(t, env.client, "n1", "i3")
	runPresence(t, clone)
	time.Sleep(300 * time.Millisecond)
	refused(t, clone, `another instance of node "n1"`)

	// A restart of n1: the record stays, n2 stays out, n1 is back at once.
	stop1()
	time.Sleep(500 * time.Millisecond)
	refused(t, n2, `"n1"`)
	n1 = newTestPresence(t, env.client, "n1", "i1")
	stop1 = runPresence(t, n1)
	if took := waitHeld(t, n1, 2*time.Second); took > time.Second {
		t.Errorf("n1 restarting took its address back after %s, want at once", took)
	}

	// n1 gone for good: its record expires and one of the waiting gets it.
	stop1()
	stopped := time.Now()
	deadline := stopped.Add(testPresenceTTL + 3*time.Second)
	for {
		h2, _ := n2.Held()
		hc, _ := clone.Held()
		if h2 || hc {
			t.Logf("the address went to a waiting node %s after n1 stopped (TTL %s)", time.Since(stopped).Round(100*time.Millisecond), testPresenceTTL)
			if h2 && hc {
				t.Fatal("two owners hold the address")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no waiting node got the address %s after n1 stopped (TTL %s)", time.Since(stopped), testPresenceTTL)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestPresenceClaimsAgainAfterALapse: when the record's etcd lease is gone
// (etcd out of reach for longer than the TTL), Run puts it back.
func TestPresenceClaimsAgainAfterALapse(t *testing.T) {
	t.Parallel()
	env := newEnv(t, "")
	ctx := testCtx(t)
	key := DefaultPrefix + "/weft-presence/10.0.2.15"
	p := newTestPresence(t, env.client, "n1", "i1")
	runPresence(t, p)
	waitHeld(t, p, 5*time.Second)
	resp, err := env.client.Get(ctx, key)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("get %s: %v", key, err)
	}
	if _, err := env.client.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if v, _, _ := env.get(t, key); strings.Contains(v, `"n1"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the record was not put back within 5s of its lease being revoked")
		}
		time.Sleep(50 * time.Millisecond)
	}
	waitHeld(t, p, 2*time.Second)
}

// TestPresenceLostToAnother: n1 is cut off from etcd for longer than the
// TTL, its record expires and n2, advertising the same address, claims it;
// when n1 is back its claim is not held and says why.
func TestPresenceLostToAnother(t *testing.T) {
	t.Parallel()
	admin, node, proxy := newProxiedEnv(t, netConf)
	n1 := newTestPresence(t, node.client, "n1", "i1")
	runPresence(t, n1)
	waitHeld(t, n1, 5*time.Second)
	proxy.Pause()
	n2 := newTestPresence(t, admin.client, "n2", "i2")
	runPresence(t, n2)
	waitHeld(t, n2, testPresenceTTL+5*time.Second)
	proxy.Resume()
	deadline := time.Now().Add(testPresenceTTL + 5*time.Second)
	for {
		held, err := n1.Held()
		if !held && errors.Is(err, subnet.ErrPublicIPTaken) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("n1 after the cut: held %v, %v; want refused naming n2", held, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	refused(t, n1, `running node "n2"`)
}

// TestPresenceOptions: bad options are refused.
func TestPresenceOptions(t *testing.T) {
	t.Parallel()
	env := newEnv(t, "")
	a := []netip.Addr{netip.MustParseAddr("10.0.2.15")}
	for _, tc := range []struct {
		name  string
		owner PresenceOwner
		addrs []netip.Addr
		opts  PresenceOptions
		want  string
	}{
		{"no node", PresenceOwner{Instance: "i"}, a, PresenceOptions{}, "no node name"},
		{"no instance", PresenceOwner{Node: "n1"}, a, PresenceOptions{}, "no instance token"},
		{"no address", PresenceOwner{Node: "n1", Instance: "i"}, []netip.Addr{{}}, PresenceOptions{}, "no public address"},
		{"short TTL", PresenceOwner{Node: "n1", Instance: "i"}, a, PresenceOptions{TTL: time.Second}, "at least 5s"},
	} {
		if _, err := NewPresence(env.client, tc.owner, tc.addrs, tc.opts, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}
