package flow_test

import (
	"context"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weft-net/weft/flow"
	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/policy"
)

// TestConntrackRate sends 3,000 new UDP flows (one socket, a destination
// port each) from one pod to another through a node whose conntrack
// reader takes 100 events a second. The reader must hand on at most 100
// for each second the flood and the reading spanned, count its pauses,
// and listen again after them: a flow sent a second later shows.
func TestConntrackRate(t *testing.T) {
	node, p1, _ := nettest.RoutedPods(t, "ctr", [2]netip.Prefix{netip.MustParsePrefix("10.8.1.0/24"), netip.MustParsePrefix("10.8.2.0/24")})
	// A ct rule makes the kernel track the node's connections.
	if err := policy.Program(node.Path, policy.Plan{LogGroup: 13}); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(node.Path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	const rate = 100
	ct := &flow.Conntrack{NetNS: fd, Pods: []netip.Prefix{netip.MustParsePrefix("10.8.0.0/16")}, Rate: rate}
	var got atomic.Int64
	var last atomic.Value
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- ct.Run(ctx, func(f flow.Flow) { got.Add(1); last.Store(f) })
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	src, dst := netip.MustParseAddr("10.8.1.2"), netip.MustParseAddr("10.8.2.2")
	var c *net.UDPConn
	if err := p1.Do(func() (err error) {
		c, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0)))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	send := func(port uint16) {
		if _, err := c.WriteToUDPAddrPort([]byte("x"), netip.AddrPortFrom(dst, port)); err != nil {
			t.Fatal(err)
		}
	}
	seen := func(port uint16, within time.Duration) bool {
		for t0 := time.Now(); time.Since(t0) < within; time.Sleep(10 * time.Millisecond) {
			if f, ok := last.Load().(flow.Flow); ok && f.DstPort == port && f.Event == flow.EventNew {
				return true
			}
		}
		return false
	}
	// Listening: one flow shows (each try a port of its own, a new flow).
	for port := uint16(1); ; port++ {
		if port > 50 {
			t.Fatal("no conntrack event read")
		}
		if send(port); seen(port, 200*time.Millisecond) {
			break
		}
	}
	time.Sleep(1100 * time.Millisecond) // a second of its own for the flood
	before := got.Load()
	start := time.Now()
	const n = 3000
	for i := range n {
		send(10000 + uint16(i))
	}
	time.Sleep(300 * time.Millisecond)
	elapsed := time.Since(start)
	read := got.Load() - before
	bound := int64(rate) * (int64(elapsed/time.Second) + 2)
	pauses, paused := ct.Paused()
	t.Logf("%d new flows in %s: %d read, %d pauses of %s in all", n, elapsed, read, pauses, paused)
	if read > bound {
		t.Errorf("%d events read in %s at %d a second; want at most %d", read, elapsed, rate, bound)
	}
	if pauses == 0 || paused == 0 {
		t.Errorf("no pause counted: %d, %s", pauses, paused)
	}
	time.Sleep(time.Second) // the pause is over
	if send(50000); !seen(50000, 2*time.Second) {
		t.Error("no flow read after the pause: the reader did not listen again")
	}
}
