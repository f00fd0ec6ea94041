package e2e

import (
	"net/netip"
	"testing"

	"github.com/weft-net/weft/internal/etcdlocal"
	"github.com/weft-net/weft/internal/testkit/nettest"
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

// AddEtcdHost plugs a host named label into u and serves target on it (see
// ServeEtcd).
func AddEtcdHost(tb testing.TB, u *nettest.Underlay, label, target string) *EtcdHost {
	tb.Helper()
	return ServeEtcd(tb, u.AddHost(tb, label, "eth0"), target)
}

// ServeEtcd serves target (an etcd client URL of this process: a unix
// socket, or http(s) on loopback) on port EtcdPort of h's underlay address.
// The relay runs in this process; only its listening socket lives in h's
// namespace. TLS passes through: an https target needs a certificate valid
// for h's address. The relay is closed when the test ends.
func ServeEtcd(tb testing.TB, h *nettest.Host, target string) *EtcdHost {
	tb.Helper()
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
