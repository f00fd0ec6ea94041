package kernel

import (
	"net/netip"
	"testing"

	"github.com/weft-net/weft/vtep"
)

func TestDesired(t *testing.T) {
	d := NewDesired()
	if d.Table() != nil {
		t.Fatal("a table before the first Set")
	}
	select {
	case <-d.Ready():
		t.Fatal("ready before MarkReady")
	default:
	}
	p := netip.MustParsePrefix("10.244.2.0/24")
	d.Set(nil)
	d.Set(vtep.Table{p: {}})
	<-d.Kick()
	select {
	case <-d.Kick():
		t.Fatal("two Sets before a receive gave two kicks")
	default:
	}
	if tp := d.Table(); tp == nil || len(*tp) != 1 {
		t.Fatalf("latest table %v, want the one with %s", tp, p)
	}
	if !d.MarkReady() || d.MarkReady() {
		t.Fatal("MarkReady must report true exactly once")
	}
	<-d.Ready()
}

// TestDesiredTake checks what Take returns: the table set since the last
// call, if any, and the rows queued after it, in order.
func TestDesiredTake(t *testing.T) {
	d := NewDesired()
	p := func(i int) netip.Prefix { return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i), 0}), 24) }
	if set, ups := d.Take(); set != nil || ups != nil {
		t.Fatalf("before anything: %v %v", set, ups)
	}
	d.Queue([]vtep.Update{{Subnet: p(1)}})
	d.Set(vtep.Table{p(2): {}})
	d.Queue([]vtep.Update{{Subnet: p(3)}})
	d.Queue([]vtep.Update{{Subnet: p(2), Gone: true}})
	<-d.Kick()
	set, ups := d.Take()
	if set == nil || len(*set) != 1 || len(ups) != 2 || ups[0].Subnet != p(3) || !ups[1].Gone {
		t.Fatalf("got table %v and rows %v; want the table set and the two rows queued after it", set, ups)
	}
	if set, ups := d.Take(); set != nil || ups != nil {
		t.Fatalf("nothing since the last Take: %v %v", set, ups)
	}
	d.Queue([]vtep.Update{{Subnet: p(4)}})
	if set, ups := d.Take(); set != nil || len(ups) != 1 {
		t.Fatalf("a row queued alone: %v %v", set, ups)
	}
	if tp := d.Table(); tp == nil || len(*tp) != 1 {
		t.Fatalf("Table: %v, want the table set", tp)
	}
}
