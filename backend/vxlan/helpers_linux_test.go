package vxlan

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/vtep"
)

// node is a test host on the underlay with its own node subnets.
type node struct {
	*nettest.Host
	Addr6    netip.Addr // underlay IPv6 address, if the test added one
	Subnet   netip.Prefix
	Subnet6  netip.Prefix
	underlay int
}

var ul4 = netip.MustParsePrefix("192.168.77.0/24")

// newNode adds a host to u with node subnet 10.244.<n>.0/24 and
// fd00:10:244:<n>::/64, and an underlay IPv6 address fd77::<n>.
func newNode(t *testing.T, u *nettest.Underlay, n int) *node {
	t.Helper()
	h := u.AddHost(t, fmt.Sprintf("n%d", n), "eth0")
	nd := &node{
		Host:    h,
		Addr6:   netip.MustParseAddr(fmt.Sprintf("fd77::%d", n)),
		Subnet:  netip.MustParsePrefix(fmt.Sprintf("10.244.%d.0/24", n)),
		Subnet6: netip.MustParsePrefix(fmt.Sprintf("fd00:10:244:%d::/64", n)),
	}
	addAddr(t, h.NS, "eth0", netip.PrefixFrom(nd.Addr6, 64))
	l, err := h.Handle.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	nd.underlay = l.Attrs().Index
	return nd
}

// config is the dual-stack backend config of nd.
func (nd *node) config() Config {
	return Config{
		Handle:        nd.Handle,
		NetNS:         nd.Path,
		UnderlayIndex: nd.underlay,
		Local:         nd.Addr,
		Subnet:        nd.Subnet,
		LocalIPv6:     nd.Addr6,
		IPv6Subnet:    nd.Subnet6,
	}
}

// entries returns nd's rows in a peer's table.
func (nd *node) entries(vni int) vtep.Table {
	c := nd.config()
	c.VNI = vni
	c, _ = c.withDefaults()
	return vtep.Table{
		nd.Subnet:  {MAC: c.MAC, Addr: nd.Addr},
		nd.Subnet6: {MAC: c.MACv6, Addr: nd.Addr6},
	}
}

// addAddr adds addr to link, an IPv6 one without duplicate address
// detection so that it is usable at once. (namespace.AddAddr's flag 0x80 is
// IFA_F_PERMANENT, not IFA_F_NODAD, so its IPv6 addresses stay tentative
// for a second.)
func addAddr(t *testing.T, n *nettest.NS, link string, addr netip.Prefix) {
	t.Helper()
	argv := []string{"ip", "addr", "add", addr.String(), "dev", link}
	if addr.Addr().Is6() {
		argv = append(argv, "nodad")
	}
	nettest.MustRun(t, n, argv...)
}

func testLogger(t *testing.T) *slog.Logger { return testLoggerTB(t) }

func testLoggerTB(tb testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tb.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// start runs b until the returned stop is called or the test ends.
func start(t *testing.T, b *Backend) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	stop = sync.OnceFunc(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("run did not return within 10s of cancel")
		}
	})
	t.Cleanup(stop)
	return stop
}

func newBackend(t *testing.T, c Config) *Backend {
	t.Helper()
	b, err := New(c, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func waitReady(t *testing.T, b *Backend) {
	t.Helper()
	select {
	case <-b.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("backend not ready within 10s")
	}
}

// lines runs argv in nd and returns its output lines, trimmed and sorted,
// without the empty ones; a failure is one line holding the error.
func lines(t *testing.T, nd *nettest.NS, argv ...string) []string {
	t.Helper()
	out, err := nd.Run(argv...)
	if err != nil {
		return []string{"error: " + err.Error()}
	}
	var ls []string
	for l := range strings.SplitSeq(out, "\n") {
		if l = strings.Join(strings.Fields(l), " "); l != "" {
			ls = append(ls, l)
		}
	}
	slices.Sort(ls)
	return ls
}

// kernelState is what the kernel holds for the device, as iproute2 shows it.
type kernelState struct {
	Neigh, FDB, Route []string
}

// state reads the device's neighbours and routes of its family (IPv6 for
// a name with "v6" in it) and its FDB.
func state(t *testing.T, nd *nettest.NS, dev string) kernelState {
	t.Helper()
	fam := "-4"
	if strings.Contains(dev, "v6") {
		fam = "-6"
	}
	return kernelState{
		Neigh: lines(t, nd, "ip", fam, "neigh", "show", "dev", dev, "nud", "permanent"),
		FDB:   lines(t, nd, "/sbin/bridge", "fdb", "show", "dev", dev),
		Route: lines(t, nd, "ip", fam, "route", "show", "dev", dev),
	}
}

func (s kernelState) String() string {
	return fmt.Sprintf("neigh:\n  %s\nfdb:\n  %s\nroute:\n  %s",
		strings.Join(s.Neigh, "\n  "), strings.Join(s.FDB, "\n  "), strings.Join(s.Route, "\n  "))
}

// equal compares two states regardless of line order.
func (s kernelState) equal(o kernelState) bool {
	eq := func(a, b []string) bool {
		return slices.Equal(slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b)))
	}
	return eq(s.Neigh, o.Neigh) && eq(s.FDB, o.FDB) && eq(s.Route, o.Route)
}

// eventually polls cond every 50 ms until it holds or the deadline passes.
func eventually(t *testing.T, within time.Duration, what string, cond func() (bool, string)) time.Duration {
	t.Helper()
	t0 := time.Now()
	var last string
	for time.Since(t0) < within {
		ok, s := cond()
		if ok {
			return time.Since(t0)
		}
		last = s
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s: not within %v; last:\n%s", what, within, last)
	return 0
}

// waitState waits until dev in nd shows want.
func waitState(t *testing.T, nd *nettest.NS, dev string, want kernelState) time.Duration {
	t.Helper()
	return eventually(t, 10*time.Second, "kernel state of "+dev, func() (bool, string) {
		got := state(t, nd, dev)
		return got.equal(want), "got:\n" + got.String() + "\nwant:\n" + want.String()
	})
}

func mac(s string) subnet.MAC {
	m, err := subnet.ParseMAC(s)
	if err != nil {
		panic(err)
	}
	return m
}
