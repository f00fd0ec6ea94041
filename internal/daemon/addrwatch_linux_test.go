package daemon

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/testkit/nettest"
)

// TestAddrWatchReplaced: an advertised address that is only gone is not a
// replacement (a network manager may add it again); gone with another of
// its family in its place is.
func TestAddrWatchReplaced(t *testing.T) {
	ns := nettest.NewNS(t, "addrw")
	nettest.MustRun(t, ns, "ip", "link", "add", "ul0", "type", "veth", "peer", "name", "ul1")
	nettest.MustRun(t, ns, "ip", "addr", "add", "10.1.0.1/24", "dev", "ul0")
	l, err := ns.Handle.LinkByName("ul0")
	if err != nil {
		t.Fatal(err)
	}
	w := addrWatch{index: l.Attrs().Index, name: "ul0", want4: netip.MustParseAddr("10.1.0.1")}
	steps := []struct {
		name     string
		cmd      []string
		old, now string
	}{
		{"address there", nil, "", ""},
		{"address gone, none other", []string{"ip", "addr", "flush", "dev", "ul0"}, "", ""},
		{"an IPv6 address is no replacement", []string{"ip", "addr", "add", "fd01::1/64", "dev", "ul0", "nodad"}, "", ""},
		{"another IPv4 address", []string{"ip", "addr", "add", "10.1.0.2/24", "dev", "ul0"}, "10.1.0.1", "10.1.0.2"},
		{"the old one back beside it", []string{"ip", "addr", "add", "10.1.0.1/24", "dev", "ul0"}, "", ""},
	}
	for _, s := range steps {
		if s.cmd != nil {
			nettest.MustRun(t, ns, s.cmd...)
		}
		ch, err := w.check(ns.Handle)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		var old, now netip.Addr
		if ch != nil {
			old, now = ch.old, ch.now
		}
		if addrString(old) != s.old || addrString(now) != s.now || ch != nil && ch.recreated {
			t.Errorf("%s: check = %+v; want %q, %q", s.name, ch, s.old, s.now)
		}
	}
}

func addrString(a netip.Addr) string {
	if !a.IsValid() {
		return ""
	}
	return a.String()
}

// TestAddrWatchRecreated: a device recreated under the underlay's name is
// a change once it holds an address of each family the old one had, with
// the advertised address kept or replaced.
func TestAddrWatchRecreated(t *testing.T) {
	ns := nettest.NewNS(t, "addrw")
	mk := func(addr string) {
		nettest.MustRun(t, ns, "ip", "link", "add", "ul0", "type", "veth", "peer", "name", "ul1")
		if addr != "" {
			nettest.MustRun(t, ns, "ip", "addr", "add", addr, "dev", "ul0")
		}
	}
	mk("10.1.0.1/24")
	l, err := ns.Handle.LinkByName("ul0")
	if err != nil {
		t.Fatal(err)
	}
	w := addrWatch{index: l.Attrs().Index, name: "ul0", want4: netip.MustParseAddr("10.1.0.1"), need4: true}
	steps := []struct {
		name     string
		run      func()
		wantErr  bool
		old, now string
	}{
		{"device deleted", func() { nettest.MustRun(t, ns, "ip", "link", "del", "ul0") }, true, "", ""},
		{"recreated without an address", func() { mk("") }, true, "", ""},
		{"recreated with an IPv6 address only", func() { nettest.MustRun(t, ns, "ip", "addr", "add", "fd01::1/64", "dev", "ul0", "nodad") }, true, "", ""},
		{"recreated with the same address", func() { nettest.MustRun(t, ns, "ip", "addr", "add", "10.1.0.1/24", "dev", "ul0") }, false, "", ""},
		{"recreated with another address", func() {
			nettest.MustRun(t, ns, "ip", "link", "del", "ul0")
			mk("10.1.0.2/24")
		}, false, "10.1.0.1", "10.1.0.2"},
	}
	for _, s := range steps {
		s.run()
		ch, err := w.check(ns.Handle)
		if s.wantErr {
			if err == nil {
				t.Errorf("%s: check = %+v, want an error (waiting)", s.name, ch)
			}
			continue
		}
		if err != nil || ch == nil || !ch.recreated || addrString(ch.old) != s.old || addrString(ch.now) != s.now {
			t.Errorf("%s: check = %+v, %v; want recreated, %q, %q", s.name, ch, err, s.old, s.now)
		}
	}
}

// TestAddrWatchNotified: Run sees the device recreated with another
// address by the kernel's notifications, well before its periodic check
// (addrResync) could.
func TestAddrWatchNotified(t *testing.T) {
	ns := nettest.NewNS(t, "addrw")
	mk := func(addr string) {
		nettest.MustRun(t, ns, "ip", "link", "add", "ul0", "type", "veth", "peer", "name", "ul1")
		nettest.MustRun(t, ns, "ip", "addr", "add", addr, "dev", "ul0")
	}
	mk("10.1.0.1/24")
	l, err := ns.Handle.LinkByName("ul0")
	if err != nil {
		t.Fatal(err)
	}
	w := addrWatch{index: l.Attrs().Index, name: "ul0", want4: netip.MustParseAddr("10.1.0.1"), need4: true,
		log: slog.New(slog.NewTextHandler(t.Output(), nil))}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- ns.Do(func() error { return w.Run(ctx) })
	}()
	select {
	case err := <-done:
		t.Fatalf("Run returned %v with nothing changed", err)
	case <-time.After(500 * time.Millisecond): // long enough to have subscribed; the test holds without it
	}
	nettest.MustRun(t, ns, "ip", "link", "del", "ul0")
	mk("10.1.0.2/24")
	limit := addrResync / 3
	select {
	case err := <-done:
		var ch *underlayChanged
		if !errors.As(err, &ch) || !ch.recreated || addrString(ch.now) != "10.1.0.2" {
			t.Fatalf("Run = %v, want the device recreated with 10.1.0.2", err)
		}
	case <-time.After(limit):
		t.Fatalf("the recreated device not seen within %s (the periodic check is every %s)", limit, addrResync)
	}
}
