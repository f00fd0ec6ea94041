package etcd

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/weft-net/weft/subnet"
)

func TestWatchEvents(t *testing.T) {
	t.Parallel()
	env := newEnv(t, netConf)
	ctx := testCtx(t)
	ch, a, b := watchWithGarbage(t, env)

	steps := []struct {
		name string
		do   func()
		want []subnet.EventType
		key  string
	}{
		{"a new lease", func() {
			if _, err := env.reg.Acquire(ctx, attrs(t, "10.0.0.4"), netip.MustParsePrefix("10.244.4.0/24")); err != nil {
				t.Fatal(err)
			}
		}, []subnet.EventType{subnet.EventAdded}, "10.244.4.0-24"},
		{"a changed value", func() {
			na := attrs(t, "10.0.0.1")
			na.BackendData.VtepMAC = subnet.MAC{0x4e, 9, 9, 9, 9, 9}
			if _, err := env.reg.Acquire(ctx, na, netip.Prefix{}); err != nil {
				t.Fatal(err)
			}
		}, []subnet.EventType{subnet.EventAdded}, a.Key()},
		{"an admin deletes a lease", func() {
			if _, err := env.client.Delete(ctx, subnetsKey(b)); err != nil {
				t.Fatal(err)
			}
		}, []subnet.EventType{subnet.EventRemoved}, b.Key()},
		{"a lease overwritten with garbage", func() {
			env.put(t, testPrefix+"/subnets/10.244.4.0-24", `{"PublicIP": 7}`)
		}, []subnet.EventType{subnet.EventRemoved}, "10.244.4.0-24"},
		{"a renewal, then a new lease", func() {
			v, _, _ := env.get(t, testPrefix+"/subnets/"+a.Key())
			env.put(t, testPrefix+"/subnets/"+a.Key(), v) // the same bytes: no event
			if _, err := env.reg.Acquire(ctx, attrs(t, "10.0.0.5"), netip.MustParsePrefix("10.244.5.0/24")); err != nil {
				t.Fatal(err)
			}
		}, []subnet.EventType{subnet.EventAdded}, "10.244.5.0-24"},
		{"garbage made valid", func() {
			v, _ := json.Marshal(attrs(t, "10.0.0.3"))
			env.put(t, testPrefix+"/subnets/10.244.3.0-24", string(v))
		}, []subnet.EventType{subnet.EventAdded}, "10.244.3.0-24"},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			env.put(t, testPrefix+"/subnets/more/garbage", "x") // skipped, no batch of its own
			st.do()
			batch := nextBatch(t, ch)
			if len(batch) != len(st.want) {
				t.Fatalf("batch %v, want %v on %s", batch, st.want, st.key)
			}
			for i, ev := range batch {
				if ev.Type != st.want[i] || ev.Lease.Key() != st.key {
					t.Errorf("event %v %s, want %v %s", ev.Type, ev.Lease.Key(), st.want[i], st.key)
				}
			}
		})
	}
	if n := countLines(env.logs.String(), "/subnets/more/garbage"); n != 1 {
		t.Errorf("%d warnings about the garbage key written %d times, want it logged once", n, len(steps))
	}
	noBatch(t, ch, 200*time.Millisecond)
}

func TestWatchExpiry(t *testing.T) {
	t.Parallel()
	env := newEnv(t, netConf)
	ctx := testCtx(t)
	ch, _ := watchRun(t, env.reg)
	noBatch(t, ch, 300*time.Millisecond) // nothing yet: no empty batch
	short := env.registry(Options{TTL: time.Second})
	l, err := short.Acquire(ctx, attrs(t, "10.0.0.1"), netip.Prefix{})
	if err != nil {
		t.Fatal(err)
	}
	s := leaseSet{}
	waitFor(t, ch, s, "the new lease", hasKey(l.Key()))
	waitFor(t, ch, s, "the lease to expire", lacksKey(l.Key()))
}

func TestWatchOwnKeyDeleted(t *testing.T) {
	t.Parallel()
	env := newEnv(t, netConf)
	ctx := testCtx(t)
	a := attrs(t, "10.0.0.1")
	l, err := env.reg.Acquire(ctx, a, netip.Prefix{})
	if err != nil {
		t.Fatal(err)
	}
	ch, _ := watchRun(t, env.reg)
	s := leaseSet{}
	waitFor(t, ch, s, "our lease", hasKey(l.Key()))
	if _, err := env.client.Delete(ctx, subnetsKey(l)); err != nil {
		t.Fatal(err)
	}
	batch := nextBatch(t, ch)
	if len(batch) != 1 || batch[0].Type != subnet.EventRemoved || batch[0].Lease.Key() != l.Key() {
		t.Fatalf("after deleting our key: %v, want our lease removed", batch)
	}
	// As the daemon does: acquire again, preferring the same subnet.
	again, err := env.reg.Acquire(ctx, a, l.Subnet)
	if err != nil {
		t.Fatal(err)
	}
	if again.Subnet != l.Subnet || again.Expiration.IsZero() {
		t.Errorf("re-acquired %+v, want %s with a TTL", again, l.Subnet)
	}
	waitFor(t, ch, leaseSet{}, "our lease back", hasKey(l.Key()))
}

