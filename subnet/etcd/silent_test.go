package etcd

import (
	"context"
	"encoding/json"
	"testing"
	"time"
)

// TestSilentConnectionRedialled: the node's connection to etcd goes silent
// (everything sent either way dropped, nobody told, as behind a firewall
// that starts dropping). The client must give it up and dial again: the
// watch then sees a lease written meanwhile, and a request that was
// waiting goes through. Without keepalive both would wait for TCP, minutes.
func TestSilentConnectionRedialled(t *testing.T) {
	t.Parallel()
	admin, node, proxy := newProxiedEnv(t, netConf)
	reg := node.registry(Options{TTL: time.Minute, RequestTimeout: time.Minute})
	first, _ := json.Marshal(attrs(t, "10.0.0.8"))
	admin.put(t, testPrefix+"/subnets/10.244.8.0-24", string(first))
	ch, _ := watchRun(t, reg)
	seen := leaseSet{}
	waitFor(t, ch, seen, "the first lease", hasKey("10.244.8.0-24")) // the watch is connected
	if _, err := reg.Config(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	proxy.Freeze()
	frozen := time.Now()
	other, _ := json.Marshal(attrs(t, "10.0.0.9"))
	admin.put(t, testPrefix+"/subnets/10.244.9.0-24", string(other))
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if _, err := reg.Config(ctx); err != nil {
		t.Fatalf("a request after the connection went silent: %v", err)
	}
	// keepAliveTime+keepAliveTimeout, then a dial: the watch follows.
	deadline := time.After(keepAliveTime + keepAliveTimeout + 15*time.Second)
	for !hasKey("10.244.9.0-24")(seen) {
		select {
		case b := <-ch:
			seen.apply(t, b)
		case <-deadline:
			t.Fatalf("the watch did not see a lease written after its connection went silent (%s ago)", time.Since(frozen))
		}
	}
	t.Logf("request and watch through a new connection %s after the old one went silent", time.Since(frozen).Round(100*time.Millisecond))
}
