package etcd

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/weft-net/weft/internal/etcdlocal"
	"github.com/weft-net/weft/internal/testkit/testlog"
	"github.com/weft-net/weft/subnet"
)

// retry calls f until it succeeds or 20s pass, and returns how many calls
// failed first.
func retry(t *testing.T, what string, f func() error) int {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for failed := 0; ; failed++ {
		err := f()
		if err == nil {
			return failed
		}
		if errors.Is(err, subnet.ErrLeaseLost) || time.Now().After(deadline) {
			t.Fatalf("%s: %v (after %d failures)", what, err, failed)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// etcdLeases lists what etcd holds under the subnets prefix.
func etcdLeases(t *testing.T, c *clientv3.Client) map[string]string {
	t.Helper()
	out := map[string]string{}
	retry(t, "list leases", func() error {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		resp, err := c.Get(ctx, testPrefix+"/subnets/", clientv3.WithPrefix())
		if err != nil {
			return err
		}
		for _, kv := range resp.Kvs {
			out[strings.TrimPrefix(string(kv.Key), testPrefix+"/subnets/")] = string(kv.Value)
		}
		return nil
	})
	return out
}

func sameLeases(t *testing.T, watched leaseSet, inEtcd map[string]string) bool {
	t.Helper()
	if len(watched) != len(inEtcd) {
		return false
	}
	for k, l := range watched {
		v, err := l.Attrs.MarshalJSON()
		if err != nil || string(v) != inEtcd[k] {
			return false
		}
	}
	return true
}

// TestClusterLeaderKill runs Renew and several Watches through clients that
// know all three members, kills the leader, and checks that renewals go
// through after retries and that every watch sees every later change.
func TestClusterLeaderKill(t *testing.T) {
	t.Parallel()
	cl, err := etcdlocal.StartCluster(t.TempDir(), 3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	eps := cl.Endpoints()
	admin := &testEnv{client: newTestClient(t, eps...), logs: &testlog.Buffer{}}
	admin.put(t, testPrefix+"/config", netConf)
	opts := Options{TTL: 30 * time.Second, RequestTimeout: 2 * time.Second}
	reg := admin.registry(opts)
	ctx := testCtx(t)
	self, err := reg.Acquire(ctx, attrs(t, "10.0.0.1"), netip.Prefix{})
	if err != nil {
		t.Fatal(err)
	}

	watches := startWatches(t, eps, opts, admin.logs, self.Key())

	leader, err := cl.Leader(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	leader.Kill()
	t.Logf("killed leader %s", leader.Name)

	var renewed subnet.Lease
	failed := retry(t, "renew after the leader died", func() (err error) {
		renewed, err = reg.Renew(ctx, self)
		return err
	})
	t.Logf("renew failed %d times before it went through", failed)
	if !renewed.Expiration.After(self.Expiration) {
		t.Errorf("renewed expiration %v, not after %v", renewed.Expiration, self.Expiration)
	}
	var after subnet.Lease
	retry(t, "acquire after the leader died", func() (err error) {
		after, err = reg.Acquire(ctx, attrs(t, "10.0.0.2"), netip.Prefix{})
		return err
	})
	checkWatches(t, watches, "the lease written after the kill", after.Key(), etcdLeases(t, admin.client))

	// Bring the old leader back: its watches and the rest go on.
	if err := leader.Start(); err != nil {
		t.Fatal(err)
	}
	var third subnet.Lease
	retry(t, "acquire after the restart", func() (err error) {
		third, err = reg.Acquire(ctx, attrs(t, "10.0.0.3"), netip.Prefix{})
		return err
	})
	checkWatches(t, watches, "the lease written after the restart", third.Key(), etcdLeases(t, admin.client))
}

// TestClusterWatchNoLeader watches through one member, stops the other two
// so that it has no leader, and checks that the watch notices (it requires
// a leader), then recovers everything once the quorum is back.
func TestClusterWatchNoLeader(t *testing.T) {
	t.Parallel()
	cl, err := etcdlocal.StartCluster(t.TempDir(), 3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	admin := &testEnv{client: newTestClient(t, cl.Endpoints()...), logs: &testlog.Buffer{}}
	admin.put(t, testPrefix+"/config", netConf)
	opts := Options{TTL: 30 * time.Second, RequestTimeout: time.Second}
	ctx := testCtx(t)
	first, err := admin.registry(opts).Acquire(ctx, attrs(t, "10.0.0.1"), netip.Prefix{})
	if err != nil {
		t.Fatal(err)
	}
	lone := cl.Members[0]
	node := &testEnv{client: newTestClient(t, lone.Endpoint), logs: &testlog.Buffer{}}
	ch, _ := watchRun(t, node.registry(opts))
	s := leaseSet{}
	waitFor(t, ch, s, "the first lease", hasKey(first.Key()))

	for _, m := range cl.Members[1:] {
		m.Kill()
	}
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(node.logs.String(), "no leader") {
		if time.Now().After(deadline) {
			t.Fatalf("the watch on a member without leader was not interrupted; logs:\n%s", node.logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, m := range cl.Members[1:] {
		go m.Start() // each waits for the quorum; a failure shows below
	}
	var second subnet.Lease
	retry(t, "acquire with the quorum back", func() (err error) {
		second, err = admin.registry(opts).Acquire(ctx, attrs(t, "10.0.0.2"), netip.Prefix{})
		return err
	})
	waitFor(t, ch, s, "the lease written after the quorum came back", hasKey(second.Key()))
	if want := etcdLeases(t, admin.client); !sameLeases(t, s, want) {
		t.Errorf("watch holds %v, etcd %v", keys(s), want)
	}
}

// clusterWatch is one Watch running through its own client.
type clusterWatch struct {
	ch  <-chan []subnet.Event
	set leaseSet
}

// startWatches runs Watches through clients that know every endpoint, their
// lists starting at different members so that some stream is likely on the
// leader, and waits until each has seen key.
func startWatches(t *testing.T, eps []string, opts Options, logs *testlog.Buffer, key string) []clusterWatch {
	t.Helper()
	var out []clusterWatch
	for i := range 2 * len(eps) {
		rot := append(append([]string{}, eps[i%len(eps):]...), eps[:i%len(eps)]...)
		w := clusterWatch{set: leaseSet{}}
		w.ch, _ = watchRun(t, (&testEnv{client: newTestClient(t, rot...), logs: logs}).registry(opts))
		waitFor(t, w.ch, w.set, "our lease", hasKey(key))
		out = append(out, w)
	}
	return out
}

// checkWatches waits until every watch has seen key and then checks that
// each holds exactly what etcd holds.
func checkWatches(t *testing.T, watches []clusterWatch, what, key string, inEtcd map[string]string) {
	t.Helper()
	for i, w := range watches {
		waitFor(t, w.ch, w.set, fmt.Sprintf("watch %d: %s", i, what), hasKey(key))
		if !sameLeases(t, w.set, inEtcd) {
			t.Errorf("watch %d holds %v, etcd %v", i, keys(w.set), inEtcd)
		}
	}
}
