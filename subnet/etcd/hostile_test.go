package etcd

import (
	"errors"
	"net/netip"
	"sync"
	"testing"

	"github.com/weft-net/weft/subnet"
)

// hostileKeys are written by any etcd client holding the nodes' credentials:
// a route hijack, a lease outside the Network, one covering all of it, and
// keys and values that do not parse.
var hostileKeys = map[string]string{
	"0.0.0.0-1":        `{"PublicIP":"10.0.0.66","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"4e:fb:0a:00:00:42"}}`,
	"10.250.0.0-24":    `{"PublicIP":"10.0.0.67","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"4e:fb:0a:00:00:43"}}`,
	"10.1.0.0-28":      `{"PublicIP":"10.0.0.68","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"4e:fb:0a:00:00:44"}}`,
	"not-a-lease":      `{}`,
	"10.1.0.0-24-junk": `{}`,
	"::-0":             `{}`,
}

// counter counts rejections by reason.
type counter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *counter) inc(reason string) { c.mu.Lock(); c.n[reason]++; c.mu.Unlock() }
func (c *counter) get(reason string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[reason]
}

// TestHostileKeysDoNotBlockAcquire: on real etcd, keys outside the Network
// (0.0.0.0-1 covers every subnet of it) and malformed keys never make free
// subnets look taken: every subnet of the range is still handed out, and
// only then is the range exhausted. Malformed keys are counted once each.
func TestHostileKeysDoNotBlockAcquire(t *testing.T) {
	t.Parallel()
	env := newEnv(t, tinyConf)
	ctx := testCtx(t)
	for k, v := range hostileKeys {
		env.put(t, testPrefix+"/subnets/"+k, v)
	}
	c := &counter{n: map[string]int{}}
	reg := env.registry(Options{Rejections: subnet.NewRejections(nil, c.inc)})
	got := map[netip.Prefix]bool{}
	for i := range 3 {
		l, err := reg.Acquire(ctx, attrs(t, "10.0.0."+string(rune('1'+i))), netip.Prefix{})
		if err != nil {
			t.Fatalf("node %d cannot acquire beside hostile keys: %v", i+1, err)
		}
		got[l.Subnet] = true
	}
	for _, want := range []string{"10.1.0.4/30", "10.1.0.8/30", "10.1.0.12/30"} {
		if !got[netip.MustParsePrefix(want)] {
			t.Errorf("subnet %s not handed out; got %v", want, got)
		}
	}
	if _, err := reg.Acquire(ctx, attrs(t, "10.0.0.9"), netip.Prefix{}); !errors.Is(err, subnet.ErrExhausted) {
		t.Errorf("fourth node: %v, want ErrExhausted once the three real subnets are taken", err)
	}
	// "not-a-lease", "10.1.0.0-24-junk" and "::-0": three malformed keys,
	// each counted once however often the registry listed them.
	if n := c.get(subnet.RejectMalformedKey); n != 3 {
		t.Errorf("%d malformed keys counted, want 3", n)
	}
}