func TestWatchRelistAfterCompaction(t *testing.T) {
	t.Parallel()
	admin, node, proxy := newProxiedEnv(t, netConf)
	ctx := testCtx(t)
	reg := node.registry(Options{TTL: 60 * time.Second, RequestTimeout: 2 * time.Second})

	var keep, drop, change subnet.Lease
	for i, l := range []*subnet.Lease{&keep, &drop, &change} {
		var err error
		if *l, err = admin.reg.Acquire(ctx, attrs(t, fmt.Sprintf("10.0.0.%d", i+1)), netip.Prefix{}); err != nil {
			t.Fatal(err)
		}
	}
	ch, _ := watchRun(t, reg)
	s := leaseSet{}
	s.apply(t, nextBatch(t, ch))
	if len(s) != 3 {
		t.Fatalf("initial leases %v", keys(s))
	}

	proxy.Pause() // the watch breaks and cannot resume yet
	changed := attrs(t, "10.0.0.3")
	changed.BackendData.VtepMAC = subnet.MAC{0x4e, 7, 7, 7, 7, 7}
	v, _ := json.Marshal(changed)
	admin.put(t, subnetsKey(change), string(v))
	if _, err := admin.client.Delete(ctx, subnetsKey(drop)); err != nil {
		t.Fatal(err)
	}
	added, err := admin.reg.Acquire(ctx, attrs(t, "10.0.0.9"), netip.Prefix{})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := admin.client.Get(ctx, "/any")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.client.Compact(ctx, resp.Header.Revision); err != nil {
		t.Fatal(err)
	}
	proxy.Resume()

	expectEvents(t, ch, s, map[string]subnet.EventType{
		drop.Key(): subnet.EventRemoved, change.Key(): subnet.EventAdded, added.Key(): subnet.EventAdded})
	if s[change.Key()].Attrs.BackendData.VtepMAC != changed.BackendData.VtepMAC {
		t.Errorf("changed lease has MAC %v", s[change.Key()].Attrs.BackendData.VtepMAC)
	}
	if !strings.Contains(node.logs.String(), "compacted") {
		t.Errorf("the watch did not report the compaction; logs:\n%s", node.logs.String())
	}
	noBatch(t, ch, 200*time.Millisecond)
}

// expectEvents reads batches until len(want) events arrived, applies them to
// s and checks that they are exactly want (one event per key).
func expectEvents(t *testing.T, ch <-chan []subnet.Event, s leaseSet, want map[string]subnet.EventType) {
	t.Helper()
	var batch []subnet.Event
	for len(batch) < len(want) { // possibly in more than one batch
		batch = append(batch, nextBatch(t, ch)...)
	}
	got := map[string]subnet.EventType{}
	for _, ev := range batch {
		got[ev.Lease.Key()] = ev.Type
		s.apply(t, []subnet.Event{ev})
	}
	if len(got) != len(want) || len(batch) != len(want) {
		t.Fatalf("got %v, want exactly %v", batch, want)
	}
	for k, typ := range want {
		if got[k] != typ {
			t.Errorf("%s: %v, want %v", k, got[k], typ)
		}
	}
}

// watchWithGarbage writes two leases, a key that is not a lease key and a
// lease key with a bad value, starts a watch and checks its first batch and
// the warnings.
func watchWithGarbage(t *testing.T, env *testEnv) (ch <-chan []subnet.Event, a, b subnet.Lease) {
	t.Helper()
	ctx := testCtx(t)
	var err error
	if a, err = env.reg.Acquire(ctx, attrs(t, "10.0.0.1"), netip.MustParsePrefix("10.244.1.0/24")); err != nil {
		t.Fatal(err)
	}
	if b, err = env.reg.Acquire(ctx, attrs(t, "10.0.0.2"), netip.MustParsePrefix("10.244.2.0/24")); err != nil {
		t.Fatal(err)
	}
	env.put(t, testPrefix+"/subnets/garbage-key", "{}")
	env.put(t, testPrefix+"/subnets/10.244.3.0-24", "not json")

	ch, _ = watchRun(t, env.reg)
	first := nextBatch(t, ch)
	if len(first) != 2 || first[0].Lease.Key() != a.Key() || first[1].Lease.Key() != b.Key() ||
		first[0].Type != subnet.EventAdded || first[1].Type != subnet.EventAdded {
		t.Fatalf("first batch %v, want %s and %s added", first, a.Key(), b.Key())
	}
	if first[0].Lease.Attrs.PublicIP != a.Attrs.PublicIP || first[0].Lease.Revision != a.Revision {
		t.Errorf("first lease %+v, want %+v", first[0].Lease, a)
	}
	logs := env.logs.String()
	for _, key := range []string{"garbage-key", "10.244.3.0-24"} {
		if !strings.Contains(logs, "level=WARN") || !strings.Contains(logs, testPrefix+"/subnets/"+key) {
			t.Errorf("no warning naming %s in:\n%s", key, logs)
		}
	}
	return ch, a, b
}
