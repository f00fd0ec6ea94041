package uvxlan

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/testkit/nettest"
)

// TestKeptFilesStopLosesNothing: with Config.Files, a Run that ends (the
// process stops on SIGTERM) leaves what it has not read in the kept queues
// and forwards all it read: no frame is read and then dropped because the
// TAP or the sockets were closed under the packet loops. The fast path is
// off, so that the packet loops carry the floods; each stop comes right
// after their frame counters were seen growing.
func TestKeptFilesStopLosesNothing(t *testing.T) {
	a, b, files := keptFilesPair(t, false)
	// The floods run until the test ends (killed by its cleanups); the
	// limit only bounds a test that hangs.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	for _, args := range [][]string{{"-f", b.podIP.String()}, {"-f", "-s", "1400", b.podIP.String()}} {
		p := a.pod.Command(ctx, append([]string{"ping", "-q"}, args...)...)
		if err := p.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Process.Kill(); p.Wait() })
	}
	cfg := a.b.Config()
	for i := range 10 {
		old := a.b
		time.Sleep(100 * time.Millisecond)
		tx, rx := old.ctr.tx.Load(), old.ctr.rx.Load()
		time.Sleep(100 * time.Millisecond)
		if tx2, rx2 := old.ctr.tx.Load(), old.ctr.rx.Load(); tx2 == tx || rx2 == rx {
			t.Fatalf("stop %d: the packet loops carry no floods: %d frames sent, %d received in 100 ms", i, tx2-tx, rx2-rx)
		}
		a.stop()
		st := old.Stats()
		if n := st.Drops[DropSend.String()] + st.Drops[DropTAPWrite.String()]; n != 0 {
			t.Errorf("stop %d: %d frames read and then dropped as the run ended: %v", i, n, st.Drops)
		}
		files.restart(t)
		restartNode(t, a, b, cfg)
	}
}

// idleRun is a backend's datapath opened in a test host with its packet
// loops started, as Run does, but without a reconciler: nothing repairs
// the TAP and no table is programmed. adoptedWait and stopWait are an
// hour, so that a stop that waits for either does not return within the
// test.
type idleRun struct {
	b       *Backend
	dp      *datapath
	host    *nettest.Host
	loops   *packetLoops
	stopped bool // stop was called
}

// newIdleRun starts an idleRun, whose datapath took kept files over if
// adopted; the loops are stopped at the end unless the test stopped them.
func newIdleRun(t *testing.T, adopted bool) *idleRun {
	t.Helper()
	u := nettest.NewUnderlay(t, netip.MustParsePrefix("192.168.77.0/24"), 1500)
	r := &idleRun{host: u.AddHost(t, "a", "eth0")}
	var err error
	r.b, err = New(Config{Handle: r.host.Handle, NetNS: r.host.Path, Local: r.host.Addr, Subnet: subnetA}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	r.b.adoptedWait, r.b.stopWait = time.Hour, time.Hour
	if r.dp, err = r.b.open(); err != nil {
		t.Fatal(err)
	}
	r.dp.adopted = adopted
	r.loops = r.b.startLoops(r.dp)
	t.Cleanup(func() {
		if !r.stopped {
			r.loops.stop()
		}
	})
	return r
}

// stop stops the loops as Run's end does and fails the test if that does
// not return: a stop that waits for a limit (an hour) is caught here, not
// by its time.
func (r *idleRun) stop(t *testing.T, what string) {
	t.Helper()
	r.stopped = true
	done := make(chan struct{})
	go func() { r.loops.stop(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("the packet loops' stop did not return: %s", what)
	}
}

// TestStopWakesLoopWaitingForLostTAP: an egress loop whose TAP was deleted
// waits for the reconciler to open the device again; when Run ends first,
// the stop wakes it, rather than leaving it to the closing after stopWait.
func TestStopWakesLoopWaitingForLostTAP(t *testing.T) {
	r := newIdleRun(t, false)
	nettest.MustRun(t, r.host, "ip", "link", "del", r.b.cfg.Name)
	eventually(t, "the egress loop finds its TAP gone", func() error {
		if !r.dp.tapBroken.Load() {
			return errors.New("the TAP queue is not reported lost")
		}
		return nil
	})
	r.stop(t, "the egress loop waiting for its lost TAP was not woken")
}

// TestStopBeforeLoopsStart: the packet loops of a run that took kept files
// over wait for the first table; when Run ends first (its reconciler
// failed), they return, rather than waiting for adoptedWait and then
// reading.
func TestStopBeforeLoopsStart(t *testing.T) {
	r := newIdleRun(t, true)
	// A datagram that waits in the kept receive socket: a loop that read
	// it now would drop it (no peers yet) instead of leaving it there.
	nettest.MustRun(t, r.host, "bash", "-c", fmt.Sprintf("echo waits >/dev/udp/%s/%d", r.host.Addr, r.b.cfg.Port))
	r.stop(t, "the loops waiting for the first table did not return")
	ev := r.b.Stats().Events
	if n := ev[EventUDPRecvs] + ev[EventTAPReads]; n != 0 {
		t.Errorf("the loops that had not started made %d reads (receive %d, TAP %d) before they returned; want none",
			n, ev[EventUDPRecvs], ev[EventTAPReads])
	}
}
