// Package nettest builds test hosts inside network namespaces that it
// creates and always deletes (through internal/namespace): namespaces, veth
// pairs, an underlay switch, commands run inside a namespace. It never
// changes the root namespace. Tests only: it imports testing.
//
// A test that cannot run (not root, a missing tool) fails. Outside CI a
// user may ask for skips instead, by name: WEFT_TEST_SKIP lists what may be
// skipped ("root", "tools", or "all"), see CannotRun.
package nettest

import (
	"net"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/weft-net/weft/internal/namespace"
)

// NS is a named network namespace.
type NS = namespace.NS

// RequireRoot fails the test when not running as root, unless the user
// asked for such skips (see CannotRun).
func RequireRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		CannotRun(tb, SkipRoot, "needs root (network namespaces)")
	}
}

// Kinds of test that a user may ask to skip, in WEFT_TEST_SKIP.
const (
	SkipRoot  = "root"  // needs root
	SkipTools = "tools" // needs a tool that test/setup.sh installs
	SkipAll   = "all"   // every kind
)

// InCI reports whether the tests run under CI: CI set to a true value
// ("true", "1"), as CI systems and .ci/run set it.
func InCI() bool {
	ci, err := strconv.ParseBool(os.Getenv("CI"))
	return err == nil && ci
}

// CannotRun ends a test that cannot run here for reason. It fails the test,
// so that a run never looks like a pass for a test it did not run, unless
// the user asked for skips of this kind by name: WEFT_TEST_SKIP is a comma
// list of kinds (SkipRoot, SkipTools, SkipAll). Under CI it always fails.
func CannotRun(tb testing.TB, kind, reason string) {
	tb.Helper()
	if InCI() {
		tb.Fatalf("cannot run under CI (CI=%s): %s", os.Getenv("CI"), reason)
	}
	for _, k := range strings.Split(os.Getenv("WEFT_TEST_SKIP"), ",") {
		if k = strings.TrimSpace(k); k == kind || k == SkipAll {
			tb.Skipf("%s (skipped: WEFT_TEST_SKIP=%s)", reason, os.Getenv("WEFT_TEST_SKIP"))
		}
	}
	tb.Fatalf("cannot run: %s (set WEFT_TEST_SKIP=%s to skip such tests instead)", reason, kind)
}

// NewNS creates a namespace named NamePrefix+label+random suffix, with lo up,
// and deletes it when the test ends.
func NewNS(tb testing.TB, label string) *NS {
	tb.Helper()
	RequireRoot(tb)
	n, err := namespace.Create(label)
	if err != nil {
		tb.Fatalf("create netns: %v", err)
	}
	tb.Cleanup(func() {
		if err := n.Delete(); err != nil {
			tb.Errorf("delete netns %s: %v", n.Name, err)
		}
	})
	return n
}

// Runner runs a command inside a namespace: an *NS, or a test host that
// embeds one.
type Runner interface {
	Run(argv ...string) (string, error)
}

// MustRun runs argv inside n and returns its combined output; it fails the
// test on error.
func MustRun(tb testing.TB, n Runner, argv ...string) string {
	tb.Helper()
	out, err := n.Run(argv...)
	if err != nil {
		tb.Fatal(err)
	}
	return out
}

// Veth creates a veth pair with one end named nameA in a and the other named
// nameB in b, both up. The pair is created inside a, so the root namespace
// never holds it, and it goes away with the namespaces.
func Veth(tb testing.TB, a *NS, nameA string, b *NS, nameB string) {
	tb.Helper()
	if err := namespace.VethPair(a, nameA, b, nameB); err != nil {
		tb.Fatal(err)
	}
}

// ForwardLoopback makes target (an address on the host's loopback, for
// example a kube-apiserver on 127.0.0.1:6443) reachable from inside the
// namespace at the same address: it listens on that address in the
// namespace and relays each connection to target, dialled from the test
// process. Traffic stays on the loopback of either side. It stops when the
// test ends.
func ForwardLoopback(tb testing.TB, n interface {
	Forward(target string) (net.Listener, error)
}, target string) {
	tb.Helper()
	ln, err := n.Forward(target)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ln.Close() })
}
