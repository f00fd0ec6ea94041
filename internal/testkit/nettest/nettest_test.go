package nettest

import (
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/weft-net/weft/internal/namespace"
)

func TestUnderlayHostsPing(t *testing.T) {
	u := NewUnderlay(t, netip.MustParsePrefix("192.168.77.0/24"), 1500)
	a := u.AddHost(t, "a", "eth0")
	b := u.AddHost(t, "b", "eth0")
	if a.Addr.String() != "192.168.77.1" || b.Addr.String() != "192.168.77.2" {
		t.Fatalf("addresses %s %s", a.Addr, b.Addr)
	}
	out := MustRun(t, a, "ping", "-c", "1", "-W", "2", b.Addr.String())
	if !strings.Contains(out, "1 received") {
		t.Fatalf("ping: %s", out)
	}
	routes := MustRun(t, a, "ip", "route", "show", "default")
	if !strings.Contains(routes, "192.168.77.254") {
		t.Fatalf("default route: %s", routes)
	}
}

func TestNamespaceIsDeleted(t *testing.T) {
	RequireRoot(t)
	n, err := namespace.Create("del")
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Delete(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(n.Path); !os.IsNotExist(err) {
		t.Fatalf("%s still exists: %v", n.Path, err)
	}
}
