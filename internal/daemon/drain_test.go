package daemon

import (
	"net/netip"
	"testing"

	"github.com/weft-net/weft/subnet"
)

// TestDrainBatches: the batches already waiting are folded into the one
// received, in order, without waiting for more, and the first batch's
// array is not written past its end.
func TestDrainBatches(t *testing.T) {
	ev := func(i int) subnet.Event {
		return subnet.Event{Lease: subnet.Lease{Subnet: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i), 0}), 24)}}
	}
	events := make(chan []subnet.Event, 4)
	events <- []subnet.Event{ev(2)}
	events <- []subnet.Event{ev(3), ev(4)}
	first := make([]subnet.Event, 1, 8)
	first[0] = ev(1)
	got := drainBatches(events, first)
	if len(got) != 4 {
		t.Fatalf("got %d events, want 4", len(got))
	}
	for i, e := range got {
		if want := ev(i + 1); e.Lease.Subnet != want.Lease.Subnet {
			t.Errorf("event %d is %s, want %s", i, e.Lease.Subnet, want.Lease.Subnet)
		}
	}
	if first[:2][1].Lease.Subnet.IsValid() {
		t.Error("drainBatches wrote into the first batch's array")
	}
	if got := drainBatches(events, nil); len(got) != 0 {
		t.Errorf("nothing waiting: got %d events", len(got))
	}
}
