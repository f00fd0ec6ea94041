package uvxlan

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weft-net/weft/flow"
	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/policy"
)

// TestFlowsVerdicts: node a runs uvxlan with the tc fast path, node b the
// kernel's VXLAN device. On each node the pod is isolated for ingress by
// the policies shop/db and shop/web, and shop/web allows TCP 8080 to it; weft's policy
// table logs its drops to NFLOG group 7, and flow.NFLog and flow.Conntrack
// read them, and conntrack's events, in the node's namespace. A connection
// from the other node's pod to port 9090 must come back as a drop naming
// both policies and the ingress direction; one to 8080 as a new flow and, once
// closed, with the bytes sent. On a, every frame of those connections must
// have gone through the fast path: it hides nothing of them from the
// forward hook where the table and conntrack see them.
func TestFlowsVerdicts(t *testing.T) {
	u := nettest.NewUnderlay(t, netip.MustParsePrefix("192.168.79.0/24"), 1500)
	a := newUVNodeWith(t, u, "fa", subnetA, func(c *Config) { c.FastPath = true })
	b := newKernelNode(t, u, "fb", subnetB)
	connect(t, a, b)
	for _, d := range []struct {
		name     string
		from, to *testNode
	}{{"to-uvxlan-fastpath", b, a}, {"to-kernel-vxlan", a, b}} {
		t.Run(d.name, func(t *testing.T) {
			ring := watchFlows(t, d.to)
			dst := d.to.podIP
			plan := policy.Plan{
				IngressIsolated: []netip.Addr{dst},
				IngressBy:       []policy.Isolation{{Policies: []string{"shop/db", "shop/web"}, Addrs: []netip.Addr{dst}}},
				Rules: []policy.Rule{{Name: "shop/web ingress 0", Local: []netip.Addr{dst}, AnyPeer: true,
					Ports: []policy.PortEntry{{Addr: policy.Range{First: dst, Last: dst}, Proto: unix.IPPROTO_TCP, First: 8080, Last: 8080}}}},
				LogGroup: 7,
			}
			if err := policy.Program(d.to.host.Path, plan); err != nil {
				t.Fatal(err)
			}
			denied := netip.AddrPortFrom(dst, 9090)
			if err := d.from.pod.Do(func() error {
				c, err := net.DialTimeout("tcp", denied.String(), 1500*time.Millisecond)
				if err == nil {
					c.Close()
					return fmt.Errorf("connected to %s", denied)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			drop := waitFlow(t, ring, func(f flow.Flow) bool {
				return f.Event == flow.EventDrop && f.Dst == dst && f.DstPort == 9090
			})
			if drop.Verdict != flow.Dropped || drop.Direction != flow.DirIngress || !slices.Equal(drop.Policies, []string{"shop/db", "shop/web"}) ||
				drop.Src != d.from.podIP || drop.Proto != "tcp" {
				t.Errorf("drop flow %+v", drop)
			}
			const size = 1 << 20
			tr := nettest.StartTransfer(t, d.from.pod, d.to.pod, netip.AddrPortFrom(dst, 8080), size)
			if err := tr.Wait(30 * time.Second); err != nil {
				t.Fatal(err)
			}
			isAllowed := func(ev string) func(f flow.Flow) bool {
				return func(f flow.Flow) bool { return f.Event == ev && f.Dst == dst && f.DstPort == 8080 }
			}
			if f := waitFlow(t, ring, isAllowed(flow.EventNew)); f.Verdict != flow.Allowed || f.Src != d.from.podIP {
				t.Errorf("new flow %+v", f)
			}
			// The kernel destroys an expired entry when its garbage
			// collector comes by, which may be a minute; a dump evicts
			// the expired entries it meets at once.
			closed := waitFlow(t, ring, isAllowed(flow.EventClose), func() { d.to.host.Run("conntrack", "-L") })
			if closed.Counts == nil || closed.Counts.OrigBytes < size || closed.Counts.ReplyPackets == 0 {
				t.Errorf("closed flow without the transfer's counts: %+v %+v", closed, closed.Counts)
			}
		})
	}
	// The transfers to and from a went through its fast path, not
	// around it: what the flows above show, the fast path carried.
	st := a.b.Stats()
	if st.Events[EventFastRxFrames] == 0 || st.Events[EventFastTxFrames] == 0 || st.Events[EventFastErrors] != 0 {
		t.Errorf("a's fast path: %+v", st.Events)
	}
	t.Logf("a's fast path carried %d frames in, %d out (all frames: %d in, %d out)",
		st.Events[EventFastRxFrames], st.Events[EventFastTxFrames], st.RxFrames, st.TxFrames)
}

// watchFlows reads n's logged drops and conntrack events into a ring
// until the test ends. It turns on nf_conntrack_acct in n's namespace (the
// test's own), and shortens TIME_WAIT there so a closed connection's entry
// is destroyed at once.
func watchFlows(t *testing.T, n *testNode) *flow.Ring {
	t.Helper()
	nettest.MustRun(t, n.host, "sysctl", "-qw", "net.netfilter.nf_conntrack_acct=1", "net.netfilter.nf_conntrack_tcp_timeout_time_wait=1")
	fd, err := unix.Open(n.host.Path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	ring := flow.NewRing(1024, 1000, 1000)
	log := testLogger(t)
	nfl := &flow.NFLog{Group: 7, NetNS: fd, Log: log}
	ct := &flow.Conntrack{NetNS: fd, Pods: []netip.Prefix{subnetA, subnetB}, Accounting: true, Log: log}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	sink := func(f flow.Flow) { ring.Add(f) }
	for _, run := range []func(context.Context, func(flow.Flow)) error{nfl.Run, ct.Run} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := run(ctx, sink); err != nil {
				t.Errorf("flows of %s: %v", n.host.Name, err)
			}
		}()
	}
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		unix.Close(fd)
	})
	return ring
}

// waitFlow waits for a flow in ring that match selects.
// Each nudge runs between the looks.
func waitFlow(t *testing.T, ring *flow.Ring, match func(flow.Flow) bool, nudge ...func()) flow.Flow {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if fs, _ := ring.Since(0, match, 0); len(fs) > 0 {
			return fs[0]
		}
		if time.Now().After(deadline) {
			all, _ := ring.Since(0, nil, 0)
			t.Fatalf("no such flow; the ring holds %+v", all)
		}
		time.Sleep(50 * time.Millisecond)
		for _, f := range nudge {
			f()
		}
	}
}
