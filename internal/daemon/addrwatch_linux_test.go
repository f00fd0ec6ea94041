package daemon

import (
	"net/netip"
	"testing"

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
		old, now, err := w.replaced(ns.Handle)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if addrString(old) != s.old || addrString(now) != s.now {
			t.Errorf("%s: replaced = %v, %v; want %q, %q", s.name, old, now, s.old, s.now)
		}
	}
}

func addrString(a netip.Addr) string {
	if !a.IsValid() {
		return ""
	}
	return a.String()
}
