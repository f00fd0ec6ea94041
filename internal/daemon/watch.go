package daemon

import (
	"context"
	"errors"
	"maps"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/weft-net/weft/backend"
	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/vtep"
)

// watch follows the registry and hands every new peer table to the backend.
func (d *Daemon) watch(ctx context.Context, cfg *subnet.Config, self subnet.Lease, b backend.Backend) error {
	leaseType := subnet.LeaseBackendType(cfg.Backend.Type)
	events := make(chan []subnet.Event, 64)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return d.cfg.Registry.Watch(gctx, events) })
	g.Go(func() error {
		peers := newPeerSet(cfg, self, d.cfg.Rejections, leaseType)
		selfKey := self.Key()
		for {
			var batch []subnet.Event
			select {
			case <-gctx.Done():
				return nil
			case batch = <-events:
			}
			batch = drainBatches(events, batch)
			start := time.Now()
			var added, removed int
			for _, ev := range batch {
				if ev.Lease.Key() == selfKey && lostOwnLease(ev, self) {
					return errLeaseLost
				}
				peers.apply(ev)
				if ev.Type == subnet.EventRemoved {
					removed++
				} else {
					added++
				}
			}
			ups, rebuilt := peers.update()
			if u, ok := b.(updater); ok && !rebuilt {
				u.Update(ups)
			} else {
				b.Set(maps.Clone(peers.tab)) // the backend keeps it; peers changes its own
			}
			v4 := 0
			for p := range peers.tab {
				if p.Addr().Is4() {
					v4++
				}
			}
			d.cfg.Metrics.batch(added, removed, len(peers.leases), v4, len(peers.tab)-v4, time.Since(start))
		}
	})
	err := g.Wait()
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		return nil
	}
	return err
}

// drainBatches adds to batch the batches already waiting in events, so that
// a burst of changes (many nodes joining, a relisting) costs one table and
// one sync rather than one each. It never waits for a batch.
func drainBatches(events <-chan []subnet.Event, batch []subnet.Event) []subnet.Event {
	for {
		select {
		case more := <-events:
			batch = append(batch[:len(batch):len(batch)], more...)
		default:
			return batch
		}
	}
}

// updater is a backend that keeps the peer table it was last Set and takes
// changes to it row by row (the vxlan backend): a change among thousands of
// peers then costs neither a copy of the table nor a comparison of two.
type updater interface {
	Update(ups []vtep.Update)
}

// lostOwnLease reports whether an event on our own key means the lease is
// no longer ours: deleted, or rewritten with another node's address.
func lostOwnLease(ev subnet.Event, self subnet.Lease) bool {
	if ev.Type == subnet.EventRemoved {
		return true
	}
	a, s := ev.Lease.Attrs, self.Attrs
	return a.PublicIP != s.PublicIP || a.PublicIPv6 != s.PublicIPv6
}
