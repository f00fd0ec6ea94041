package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/weft-net/weft/internal/etcdlocal"
	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/subnet/etcd"
)

// TestWatchCompaction: N times, a node's watch is cut off, leases are added,
// changed and deleted behind its back, and etcd compacts past the watch's
// revision; then the node reconnects. Goal: after each round the node's view
// equals etcd's, with no missed and no phantom lease.
func TestWatchCompaction(t *testing.T) {
	rounds := scale(10, 100)
	dir := t.TempDir()
	srv, err := etcdlocal.Start(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	proxy, err := etcdlocal.NewProxy(dir, srv.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	admin := newClient(t, srv.Endpoint)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	prefix := etcd.DefaultPrefix + "/subnets/"
	if _, err := admin.Put(ctx, etcd.DefaultPrefix+"/config", `{"Network":"10.0.0.0/8"}`); err != nil {
		t.Fatal(err)
	}
	reg := etcd.New(newClient(t, proxy.Endpoint), etcd.Options{RequestTimeout: 2 * time.Second}, nil)
	ch := make(chan []subnet.Event, 1024)
	go reg.Watch(ctx, ch)
	view := map[string]string{} // key → public IP, as the node sees it
	r := rand.New(rand.NewPCG(14, 100))
	missed, phantom := 0, 0
	for round := range rounds {
		proxy.Pause()
		for range 1 + r.IntN(5) {
			i := r.IntN(40)
			key := prefix + netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i), 0, 0}), 24).Masked().Addr().String() + "-24"
			if r.IntN(3) == 0 {
				admin.Delete(ctx, key)
				continue
			}
			v, _ := json.Marshal(nodeAttrs(round*40 + i))
			admin.Put(ctx, key, string(v))
		}
		// A write of its own, so the compaction always moves past the
		// revision the node's watch was at.
		resp, err := admin.Put(ctx, "/faults/tick", fmt.Sprint(round))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := admin.Compact(ctx, resp.Header.Revision); err != nil {
			t.Fatal(err)
		}
		proxy.Resume()
		want := etcdView(ctx, t, admin, prefix)
		deadline := time.After(15 * time.Second)
	converge:
		for !equalViews(view, want) {
			select {
			case batch := <-ch:
				for _, ev := range batch {
					if ev.Type == subnet.EventRemoved {
						delete(view, ev.Lease.Key())
					} else {
						view[ev.Lease.Key()] = ev.Lease.Attrs.PublicIP.String()
					}
				}
			case <-deadline:
				break converge
			}
		}
		for k, v := range want {
			if view[k] != v {
				missed++
			}
		}
		for k := range view {
			if _, ok := want[k]; !ok {
				phantom++
			}
		}
	}
	record(t, row{fmt.Sprintf("watch cut off and etcd compacted past its revision ×%d while leases are added, changed and deleted", rounds),
		"missed changes; phantom leases (node's view vs etcd after each round)",
		fmt.Sprintf("%d; %d", missed, phantom), "0; 0", missed == 0 && phantom == 0, ""})
}

func etcdView(ctx context.Context, t *testing.T, c *clientv3.Client, prefix string) map[string]string {
	t.Helper()
	resp, err := c.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, kv := range resp.Kvs {
		var a subnet.LeaseAttrs
		if json.Unmarshal(kv.Value, &a) == nil {
			out[string(kv.Key[len(prefix):])] = a.PublicIP.String()
		}
	}
	return out
}

func equalViews(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
