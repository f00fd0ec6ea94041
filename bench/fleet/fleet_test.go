package fleet

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"

	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/subnet/etcd"
	"github.com/weft-net/weft/vtep"
)

const (
	prefix = "/coreos.com/network"
	config = `{"Network":"10.0.0.0/8","SubnetLen":24,"Backend":{"Type":"vxlan"}}`
)

// probe is one lease change the fleet waits for: every node's watch must
// report an event of typ for sn.
type probe struct {
	sn      netip.Prefix
	typ     subnet.EventType
	t0      time.Time
	lat     []time.Duration // by node
	pending atomic.Int32
	done    chan struct{}
}

// fleet is n nodes, each with its own etcd client, registry, lease and
// watch, as n weftd daemons would have.
type fleet struct {
	nodes   []*node
	cur     atomic.Pointer[probe]
	started sync.WaitGroup // the initial batch of every watch arrived
}

type node struct {
	i      int
	client *clientv3.Client
	reg    *etcd.Registry
	lease  subnet.Lease
}

func attrs(i int) subnet.LeaseAttrs {
	pub := netip.AddrFrom4([4]byte{100, 64 + byte(i>>16), byte(i >> 8), byte(i)})
	return subnet.LeaseAttrs{PublicIP: pub, BackendType: "vxlan",
		BackendData: &subnet.VXLANData{VNI: 1, VtepMAC: vtep.DeviceMAC(pub, 1)}}
}

func newRegistry(endpoints []string) (*clientv3.Client, *etcd.Registry, error) {
	c, err := etcd.NewClient(etcd.ClientConfig{Endpoints: endpoints})
	if err != nil {
		return nil, nil, err
	}
	return c, etcd.New(c, etcd.Options{Prefix: prefix, TTL: 24 * time.Hour}, slog.New(slog.DiscardHandler)), nil
}

// startFleet brings up n nodes, 32 at a time: each acquires a lease and
// starts its watch; it returns when every watch has sent its first batch.
func startFleet(ctx context.Context, tb testing.TB, endpoints []string, n int) *fleet {
	f := &fleet{nodes: make([]*node, n)}
	f.started.Add(n)
	var g errgroup.Group
	g.SetLimit(32)
	for i := range n {
		g.Go(func() error {
			c, reg, err := newRegistry(endpoints)
			if err != nil {
				return err
			}
			tb.Cleanup(func() { c.Close() })
			l, err := reg.Acquire(ctx, attrs(i+1), netip.Prefix{})
			if err != nil {
				return fmt.Errorf("node %d: acquire: %w", i, err)
			}
			nd := &node{i: i, client: c, reg: reg, lease: l}
			f.nodes[i] = nd
			events := make(chan []subnet.Event, 16)
			go reg.Watch(ctx, events) //nolint:errcheck // ends with ctx
			go f.consume(ctx, nd, events)
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		tb.Fatal(err)
	}
	f.started.Wait()
	return f
}

// consume reads one node's events and reports those of the current probe.
func (f *fleet) consume(ctx context.Context, nd *node, events <-chan []subnet.Event) {
	first := true
	for {
		select {
		case <-ctx.Done():
			return
		case batch := <-events:
			if first {
				first = false
				f.started.Done()
			}
			p := f.cur.Load()
			if p == nil {
				continue
			}
			for _, e := range batch {
				if e.Type == p.typ && e.Lease.Subnet == p.sn {
					p.lat[nd.i] = time.Since(p.t0)
					if p.pending.Add(-1) == 0 {
						close(p.done)
					}
				}
			}
		}
	}
}

// run makes one change with do and waits until every node has seen it.
func (f *fleet) run(tb testing.TB, sn netip.Prefix, typ subnet.EventType, do func() error) *probe {
	p := &probe{sn: sn, typ: typ, lat: make([]time.Duration, len(f.nodes)), done: make(chan struct{})}
	p.pending.Store(int32(len(f.nodes)))
	f.cur.Store(p)
	p.t0 = time.Now()
	if err := do(); err != nil {
		tb.Fatal(err)
	}
	select {
	case <-p.done:
	case <-time.After(2 * time.Minute):
		tb.Fatalf("%v of %s: %d of %d nodes never saw it", typ, sn, p.pending.Load(), len(f.nodes))
	}
	f.cur.Store(nil)
	return p
}

// addRemove adds a lease through a new node's registry (Acquire), waits
// until every node saw it, then deletes its key (as an expiry does) and
// waits again. It returns both probes.
func (f *fleet) addRemove(ctx context.Context, tb testing.TB, endpoints []string, id int) (add, del *probe) {
	c, reg, err := newRegistry(endpoints)
	if err != nil {
		tb.Fatal(err)
	}
	defer c.Close()
	if _, err := reg.Config(ctx); err != nil { // connect before the clock starts
		tb.Fatal(err)
	}
	var l subnet.Lease
	// Acquire takes a free hint (as a restarted weftd's subnet file gives
	// it), so the probe knows the subnet before the clock starts.
	sn := f.nextFree(ctx, tb, c)
	add = f.run(tb, sn, subnet.EventAdded, func() error {
		var err error
		l, err = reg.Acquire(ctx, attrs(id), sn)
		return err
	})
	if l.Subnet != sn {
		tb.Fatalf("acquire took %s, not the free hint %s", l.Subnet, sn)
	}
	del = f.run(tb, sn, subnet.EventRemoved, func() error {
		_, err := c.Delete(ctx, prefix+"/subnets/"+subnet.MakeKey(l.Subnet, l.IPv6Subnet))
		return err
	})
	return add, del
}

// nextFree is the lowest /24 of 10.0.0.0/8 that no lease holds.
func (f *fleet) nextFree(ctx context.Context, tb testing.TB, c *clientv3.Client) netip.Prefix {
	resp, err := c.Get(ctx, prefix+"/subnets/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		tb.Fatal(err)
	}
	taken := map[netip.Prefix]bool{}
	for _, kv := range resp.Kvs {
		sn, _, err := subnet.ParseKey(strings.TrimPrefix(string(kv.Key), prefix+"/subnets/"))
		if err == nil {
			taken[sn] = true
		}
	}
	for i := 1; i < 1<<16; i++ {
		sn := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 0}), 24)
		if !taken[sn] {
			return sn
		}
	}
	tb.Fatal("no free subnet")
	return netip.Prefix{}
}
