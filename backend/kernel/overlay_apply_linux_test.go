package kernel

import (
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/vtep"
)

// entrySteps is an EntryStep that records the entries it holds, standing in
// for the vxlan FDB.
type entrySteps struct{ have map[vtep.Entry]bool }

func (s *entrySteps) Ensure(peers []vtep.Entry) (int, error) {
	n := 0
	for _, p := range peers {
		if !s.have[p] {
			s.have[p] = true
			n++
		}
	}
	return n, nil
}

func (s *entrySteps) Prune(peers []vtep.Entry) (int, error) {
	want := map[vtep.Entry]bool{}
	for _, p := range peers {
		want[p] = true
	}
	n := 0
	for e := range s.have {
		if !want[e] {
			delete(s.have, e)
			n++
		}
	}
	return n, nil
}

func (s *entrySteps) Add(e vtep.Entry) error    { s.have[e] = true; return nil }
func (s *entrySteps) Remove(e vtep.Entry) error { delete(s.have, e); return nil }

// TestApplyMatchesSync checks that applying a difference leaves the kernel
// exactly where a full Sync of the new table would: a Sync afterwards finds
// nothing to do. ApplyAt is told only the rows that differ.
func TestApplyMatchesSync(t *testing.T) {
	t.Run("Apply", func(t *testing.T) {
		testApplyMatchesSync(t, func(o *Overlay, old, next vtep.Table) (SyncStats, error) { return o.Apply(old, next) })
	})
	t.Run("ApplyAt", func(t *testing.T) {
		testApplyMatchesSync(t, func(o *Overlay, old, next vtep.Table) (SyncStats, error) {
			var at []netip.Prefix
			for p, v := range old {
				if w, ok := next[p]; !ok || w != v {
					at = append(at, p)
				}
			}
			for p := range next {
				if _, ok := old[p]; !ok {
					at = append(at, p)
				}
			}
			return o.ApplyAt(old, next, at)
		})
	})
}

func testApplyMatchesSync(t *testing.T, apply func(o *Overlay, old, next vtep.Table) (SyncStats, error)) {
	ns := nettest.NewNS(t, "apply")
	nettest.MustRun(t, ns, "ip", "tuntap", "add", "dev", "tap0", "mode", "tap")
	nettest.MustRun(t, ns, "ip", "link", "set", "tap0", "up")
	l, err := ns.Handle.LinkByName("tap0")
	if err != nil {
		t.Fatal(err)
	}
	step := &entrySteps{have: map[vtep.Entry]bool{}}
	o := NewOverlay(ns.Handle, l.Attrs().Index, OverlayOptions{Family: netlink.FAMILY_ALL, Step: step})
	mac := func(b byte) subnet.MAC { return subnet.MAC{0x0a, 0, 0, 0, 0, b} }
	p := netip.MustParsePrefix
	a := netip.MustParseAddr
	tables := []vtep.Table{
		{p("10.244.2.0/24"): {MAC: mac(2), Addr: a("192.168.77.2")}, p("10.244.3.0/24"): {MAC: mac(3), Addr: a("192.168.77.3")}},
		{ // add 4 and a v6 peer, move 2, change 3's MAC
			p("10.244.2.0/24"): {MAC: mac(2), Addr: a("192.168.77.22")}, p("10.244.3.0/24"): {MAC: mac(33), Addr: a("192.168.77.3")},
			p("10.244.4.0/24"): {MAC: mac(4), Addr: a("192.168.77.4")}, p("fd00:10:244:4::/64"): {MAC: mac(4), Addr: a("fd77::4")},
		},
		{p("10.244.4.0/24"): {MAC: mac(4), Addr: a("192.168.77.4")}}, // remove most
		{},
	}
	if _, err := o.Sync(tables[0]); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < len(tables); i++ {
		if _, err := apply(o, tables[i-1], tables[i]); err != nil {
			t.Fatalf("apply %d: %v", i, err)
		}
		st, err := o.Sync(tables[i])
		if err != nil {
			t.Fatal(err)
		}
		if st.Changed() {
			t.Errorf("after applying table %d a full sync still changed %+v", i, st)
		}
		if len(step.have) != len(tables[i]) {
			t.Errorf("after table %d the step holds %d entries, want %d", i, len(step.have), len(tables[i]))
		}
	}
}
