package kernel

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/weft-net/weft/internal/testkit/nettest"
)

// TestFindUnderlayOrder checks flanneld's selection order: each --iface in
// turn, then each --iface-regex, then --iface-can-reach, else the default
// route's device.
func TestFindUnderlayOrder(t *testing.T) {
	ns := nettest.NewNS(t, "ul")
	for _, l := range []struct{ name, addr string }{{"ua", "10.1.0.1/24"}, {"ub", "10.2.0.1/24"}, {"uc", "10.3.0.1/24"}} {
		nettest.MustRun(t, ns, "ip", "link", "add", l.name, "type", "veth", "peer", "name", l.name+"p")
		nettest.MustRun(t, ns, "ip", "addr", "add", l.addr, "dev", l.name)
		nettest.MustRun(t, ns, "ip", "link", "set", l.name, "up")
		nettest.MustRun(t, ns, "ip", "link", "set", l.name+"p", "up")
	}
	nettest.MustRun(t, ns, "ip", "addr", "add", "10.3.0.9/24", "dev", "uc")
	nettest.MustRun(t, ns, "ip", "route", "add", "default", "via", "10.2.0.254")
	nettest.MustRun(t, ns, "ip", "route", "add", "172.16.0.0/16", "via", "10.3.0.254", "src", "10.3.0.9")
	tests := []struct {
		name     string
		q        UnderlayQuery
		dev, ip4 string
		err      string
	}{
		{"default route", UnderlayQuery{}, "ub", "10.2.0.1", ""},
		{"first iface that exists", UnderlayQuery{Ifaces: []string{"nope", "uc", "ua"}}, "uc", "10.3.0.1", ""},
		{"iface by address", UnderlayQuery{Ifaces: []string{"10.1.0.1"}}, "ua", "10.1.0.1", ""},
		{"iface before regex", UnderlayQuery{Ifaces: []string{"ua"}, Regexes: []string{"^uc$"}}, "ua", "10.1.0.1", ""},
		{"regexes in order", UnderlayQuery{Regexes: []string{"^zz", `^10\.3\.`}}, "uc", "10.3.0.1", ""},
		{"regex before can-reach", UnderlayQuery{Regexes: []string{"^ub$"}, CanReach: netip.MustParseAddr("172.16.1.1")}, "ub", "10.2.0.1", ""},
		{"can-reach with its source", UnderlayQuery{Ifaces: []string{"nope"}, CanReach: netip.MustParseAddr("172.16.1.1")}, "uc", "10.3.0.9", ""},
		{"can-reach on-link", UnderlayQuery{CanReach: netip.MustParseAddr("10.1.0.77")}, "ua", "10.1.0.1", ""},
		{"nothing matches", UnderlayQuery{Ifaces: []string{"nope"}}, "", "", "no device named or addressed"},
		{"bad regex", UnderlayQuery{Regexes: []string{"("}}, "", "", "bad --iface-regex"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			u, err := FindUnderlay(ns.Handle, tc.q)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %+v, %v; want error %q", u, err, tc.err)
				}
				return
			}
			if err != nil || u.Name != tc.dev || u.IPv4.String() != tc.ip4 {
				t.Fatalf("got %s %s (%v), want %s %s", u.Name, u.IPv4, err, tc.dev, tc.ip4)
			}
		})
	}
}
