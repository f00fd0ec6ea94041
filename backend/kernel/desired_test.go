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
