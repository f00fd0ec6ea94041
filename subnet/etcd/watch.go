package etcd

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"sort"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/weft-net/weft/subnet"
)

// Delays between attempts to list again after a watch broke. The first
// retry is quick (a compaction needs no wait); repeated failures back off.
const (
	relistMinDelay = 50 * time.Millisecond
	relistMaxDelay = 5 * time.Second
)

// Watch sends the current leases as one batch of EventAdded, then a batch
// per etcd watch response; see subnet.Registry. The watch requires the etcd
// member to have a leader, so a partitioned member breaks it. Whenever it
// breaks (compaction, no leader, closed channel) Watch lists again and sends
// only the difference from what it sent before. A value rewritten with the
// same bytes (a renewal) is no event. Events carry Revision but no
// Expiration (finding it would cost one request per lease); a removed
// lease's event carries its subnets but not its last value. Keys that are
// not lease keys and values that do not parse are logged and skipped; a
// lease overwritten by a value that does not parse is reported removed.
// The first listing is the one the last Acquire made, if it is at most
// listingMaxAge old and nothing was written to etcd since: a node starting
// up then lists its thousands of leases once, not twice.
func (r *Registry) Watch(ctx context.Context, events chan<- []subnet.Event) error {
	if r.err != nil {
		return r.err
	}
	if events == nil {
		return errors.New("watch subnet leases: nil event channel")
	}
	w := &watcher{r: r, events: events, known: map[string]uint64{}, seed: maphash.MakeSeed(), first: true}
	delay := relistMinDelay
	for {
		rev, err := w.resync(ctx)
		progressed := false
		if err == nil {
			progressed, err = w.follow(ctx, rev+1)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if progressed {
			delay = relistMinDelay
		}
		r.log.Warn("watch of the subnet leases interrupted, listing them again", "err", err, "retryIn", delay)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
		delay = min(2*delay, relistMaxDelay)
	}
}

// watcher holds what one Watch call has sent so far.
type watcher struct {
	r      *Registry
	events chan<- []subnet.Event
	// known holds a hash of the value of each lease sent, by key name
	// (only leases whose value parses). The subnets are in the name and the
	// daemon keeps the leases themselves: the watcher needs only to tell a
	// renewal, which rewrites the same bytes, from a change.
	known map[string]uint64
	seed  maphash.Seed
	first bool // the first listing may be the one Acquire made
}

func (w *watcher) send(ctx context.Context, batch []subnet.Event) error {
	if len(batch) == 0 {
		return nil
	}
	select {
	case w.events <- batch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// resync lists the leases, sends the difference from what was sent before
// and returns the listing's revision.
func (w *watcher) resync(ctx context.Context) (int64, error) {
	list := w.r.list
	if w.first {
		w.first, list = false, w.r.listOnce
	}
	entries, rev, err := list(ctx)
	if err != nil {
		return 0, err
	}
	next := make(map[string]uint64, len(entries))
	var batch []subnet.Event
	for _, e := range entries {
		if e.bad != nil {
			continue
		}
		h := maphash.Bytes(w.seed, e.value)
		next[e.name] = h
		if old, ok := w.known[e.name]; !ok || old != h {
			batch = append(batch, subnet.Event{Type: subnet.EventAdded, Lease: e.lease})
		}
	}
	var gone []string
	for name := range w.known {
		if _, ok := next[name]; !ok {
			gone = append(gone, name)
		}
	}
	sort.Strings(gone)
	for _, name := range gone {
		batch = append(batch, removed(name, rev))
	}
	w.known = next
	return rev, w.send(ctx, batch)
}

// follow watches from rev until the watch breaks; progressed says whether
// any events arrived.
func (w *watcher) follow(ctx context.Context, rev int64) (progressed bool, err error) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := w.r.client.Watch(wctx, w.r.subnetsDir(), clientv3.WithPrefix(), clientv3.WithRev(rev))
	for resp := range wch {
		if err := resp.Err(); err != nil {
			return progressed, fmt.Errorf("watch %s in etcd %s from revision %d: %w", w.r.subnetsDir(), w.r.endpoints(), rev, err)
		}
		if len(resp.Events) == 0 {
			continue
		}
		progressed = true
		rev = resp.Events[len(resp.Events)-1].Kv.ModRevision + 1
		if err := w.send(ctx, w.apply(resp.Events)); err != nil {
			return progressed, err
		}
	}
	return progressed, errors.New("watch channel closed")
}

// apply folds watch events into known and returns the batch to send.
func (w *watcher) apply(evs []*clientv3.Event) []subnet.Event {
	var batch []subnet.Event
	for _, ev := range evs {
		key := string(ev.Kv.Key)
		e, err := w.r.decode(ev.Kv)
		if err != nil {
			if ev.Type == mvccpb.PUT {
				w.r.rej.Reject(key, subnet.RejectMalformedKey, err)
			} else {
				w.r.rej.Forget(key)
			}
			continue
		}
		old, known := w.known[e.name]
		h := maphash.Bytes(w.seed, e.value)
		switch {
		case ev.Type == mvccpb.DELETE || e.bad != nil:
			if ev.Type == mvccpb.PUT {
				w.r.rej.Reject(key, subnet.RejectMalformedValue, e.bad)
			} else {
				w.r.rej.Forget(key)
			}
			if known {
				delete(w.known, e.name)
				batch = append(batch, removed(e.name, ev.Kv.ModRevision))
			}
		case known && old == h:
			// a renewal: nothing to tell, nothing to keep
		default:
			w.r.rej.Forget(key)
			w.known[e.name] = h
			batch = append(batch, subnet.Event{Type: subnet.EventAdded, Lease: e.lease})
		}
	}
	return batch
}

// removed is the event for the lease named name, deleted (or overwritten by
// a value that does not parse) at revision rev.
func removed(name string, rev int64) subnet.Event {
	v4, v6, _ := subnet.ParseKey(name) // known holds only names that parsed
	return subnet.Event{Type: subnet.EventRemoved, Lease: subnet.Lease{Subnet: v4, IPv6Subnet: v6, Revision: rev}}
}
