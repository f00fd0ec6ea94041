package etcd

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// listingMaxAge bounds how old the listing that Acquire hands to Watch may
// be. Older, Watch lists again.
const listingMaxAge = 10 * time.Second

// listing is one listing of the leases, kept by Acquire for the next
// Watch: a node acquires its lease and then starts watching, and both need
// every lease, which at thousands of leases is the bulk of the start-up
// (one range request, then decoding every value). Acquire's own write is
// folded in (wrote), and Watch uses the listing only if etcd is still at
// its revision, so the first batch is the current state, exactly as a new
// listing would give it.
type listing struct {
	mu      sync.Mutex
	entries []entry
	rev     int64
	at      time.Time
}

// keep stores a listing for the next take, replacing the one before.
func (l *listing) keep(entries []entry, rev int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.entries, l.rev, l.at = entries, rev, time.Now()
}

// wrote folds our own write of e at revision rev into the kept listing, so
// that it stays the exact state at one revision: only when the write is the
// very next revision after the listing (nobody else wrote in between);
// otherwise the listing is dropped and Watch lists again.
func (l *listing) wrote(e entry, rev int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.entries == nil {
		return
	}
	if rev != l.rev+1 {
		l.entries, l.rev = nil, 0
		return
	}
	i, found := slices.BinarySearchFunc(l.entries, e.name, func(x entry, name string) int { return strings.Compare(x.name, name) })
	if found {
		l.entries[i] = e
	} else {
		l.entries = slices.Insert(l.entries, i, e)
	}
	l.rev = rev
}

// take returns the kept listing, if it is recent, and forgets it either way
// (so it holds no memory once Watch runs).
func (l *listing) take() ([]entry, int64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	entries, rev, at := l.entries, l.rev, l.at
	l.entries, l.rev = nil, 0
	if entries == nil || time.Since(at) > listingMaxAge {
		return nil, 0, false
	}
	return entries, rev, true
}

// listOnce returns the listing Acquire kept if etcd is still at its
// revision (nothing at all was written since: one small request tells), or
// else a new one.
func (r *Registry) listOnce(ctx context.Context) ([]entry, int64, error) {
	if entries, rev, ok := r.kept.take(); ok {
		rctx, cancel := r.request(ctx)
		resp, err := r.client.Get(rctx, r.configKey(), clientv3.WithCountOnly())
		cancel()
		if err == nil && resp.Header.Revision == rev {
			return entries, rev, nil
		}
	}
	return r.list(ctx)
}
