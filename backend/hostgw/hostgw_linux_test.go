package hostgw

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/vtep"
)

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }
func ip(s string) netip.Addr    { return netip.MustParseAddr(s) }

// waitFor polls cond (every 20 ms, up to 5 s) until it returns "".
func waitFor(t *testing.T, what string, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		msg := cond()
		if msg == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s", what, msg)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestHostGWRoutes runs the backend in a namespace whose underlay eth0 holds
// 192.168.77.1/24 and fd77::1/64, and checks the routes it writes, the peer
// it refuses (off-link), that it never touches the underlay's own routes and
// neighbours, and that it follows table changes.
func TestHostGWRoutes(t *testing.T) {
	ns := nettest.NewNS(t, "hg")
	nettest.MustRun(t, ns, "ip", "link", "add", "eth0", "type", "veth", "peer", "name", "eth0p")
	nettest.MustRun(t, ns, "ip", "addr", "add", "192.168.77.1/24", "dev", "eth0")
	nettest.MustRun(t, ns, "ip", "addr", "add", "fd77::1/64", "dev", "eth0", "nodad")
	nettest.MustRun(t, ns, "ip", "link", "set", "eth0", "up")
	nettest.MustRun(t, ns, "ip", "link", "set", "eth0p", "up")
	nettest.MustRun(t, ns, "ip", "route", "add", "default", "via", "192.168.77.254")
	nettest.MustRun(t, ns, "ip", "route", "add", "10.99.0.0/16", "via", "192.168.77.253")
	nettest.MustRun(t, ns, "ip", "neigh", "add", "192.168.77.200", "lladdr", "02:00:00:00:00:c8", "dev", "eth0", "nud", "permanent")
	l, err := ns.Handle.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(Config{Handle: ns.Handle, NetNS: ns.Path, UnderlayIndex: l.Attrs().Index,
		Local: ip("192.168.77.1"), LocalIPv6: ip("fd77::1"), Subnet: pfx("10.244.1.0/24"),
		ResyncInterval: time.Hour}, // repairs must come from notifications
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	b.Set(vtep.Table{
		pfx("10.244.2.0/24"):      {Addr: ip("192.168.77.2")},
		pfx("fd00:10:244:2::/64"): {Addr: ip("fd77::2")},
		pfx("10.244.3.0/24"):      {Addr: ip("192.168.88.3")}, // behind the default gateway
		pfx("10.244.1.0/24"):      {Addr: ip("192.168.77.1")}, // ourselves: never routed
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	select {
	case <-b.Ready():
	case err := <-done:
		t.Fatalf("Run ended: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("not ready")
	}
	want4 := "default via 192.168.77.254 dev eth0 \n" +
		"10.99.0.0/16 via 192.168.77.253 dev eth0 \n" +
		"10.244.2.0/24 via 192.168.77.2 dev eth0 proto 87 \n" +
		"192.168.77.0/24 dev eth0 proto kernel scope link src 192.168.77.1 \n"
	if got := nettest.MustRun(t, ns, "ip", "-4", "route"); got != want4 {
		t.Errorf("IPv4 routes:\n%s\nwant:\n%s", got, want4)
	}
	if got := nettest.MustRun(t, ns, "ip", "-6", "route", "show", "proto", "87"); !strings.HasPrefix(got, "fd00:10:244:2::/64 via fd77::2 dev eth0 metric 1024") {
		t.Errorf("IPv6 routes: %q", got)
	}
	if got := nettest.MustRun(t, ns, "ip", "neigh", "show", "192.168.77.200"); !strings.Contains(got, "PERMANENT") {
		t.Errorf("the underlay's own permanent neighbour was touched: %q", got)
	}
	off := b.OffLink()
	if len(off) != 1 || off[0].Subnet != pfx("10.244.3.0/24") {
		t.Errorf("OffLink %v, want 10.244.3.0/24", off)
	}
	if st := b.Stats(); st.Events["peer_off_link"] != 1 || st.Repairs["route"] != 0 {
		t.Errorf("stats %+v", st)
	}

	// The off-link peer moves onto the segment; the IPv6 peer leaves.
	b.Set(vtep.Table{
		pfx("10.244.2.0/24"): {Addr: ip("192.168.77.2")},
		pfx("10.244.3.0/24"): {Addr: ip("192.168.77.3")},
	})
	waitFor(t, "table change", func() string {
		got := nettest.MustRun(t, ns, "ip", "route", "show", "proto", "87")
		got6 := nettest.MustRun(t, ns, "ip", "-6", "route", "show", "proto", "87")
		if got != "10.244.2.0/24 via 192.168.77.2 dev eth0 \n10.244.3.0/24 via 192.168.77.3 dev eth0 \n" || got6 != "" {
			return got + got6
		}
		return ""
	})
	if off := b.OffLink(); len(off) != 0 {
		t.Errorf("OffLink %v after the peer moved on-link", off)
	}

	// A deleted route comes back and is counted as a repair.
	nettest.MustRun(t, ns, "ip", "route", "del", "10.244.3.0/24")
	waitFor(t, "route repaired", func() string {
		if got := nettest.MustRun(t, ns, "ip", "route", "show", "10.244.3.0/24"); got != "10.244.3.0/24 via 192.168.77.3 dev eth0 proto 87 \n" {
			return got
		}
		return ""
	})
	waitFor(t, "repair counted", func() string {
		if b.Stats().Repairs["route"] < 1 {
			return "no repair counted"
		}
		return ""
	})

	// So does a route that another owner's replaced.
	nettest.MustRun(t, ns, "ip", "route", "replace", "10.244.3.0/24", "via", "192.168.77.9", "dev", "eth0")
	waitFor(t, "replaced route repaired", func() string {
		if got := nettest.MustRun(t, ns, "ip", "route", "show", "10.244.3.0/24"); got != "10.244.3.0/24 via 192.168.77.3 dev eth0 proto 87 \n" {
			return got
		}
		return ""
	})
}
