package flow_test

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/mdlayher/netlink"
	"github.com/ti-mo/conntrack"
	"golang.org/x/sys/unix"

	"github.com/weft-net/weft/flow"
	"github.com/weft-net/weft/internal/testkit/nettest"
)

// TestConntrackRate sends 3,000 new UDP flows (one socket, a destination
// port each) from one pod to another through a node whose conntrack
// reader takes 100 events a second. The reader must hand on at most 100
// for each second the flood and the reading spanned, count its pauses,
// read again after them, and still get the close of a flow opened while
// it paused (the kernel keeps events for connections opened while someone
// listens). The socket overflows meanwhile: the reader counts it and
// reads on.
func TestConntrackRate(t *testing.T) {
	node, p1, _ := nettest.RoutedPods(t, "ctr", [2]netip.Prefix{netip.MustParsePrefix("10.8.1.0/24"), netip.MustParsePrefix("10.8.2.0/24")})
	nettest.TrackConnections(t, node)
	fd, err := unix.Open(node.Path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	const rate = 100
	// A small buffer, so that what waits after the flood is read within
	// the test's patience.
	ct := &flow.Conntrack{NetNS: fd, Pods: []netip.Prefix{netip.MustParsePrefix("10.8.0.0/16")}, Rate: rate, ReadBuffer: 64 << 10}
	var mu sync.Mutex
	var got []flow.Flow
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(got) }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- ct.Run(ctx, func(f flow.Flow) { mu.Lock(); got = append(got, f); mu.Unlock() })
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
	seen := func(port uint16, event string, within time.Duration) bool {
		for t0 := time.Now(); time.Since(t0) < within; time.Sleep(10 * time.Millisecond) {
			mu.Lock()
			for _, f := range got {
				if f.DstPort == port && f.Event == event {
					mu.Unlock()
					return true
				}
			}
			mu.Unlock()
		}
		return false
	}
	// Reading: a flow shows (each try a port of its own, a new flow).
	probe := func(first uint16, within time.Duration) {
		t.Helper()
		for port, t0 := first, time.Now(); ; port++ {
			if time.Since(t0) > within {
				t.Fatalf("no conntrack event read within %s", within)
			}
			if send(port); seen(port, flow.EventNew, 200*time.Millisecond) {
				return
			}
		}
	}
	probe(1, 10*time.Second)
	time.Sleep(1100 * time.Millisecond) // a second of its own for the flood
	before := count()
	start := time.Now()
	const n = 3000
	for i := range n {
		send(10000 + uint16(i))
	}
	time.Sleep(300 * time.Millisecond)
	elapsed := time.Since(start)
	read := count() - before
	bound := rate * (int(elapsed/time.Second) + 2)
	pauses, paused := ct.Paused()
	t.Logf("%d new flows in %s: %d read, %d pauses of %s in all, %d overflows", n, elapsed, read, pauses, paused, ct.Lost())
	if read > bound {
		t.Errorf("%d events read in %s at %d a second; want at most %d", read, elapsed, rate, bound)
	}
	if pauses == 0 || paused == 0 {
		t.Errorf("no pause counted: %d, %s", pauses, paused)
	}
	// The 64 KiB buffer cannot hold what comes during the pause: the
	// kernel says so, and the reader reads on (the probe below).
	if ct.Lost() == 0 {
		t.Error("no overflow counted")
	}
	// After the pause it reads again: what waited in the buffer, then new
	// flows.
	probe(50000, 15*time.Second)
	// The last flow of the flood was opened while the reader paused: its
	// close comes when its entry goes.
	last := uint16(10000 + n - 1)
	cc, err := conntrack.Dial(&netlink.Config{NetNS: fd})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	srcPort := uint16(c.LocalAddr().(*net.UDPAddr).Port)
	if err := cc.Delete(conntrack.Flow{TupleOrig: conntrack.Tuple{
		IP:    conntrack.IPTuple{SourceAddress: src, DestinationAddress: dst},
		Proto: conntrack.ProtoTuple{Protocol: unix.IPPROTO_UDP, SourcePort: srcPort, DestinationPort: last}}}); err != nil {
		t.Fatalf("delete the entry of UDP %d: %v", last, err)
	}
	if !seen(last, flow.EventClose, 5*time.Second) {
		t.Errorf("no close of UDP %d, opened while the reader paused", last)
	}
}
