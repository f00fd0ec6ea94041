package weftd

import (
	"context"
	"log/slog"
	"runtime"
	"runtime/metrics"
	"testing"
	"time"
)

var sink [][]byte

// TestReleaseAtRest: after a burst that leaves the heap mostly free, the
// free pages go back to the OS once allocation has stopped.
func TestReleaseAtRest(t *testing.T) {
	read := func() (free, released uint64) {
		s := []metrics.Sample{{Name: "/memory/classes/heap/free:bytes"}, {Name: "/memory/classes/heap/released:bytes"}}
		metrics.Read(s)
		return s[0].Value.Uint64(), s[1].Value.Uint64()
	}
	// A burst: 32 MB live, then dropped and collected.
	for range 512 {
		sink = append(sink, make([]byte, 64<<10))
	}
	sink = nil
	runtime.GC()
	free, released := read()
	if free < 4*restFree {
		t.Fatalf("the runtime returned the burst's pages by itself (%d bytes free): the test proves nothing", free)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go releaseAtRest(ctx, 20*time.Millisecond, func() bool { return false }, nil, slog.New(slog.DiscardHandler))
	// Most of what the burst left free goes back to the OS (the rest of the
	// test process, the race detector's runtime among it, may free and
	// allocate meanwhile, so "free" itself need not drop to nothing).
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if _, r := read(); r-released >= free/2 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	f, r := read()
	t.Fatalf("after 5 s at rest %d more bytes released of the %d the burst left free (free now %d)", r-released, free, f)
}
