package vxlan

import (
	"maps"
	"net/netip"
	"testing"

	"github.com/weft-net/weft/internal/testkit/nettest"
)

// TestFDBList: the FDB entries the step reads are the device's permanent
// entries with a remote address (also an all-zero MAC's), not other entries
// or another device's.
func TestFDBList(t *testing.T) {
	ns := nettest.NewNS(t, "fdblist")
	nettest.MustRun(t, ns, "ip", "link", "add", "vx0", "type", "vxlan", "id", "1", "dstport", "8472", "nolearning")
	nettest.MustRun(t, ns, "ip", "link", "add", "vx1", "type", "vxlan", "id", "2", "dstport", "8473", "nolearning")
	for _, cmd := range [][]string{
		{"bridge", "fdb", "append", "0a:00:00:00:00:11", "dst", "100.64.0.1", "dev", "vx0", "self", "permanent"},
		{"bridge", "fdb", "append", "00:00:00:00:00:00", "dst", "100.64.0.3", "dev", "vx0", "self", "permanent"},
		{"bridge", "fdb", "append", "0a:00:00:00:00:14", "dst", "100.64.0.4", "dev", "vx0", "self", "dynamic"},
		{"bridge", "fdb", "append", "0a:00:00:00:00:15", "dst", "100.64.0.5", "dev", "vx1", "self", "permanent"},
	} {
		nettest.MustRun(t, ns, cmd...)
	}
	l, err := ns.Handle.LinkByName("vx0")
	if err != nil {
		t.Fatal(err)
	}
	got, err := fdb{h: ns.Handle, link: l.Attrs().Index}.list()
	if err != nil {
		t.Fatal(err)
	}
	want := map[fdbEntry]bool{
		{MAC: mac("0a:00:00:00:00:11"), Dst: netip.MustParseAddr("100.64.0.1")}: true,
		{MAC: mac("00:00:00:00:00:00"), Dst: netip.MustParseAddr("100.64.0.3")}: true,
	}
	if !maps.Equal(got, want) {
		t.Fatalf("list() = %v, want %v", got, want)
	}
}
