package nettest

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/weft-net/weft/internal/namespace"
)

// Underlay is an L2 switch (a bridge in a namespace of its own) that test
// hosts plug into, standing in for a physical network.
type Underlay struct {
	NS     *NS
	Prefix netip.Prefix // the underlay subnet; hosts get .1, .2, …
	MTU    int
	n      int
}

// NewUnderlay creates the switch for the given subnet (for example
// 192.168.77.0/24 or fd77::/64) with the given MTU (0 means 1500).
func NewUnderlay(tb testing.TB, prefix netip.Prefix, mtu int) *Underlay {
	tb.Helper()
	if mtu == 0 {
		mtu = 1500
	}
	u := &Underlay{NS: NewNS(tb, "ul"), Prefix: prefix, MTU: mtu}
	if err := namespace.Bridge(u.NS, namespace.UnderlayBridge); err != nil {
		tb.Fatal(err)
	}
	return u
}

// Host is a test host on an underlay.
type Host struct {
	*NS
	Link string     // name of its underlay interface
	Addr netip.Addr // its underlay address
}

// AddHost creates a namespace plugged into the switch through a veth named
// link inside it (for example "eth0") with the next free address of the
// underlay, and a default route via the switch's subnet so that the host
// has a default route interface, as real nodes do.
func (u *Underlay) AddHost(tb testing.TB, label, link string) *Host {
	tb.Helper()
	u.n++
	addr := u.Prefix.Addr()
	for range u.n {
		addr = addr.Next()
	}
	h := &Host{NS: NewNS(tb, label), Link: link, Addr: addr}
	port := fmt.Sprintf("p%d-%s", u.n, label)
	if len(port) > 15 {
		port = port[:15]
	}
	Veth(tb, h.NS, link, u.NS, port)
	if err := namespace.Enslave(u.NS, port, namespace.UnderlayBridge); err != nil {
		tb.Fatal(err)
	}
	if err := u.setMTU(h.NS, link); err != nil {
		tb.Fatal(err)
	}
	if err := u.setMTU(u.NS, port); err != nil {
		tb.Fatal(err)
	}
	if err := namespace.AddAddr(h.NS, link, netip.PrefixFrom(addr, u.Prefix.Bits())); err != nil {
		tb.Fatal(err)
	}
	// A default route through the underlay's last address (no host owns it)
	// makes the underlay link the default route interface.
	gw := lastAddr(u.Prefix)
	MustRun(tb, h.NS, "ip", "route", "add", "default", "via", gw.String(), "dev", link, "onlink")
	return h
}

func (u *Underlay) setMTU(n *NS, name string) error {
	l, err := n.Handle.LinkByName(name)
	if err != nil {
		return err
	}
	return n.Handle.LinkSetMTU(l, u.MTU)
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	hostBits := p.Addr().BitLen() - p.Bits()
	for i := len(b) - 1; i >= 0 && hostBits > 0; i-- {
		n := min(hostBits, 8)
		b[i] |= byte(1<<n - 1)
		hostBits -= n
	}
	a, _ := netip.AddrFromSlice(b)
	return a.Prev()
}
