package faults

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/weft-net/weft/internal/testkit/nettest"
)

// cutTable is the nftables table of a cut, inside the cut host's namespace.
const cutTable = "wefttest-cut"

// cutOff firewalls the host in ns off from the TCP service at dst: an
// nftables table in ns (and nowhere else) drops every packet to it and
// from it, so that the host's connections stall silently, as behind a
// firewall that drops. The returned function lifts the cut; the test's end
// lifts it too.
func cutOff(t *testing.T, ns *nettest.NS, dst netip.AddrPort) (lift func()) {
	t.Helper()
	if !dst.Addr().Is4() {
		t.Fatalf("cut off from %s: IPv4 only", dst)
	}
	err := withNFT(ns, func(c *nftables.Conn) {
		tbl := c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: cutTable})
		for _, dir := range []struct {
			name     string
			hook     *nftables.ChainHook
			addr, pt uint32 // offsets of the address and the port to match
		}{
			{"out", nftables.ChainHookOutput, 16, 2}, // daddr, dport
			{"in", nftables.ChainHookInput, 12, 0},   // saddr, sport
		} {
			ch := c.AddChain(&nftables.Chain{Name: dir.name, Table: tbl, Type: nftables.ChainTypeFilter,
				Hooknum: dir.hook, Priority: nftables.ChainPriorityFilter})
			c.AddRule(&nftables.Rule{Table: tbl, Chain: ch, Exprs: []expr.Any{
				&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: dir.addr, Len: 4},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: dst.Addr().AsSlice()},
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: dir.pt, Len: 2},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(dst.Port())},
				&expr.Verdict{Kind: expr.VerdictDrop},
			}})
		}
	})
	if err != nil {
		t.Fatalf("cut %s off from %s: %v", ns.Name, dst, err)
	}
	lifted := false
	lift = func() {
		if lifted {
			return
		}
		lifted = true
		if err := withNFT(ns, func(c *nftables.Conn) {
			c.DelTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: cutTable})
		}); err != nil {
			t.Errorf("lift the cut of %s: %v", ns.Name, err)
		}
	}
	t.Cleanup(lift)
	return lift
}

// withNFT runs f on an nftables connection in ns and commits its batch.
func withNFT(ns *nettest.NS, f func(*nftables.Conn)) error {
	fd, err := unix.Open(ns.Path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open namespace: %w", err)
	}
	defer unix.Close(fd)
	c, err := nftables.New(nftables.WithNetNSFd(fd))
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	f(c)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	return nil
}
