package daemon

import (
	"os"
	"runtime/debug"
)

// defaultGCPercent is weftd's garbage collection target (GOGC) unless the
// environment sets GOGC. weftd's live heap is small (a few MB at 5,000
// peers) but a full sync reads every route, neighbour and FDB entry back
// from the kernel, a burst of short-lived garbage several times the live
// heap; with Go's default of 100 the heap then grows to twice the live
// heap and stays resident. At 50 it collects sooner, for a little more CPU
// per change (bench/peers measures both).
const defaultGCPercent = 50

// tuneGC applies defaultGCPercent unless GOGC is set.
func tuneGC() {
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(defaultGCPercent)
	}
}
