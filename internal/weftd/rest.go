package weftd

import (
	"context"
	"log/slog"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// restCheck is how often weftd looks whether it is at rest.
const restCheck = 2 * time.Second

// restAllocs is the most an interval of restCheck may allocate for weftd to count
// as at rest: an idle daemon (lease renewals, watch keepalives, a metrics
// scrape) allocates far less, a sync or a burst of lease events far more.
const restAllocs = 512 << 10

// restFree is the free heap, held but not returned to the OS, above which
// weftd at rest returns it. At 5,000 peers the rest after a burst left
// 0.99 MB free (runtime/metrics, 2026-12-01), just under an earlier 1 MB
// threshold. A release costs one full GC (a few ms at 5,000 peers); at
// rest the free heap only grows when a collection frees something, so it
// fires at most once per collection (an idle daemon's are the runtime's
// forced ones, every 2 minutes).
const restFree = 256 << 10

// releaseAtRest returns the heap's free pages to the OS whenever weftd has
// come to rest after work that grew its heap. Go's scavenger keeps the heap
// near the GC goal (1.5× the live heap, see defaultGCPercent) because more
// work is likely to need it again; weftd's work comes in bursts (a start,
// a change of many leases, a resync) with long rests between, so the slack
// would otherwise stay resident through the rest. Costs one full GC per
// rest, a few milliseconds at 5,000 peers.
//
// At its first check after ready reports true (start-up is over: the
// lease is held and the first table programmed), at rest or not, it also
// calls pageOut once, if not nil, and logs what it returned: a node whose
// leases keep changing may never come to rest.
func releaseAtRest(ctx context.Context, every time.Duration, ready func() bool, pageOut func() (int, error), log *slog.Logger) {
	samples := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}, {Name: "/memory/classes/heap/free:bytes"}}
	metrics.Read(samples)
	last := samples[0].Value.Uint64()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		metrics.Read(samples)
		allocs, free := samples[0].Value.Uint64(), samples[1].Value.Uint64()
		if allocs-last < restAllocs && free > restFree {
			debug.FreeOSMemory()
		}
		last = allocs
		if pageOut != nil && ready() {
			if n, err := pageOut(); err != nil {
				log.Warn("cannot return the executable's start-up pages", "err", err)
			} else {
				log.Info("start-up over: returned the pages of the executable to the kernel", "mappedBytes", n)
			}
			pageOut = nil
		}
	}
}
