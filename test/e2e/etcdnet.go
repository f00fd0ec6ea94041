package e2e

import (
	"net/netip"
	"testing"

	"github.com/weft-net/weft/internal/etcdlocal"
	"github.com/weft-net/weft/internal/nettest"
)

// EtcdPort is the port etcd serves on over the underlay (Options.EtcdOnUnderlay).
const EtcdPort = 2379

// EtcdHost is an etcd server host on the underlay: nodes reach etcd over the
// test network, through the host's address, as real nodes reach a real etcd,
// so that a firewall rule in a node's namespace can cut it off.
type EtcdHost struct {
	*nettest.Host
	Addr  netip.AddrPort // where nodes reach etcd
	Proxy *etcdlocal.Proxy
}

// AddEtcdHost plugs a host named label into u that serves target (an etcd
// client URL of this process, such as a unix socket) on port EtcdPort of its
// underlay address. The relay runs in this process; only its listening
// socket lives in the host's namespace. It is closed when the test ends.
func AddEtcdHost(tb testing.TB, u *nettest.Underlay, label, target string) *EtcdHost {
	tb.Helper()
	h := u.AddHost(tb, label, "eth0")
	addr := netip.AddrPortFrom(h.Addr, EtcdPort)
	ln, err := h.Listen("tcp", addr.String())
	if err != nil {
		tb.Fatal(err)
	}
	p, err := etcdlocal.NewProxyOn(ln, target)
	if err != nil {
		ln.Close()
		tb.Fatal(err)
	}
	tb.Cleanup(p.Close)
	return &EtcdHost{Host: h, Addr: addr, Proxy: p}
}
