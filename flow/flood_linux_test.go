package flow_test

import (
	"context"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weft-net/weft/flow"
	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/policy"
)

// TestDropFloodIsRateLimited sends a flood of UDP packets from one pod to
// a pod isolated for ingress, through a test node namespace. The table
// drops every one (its counter says so), but logs only what its limit
// lets through: at most LogBurst plus LogRate a second of the time the
// flood and the reading took, so weftd's reader never sees the flood.
func TestDropFloodIsRateLimited(t *testing.T) {
	node, p1, _ := nettest.RoutedPods(t, "fld", [2]netip.Prefix{netip.MustParsePrefix("10.8.1.0/24"), netip.MustParsePrefix("10.8.2.0/24")})
	dst := netip.MustParseAddr("10.8.2.2")
	if err := policy.Program(node.Path, policy.Plan{IngressIsolated: []netip.Addr{dst},
		IngressBy: []policy.Isolation{{Policies: []string{"x/iso"}, Addrs: []netip.Addr{dst}}}, LogGroup: 11}); err != nil {
		t.Fatal(err)
	}
	var logged atomic.Int64
	readNFLog(t, node, 11, func(flow.Flow) { logged.Add(1) })
	// The reader is bound once one packet comes back.
	for logged.Load() == 0 {
		nettest.SendUDP(t, p1, netip.MustParseAddr("10.8.1.2"), netip.AddrPortFrom(dst, 7), []byte("x"))
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(time.Second) // the limit's bucket fills again
	before := logged.Load()
	start := time.Now()
	const n = 20000
	payloads := make([][]byte, n)
	for i := range payloads {
		payloads[i] = []byte("flood")
	}
	nettest.SendUDP(t, p1, netip.MustParseAddr("10.8.1.2"), netip.AddrPortFrom(dst, 9), payloads...)
	time.Sleep(200 * time.Millisecond) // what was logged is read
	elapsed := time.Since(start)
	got := logged.Load() - before
	bound := int64(policy.LogBurst) + int64(elapsed.Seconds()*policy.LogRate) + 1
	if got == 0 || got > bound {
		t.Errorf("%d drops logged out of %d sent in %s; want 1 to %d", got, n, elapsed, bound)
	}
	out := nettest.MustRun(t, node, "nft", "list", "chain", "inet", policy.Table, "ingress")
	dropped := counted(out)
	if dropped < n {
		t.Errorf("the drop rule counted %d packets, want at least %d:\n%s", dropped, n, out)
	}
	t.Logf("flood of %d packets in %s: %d dropped, %d logged (bound %d)", n, elapsed, dropped, got, bound)
}

// readNFLog reads the flows NFLOG group logs in the namespace n, handing
// each to fn, until the test ends; the reader's error fails the test.
func readNFLog(t *testing.T, n *nettest.NS, group uint16, fn func(flow.Flow)) {
	t.Helper()
	fd, err := unix.Open(n.Path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- (&flow.NFLog{Group: group, NetNS: fd}).Run(ctx, fn) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
		unix.Close(fd)
	})
}

// counted reads "counter packets N" from the drop rule.
func counted(out string) int64 {
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		for i := range f {
			if f[i] == "counter" && i+2 < len(f) && f[i+1] == "packets" {
				n, _ := strconv.ParseInt(f[i+2], 10, 64)
				return n
			}
		}
	}
	return -1
}
