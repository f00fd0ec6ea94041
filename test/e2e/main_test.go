package e2e

import (
	"fmt"
	"os"
	"runtime"
	"testing"
)

// startNetns is the network namespace the test binary started in, read
// before any test runs. /proc/self/ns/net cannot stand for it later: it
// names the main thread's namespace, and a goroutine that creates a
// namespace exits locked to its thread on purpose; when that thread is the
// main one, Go parks it for good in the namespace it created.
var startNetns string

// TestMain records startNetns and, when WEFT_FAILURES_REPORT names a file,
// writes docs/flannel-failures.md there from the figures of this run.
func TestMain(m *testing.M) {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		var err error
		startNetns, err = os.Readlink("/proc/thread-self/ns/net")
		done <- err
	}()
	if err := <-done; err != nil {
		fmt.Fprintln(os.Stderr, "e2e: read the start network namespace:", err)
		os.Exit(1)
	}
	code := m.Run()
	if path := os.Getenv("WEFT_FAILURES_REPORT"); path != "" && code == 0 {
		if err := writeFailuresReport(path); err != nil {
			fmt.Fprintln(os.Stderr, "e2e:", err)
			code = 1
		}
	}
	os.Exit(code)
}
