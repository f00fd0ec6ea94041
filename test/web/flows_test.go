package web

import (
	"context"
	"errors"
	"net"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"golang.org/x/sys/unix"

	"github.com/weft-net/weft/flow"
	"github.com/weft-net/weft/internal/ops/flows"
	"github.com/weft-net/weft/internal/ops/web"
	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/policy"
)

// oneNode is a page source of one node with two pods, as the node
// namespace of TestFlowsPanel holds them; it has no paths.
type oneNode struct{}

func (oneNode) Snapshot(context.Context) (*web.Snapshot, error) {
	return &web.Snapshot{Time: time.Now(), Source: "test", Network: "10.9.0.0/16", Links: []web.Link{}, Rejected: []web.Rejected{}, Errors: []string{},
		Nodes: []web.Node{{Name: "node1", Underlay: "192.0.2.1", Subnet: "10.9.0.0/16", Backend: "vxlan", Observed: true, Counters: &web.Counters{Ready: true},
			Pods: []web.Pod{{Name: "front", IP: "10.9.1.2"}, {Name: "db", IP: "10.9.2.2"}}}}}, nil
}

func (oneNode) Path(context.Context, netip.Addr, netip.Addr) (*web.PathView, error) {
	return nil, errors.New("no paths in this test")
}

// TestFlowsPanel: a node namespace routes between two pod namespaces, the
// second (db, 10.9.2.2) isolated for ingress by shop/db with its drops
// logged to NFLOG; flow.NFLog and flow.Conntrack read the node's kernel
// into a ring that flow.Handler serves, as weftd does, and the page's
// flows panel reads it through internal/ops/flows, as weftctl web does.
// After front connects to db:5432, Chromium must show the drop in the
// table with the policy's name, and a dotted line between the two pods'
// rows in the drawing; an allowed ping shows as allowed.
func TestFlowsPanel(t *testing.T) {
	ctx, bns := browser(t, 1280, 800)
	node, front, db := nettest.NewNS(t, "wfnode"), nettest.NewNS(t, "wffront"), nettest.NewNS(t, "wfdb")
	nettest.Veth(t, node, "v1", front, "eth0")
	nettest.Veth(t, node, "v2", db, "eth0")
	for _, c := range []struct {
		ns            *nettest.NS
		dev, addr, gw string
	}{{node, "v1", "10.9.1.1/24", ""}, {node, "v2", "10.9.2.1/24", ""}, {front, "eth0", "10.9.1.2/24", "10.9.1.1"}, {db, "eth0", "10.9.2.2/24", "10.9.2.1"}} {
		nettest.MustRun(t, c.ns, "ip", "addr", "add", c.addr, "dev", c.dev)
		if c.gw != "" {
			nettest.MustRun(t, c.ns, "ip", "route", "add", "default", "via", c.gw)
		}
	}
	nettest.MustRun(t, node, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	dbIP := netip.MustParseAddr("10.9.2.2")
	if err := policy.Program(node.Path, policy.Plan{IngressIsolated: []netip.Addr{dbIP},
		IngressBy: []policy.Isolation{{Policies: []string{"shop/db"}, Addrs: []netip.Addr{dbIP}}},
		Rules: []policy.Rule{{Name: "shop/db ingress 0", Local: []netip.Addr{dbIP}, AnyPeer: true,
			Ports: []policy.PortEntry{{Addr: policy.Range{First: dbIP, Last: dbIP}, Proto: unix.IPPROTO_TCP, First: 80, Last: 80}}}},
		LogGroup: 13}); err != nil {
		t.Fatal(err)
	}
	ring := readNode(t, node, 13)
	weftd := httptest.NewServer(flow.Handler("node1", ring, nil))
	t.Cleanup(weftd.Close)
	ep := flows.Endpoint{Node: "node1", Client: weftd.Client(), Base: weftd.URL}
	srv := &web.Server{Source: oneNode{}, Interval: 500 * time.Millisecond,
		Flows: func(ctx context.Context, limit int) ([]flow.Flow, []error) {
			fs, _, errs := flows.Recent(ctx, []flows.Endpoint{ep}, flows.Query{Limit: limit}, nil)
			return fs, errs
		}}
	ln, err := bns.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(sctx, ln) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("web server: %v", err)
		}
	})
	if err := chromedp.Do(ctx, chromedp.Navigate("http://"+ln.Addr().String()+"/")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "the flows panel read", `document.getElementById('flows-status').textContent.startsWith('✓')`, 10*time.Second)
	if n := eval[int](t, ctx, `document.querySelectorAll('#flows-layer [data-drop]').length`); n != 0 {
		t.Fatalf("%d drops drawn before any", n)
	}
	// Until the reader is bound a drop is not logged: connect again until
	// the panel shows one.
	deadline := time.Now().Add(20 * time.Second)
	for !eval[bool](t, ctx, `document.querySelector('#flows-table [data-verdict="dropped"]') !== null`) {
		if time.Now().After(deadline) {
			t.Fatalf("no drop in the panel: %s", pageText(t, ctx))
		}
		front.Do(func() error {
			if c, err := net.DialTimeout("tcp", "10.9.2.2:5432", 500*time.Millisecond); err == nil {
				c.Close()
				t.Error("db took a connection to 5432")
			}
			return nil
		})
		time.Sleep(time.Second)
	}
	rs := rows(t, ctx, "#flows-table")
	if len(rs) == 0 || !contains(strings.Join(rs[0], " | "), "node1", "✗ dropped", "front (10.9.1.2)", "db (10.9.2.2):5432 tcp",
		"default deny (ingress): destination pod selected by shop/db; no rule allows") {
		t.Errorf("flows table: %q", rs)
	}
	waitFor(t, ctx, "the drop drawn between front and db", `document.querySelector('#flows-layer [data-drop="10.9.1.2>10.9.2.2"]') !== null`, 5*time.Second)
	if label := eval[string](t, ctx, `document.querySelector('#flows-layer [data-drop] text').textContent`); label != "✗ shop/db" {
		t.Errorf("drop drawn with %q", label)
	}
	// An allowed connection: port 80 is allowed, nothing listens (reset).
	front.Do(func() error {
		if c, err := net.DialTimeout("tcp", "10.9.2.2:80", time.Second); err == nil {
			c.Close()
		}
		return nil
	})
	waitFor(t, ctx, "an allowed flow", `document.querySelector('#flows-table [data-verdict="allowed"]') !== null`, 10*time.Second)
	screenshot(t, ctx, "web-flows.png", 1280, 1100, true)
}

// readNode reads the drops logged to group and conntrack's events in the
// namespace n into a ring until the test ends.
func readNode(t *testing.T, n *nettest.NS, group uint16) *flow.Ring {
	t.Helper()
	fd, err := unix.Open(n.Path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	ring := flow.NewRing(256, 1000, 1000)
	nfl := &flow.NFLog{Group: group, NetNS: fd}
	ct := &flow.Conntrack{NetNS: fd, Pods: []netip.Prefix{netip.MustParsePrefix("10.9.0.0/16")}}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, run := range []func(context.Context, func(flow.Flow)) error{nfl.Run, ct.Run} {
		wg.Go(func() {
			if err := run(ctx, func(f flow.Flow) { ring.Add(f) }); err != nil {
				t.Errorf("read the node's flows: %v", err)
			}
		})
	}
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		unix.Close(fd)
	})
	return ring
}
