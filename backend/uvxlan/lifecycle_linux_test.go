package uvxlan

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/testkit/nettest"
)

// eventually retries f until it succeeds or 10 s have passed.
func eventually(t *testing.T, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestRepairsDrift breaks the node's kernel state, and its receive
// socket, while a pod pings a remote pod every 10 ms: each break must be
// repaired within 2 s, counted under its kind, and cost at most the pings
// that fell into the window between the break and the repair.
func TestRepairsDrift(t *testing.T) {
	u := nettest.NewUnderlay(t, netip.MustParsePrefix("192.168.77.0/24"), 1500)
	a := newUVNode(t, u, "a", subnetA, false)
	b := newUVNode(t, u, "b", subnetB, false)
	// The periodic full sync is far away: repairs must come from the
	// kernel's notifications (or the packet loops), not from the timer.
	a.stop()
	cfg := a.b.Config()
	cfg.Reconcile = time.Hour
	var err error
	if a.b, err = New(cfg, testLogger(t).With("node", "a")); err != nil {
		t.Fatal(err)
	}
	a.stop = start(t, a.b, "a")
	t.Cleanup(a.stop)
	connect(t, a, b)
	closeSocket := func() {
		a.b.dp.Load().rxs[0].Load().conn.Close()
	}
	for _, tc := range []struct {
		name   string
		kind   string
		break_ func()
	}{
		{"route deleted", "route", func() { nettest.MustRun(t, a.host, "ip", "route", "del", b.subnet.String()) }},
		{"neighbour deleted", "neigh", func() {
			nettest.MustRun(t, a.host, "ip", "neigh", "del", subnetAddr(b.subnet).String(), "dev", "weft-u.1")
		}},
		{"address deleted", "address", func() { nettest.MustRun(t, a.host, "ip", "addr", "flush", "dev", "weft-u.1") }},
		{"device down", "link", func() { nettest.MustRun(t, a.host, "ip", "link", "set", "weft-u.1", "down") }},
		{"device deleted", "device", func() { nettest.MustRun(t, a.host, "ip", "link", "del", "weft-u.1") }},
		{"receive socket failed", "socket", closeSocket},
	} {
		t.Run(tc.name, func(t *testing.T) {
			repairDuringPing(t, a, b, tc.kind, tc.break_)
		})
	}
	if l, err := a.host.Handle.LinkByName("weft-u.1"); err != nil || l.Attrs().HardwareAddr.String() != a.mac.String() {
		t.Errorf("device after the repairs: %v, %v; want mac %s", l, err, a.mac)
	}
}

// repairDuringPing runs break_ while the pod of a pings the pod of b every
// 10 ms, and checks the repair of kind: within 2 s, counted once or more,
// and no more pings lost than the break-to-repair window holds (plus two
// for the ping in flight at each end of it).
func repairDuringPing(t *testing.T, a, b *testNode, kind string, break_ func()) {
	t.Helper()
	before := a.b.Stats().Repairs[kind]
	const count, interval = 250, 10 * time.Millisecond
	type result struct {
		out string
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := a.pod.Run("ping", "-n", "-q", "-i", "0.01", "-c", fmt.Sprint(count), "-W", "1", b.podIP.String())
		done <- result{out, err}
	}()
	time.Sleep(500 * time.Millisecond) // let the pings flow before the break
	broke := time.Now()
	break_()
	var window time.Duration
	for a.b.Stats().Repairs[kind] == before {
		window = time.Since(broke)
		if window > 2*time.Second {
			t.Fatalf("no %s repair within 2 s (repairs %v)", kind, a.b.Stats().Repairs)
		}
		time.Sleep(time.Millisecond)
	}
	window = time.Since(broke)
	r := <-done
	var sent, got int
	if _, err := fmt.Sscanf(r.out[strings.Index(r.out, "---"):], "--- %s ping statistics ---\n%d packets transmitted, %d received",
		new(string), &sent, &got); err != nil {
		t.Fatalf("ping output: %v\n%s", err, r.out)
	}
	lost, allowed := sent-got, int(window/interval)+2
	t.Logf("%s repaired in %v; %d of %d pings lost (allowed %d)", kind, window.Round(time.Millisecond), lost, sent, allowed)
	if lost > allowed {
		t.Errorf("%d pings lost across a %v repair window, want at most %d", lost, window, allowed)
	}
	if out, err := ping(a, b.podIP, "-c", "1"); err != nil {
		t.Errorf("ping after the repair: %v\n%s", err, out)
	}
}

// TestRestartAndRemove checks that the device and its routes outlive Run,
// that a new backend re-attaches to them, and that RemoveDevice deletes them.
func TestRestartAndRemove(t *testing.T) {
	u := nettest.NewUnderlay(t, netip.MustParsePrefix("192.168.77.0/24"), 1500)
	a := newUVNode(t, u, "a", subnetA, false)
	b := newUVNode(t, u, "b", subnetB, false)
	connect(t, a, b)
	a.stop()
	routes := nettest.MustRun(t, a.host, "ip", "route", "show", "dev", "weft-u.1")
	if !strings.Contains(routes, b.subnet.String()) {
		t.Fatalf("route gone after Run returned:\n%s", routes)
	}

	restarted, err := New(a.b.Config(), testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	stop := start(t, restarted, "a again")
	a.b = restarted
	connect(t, a, b)
	if out, err := ping(a, b.podIP); err != nil {
		t.Fatalf("ping after restart: %v\n%s", err, out)
	}
	stop()

	for _, tc := range []struct {
		name    string
		dev     string
		wantErr bool
		gone    bool
	}{
		{"tap", "weft-u.1", false, true},
		{"already gone", "weft-u.1", false, true},
		{"not a tap", "eth0", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := RemoveDeviceNamed(a.host.Handle, tc.dev)
			if (err != nil) != tc.wantErr {
				t.Fatalf("remove %s: %v", tc.dev, err)
			}
			_, err = a.host.Handle.LinkByName(tc.dev)
			if gone := err != nil; gone != tc.gone {
				t.Fatalf("%s gone: %v, want %v", tc.dev, gone, tc.gone)
			}
		})
	}
	if err := RemoveDevice(a.host.Handle, 1); err != nil {
		t.Fatal(err)
	}
}

// TestStopUnderLoad stops both nodes while UDP floods from each pod to the
// other keep their TAP queues and receive sockets full: Run must return
// (the packet loops must notice the closed files between batches), and
// the floods must have gone through the dataplane first.
func TestStopUnderLoad(t *testing.T) {
	u := nettest.NewUnderlay(t, netip.MustParsePrefix("192.168.77.0/24"), 1500)
	a := newUVNode(t, u, "a", subnetA, false)
	b := newUVNode(t, u, "b", subnetB, false)
	connect(t, a, b)
	stopFlood := make(chan struct{})
	var floods sync.WaitGroup
	for _, d := range [][2]*testNode{{a, b}, {b, a}} {
		for range 3 {
			var c *net.UDPConn
			if err := d[0].pod.Do(func() (err error) {
				c, err = net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(d[1].podIP, 9)))
				return err
			}); err != nil {
				t.Fatal(err)
			}
			floods.Go(func() {
				defer c.Close()
				buf := make([]byte, 1400)
				for {
					select {
					case <-stopFlood:
						return
					default:
					}
					c.Write(buf) // errors (ICMP port unreachable) do not matter
				}
			})
		}
	}
	defer func() {
		close(stopFlood)
		floods.Wait()
	}()
	for _, n := range []*testNode{a, b} {
		eventually(t, "the floods go through", func() error {
			if st := n.b.Stats(); st.TxFrames < 1000 || st.RxFrames < 1000 {
				return fmt.Errorf("%d frames sent, %d received", st.TxFrames, st.RxFrames)
			}
			return nil
		})
	}
	stopped := make(chan struct{})
	go func() {
		b.stop()
		a.stop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		// The cleanup would wait for the same Run: crash with every
		// goroutine's stack instead.
		panic("Run did not return within 10 s of its context's end while traffic flowed")
	}
}
