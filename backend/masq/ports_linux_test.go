package masq

import (
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/testkit/nettest"
)

// TestSourcePorts checks the masquerade rules as the kernel holds them and
// the source port a host outside the cluster network sees: fully-random by
// default, and the pod's own port with KeepPorts (flanneld's
// --ip-masq-fully-random-disable).
func TestSourcePorts(t *testing.T) {
	for _, keep := range []bool{false, true} {
		name := map[bool]string{false: "fully-random", true: "keep ports"}[keep]
		t.Run(name, func(t *testing.T) {
			l := newLab(t)
			start(t, newMasqKeepPorts(t, l.node, keep))
			for _, fam := range []string{"ip", "ip6"} {
				table := map[string]string{"ip": TableIPv4, "ip6": TableIPv6}[fam]
				out := nettest.MustRun(t, l.node, "nft", "list", "chain", fam, table, "postrouting")
				masq := 0
				for _, line := range strings.Split(out, "\n") {
					random := strings.Contains(line, " masquerade fully-random comment")
					if !random && !strings.Contains(line, " masquerade comment") {
						continue
					}
					masq++
					if random == keep {
						t.Errorf("%s %s: %q has fully-random %v, want %v", fam, table, strings.TrimSpace(line), random, !keep)
					}
				}
				if masq != 2 {
					t.Errorf("%s %s: %d masquerade rules, want 2:\n%s", fam, table, masq, out)
				}
			}
			for _, to := range []netip.Addr{l.extAddr, l.extAddr6} {
				from := map[bool]netip.Addr{true: l.nodeAddr, false: l.nodeAddr6}[to.Is4()]
				checkPorts(t, l, to, from, keep)
			}
		})
	}
}

// checkPorts sends UDP from podA to `to` on ext from three source ports and
// checks that ext sees the node's address `node`, and the pod's ports when
// keep, or at least one other port when not (fully-random keeps a port by
// chance once in about 64,000 flows, so three kept ports mean no
// randomisation).
func checkPorts(t *testing.T, l *lab, to, node netip.Addr, keep bool) {
	t.Helper()
	kept := 0
	ports := []uint16{40001, 40002, 40003}
	for _, p := range ports {
		seen := udpSeen(t, l.podA, l.ext, to, p)
		if seen.Addr() != node {
			t.Errorf("to %s from pod port %d: ext saw %s, want the node's address %s", to, p, seen, node)
		}
		if seen.Port() == p {
			kept++
		} else if keep {
			t.Errorf("to %s from pod port %d: ext saw port %d, want the pod's port kept", to, p, seen.Port())
		}
	}
	if !keep && kept == len(ports) {
		t.Errorf("to %s: every pod port kept across fully-random masquerade", to)
	}
}

// udpSeen sends a datagram from port srcPort in `from` to a UDP socket on
// to in `at`, and returns the source address and port the receiver saw.
func udpSeen(t *testing.T, from, at *nettest.NS, to netip.Addr, srcPort uint16) netip.AddrPort {
	t.Helper()
	var rx, tx *net.UDPConn
	if err := at.Do(func() (err error) {
		rx, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(to, 0)))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	if err := from.Do(func() (err error) {
		tx, err = net.ListenUDP("udp", &net.UDPAddr{Port: int(srcPort)})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	dst := rx.LocalAddr().(*net.UDPAddr).AddrPort()
	buf := make([]byte, 16)
	// The first datagrams may wait for neighbour discovery: resend until
	// one arrives.
	for range 10 {
		if _, err := tx.WriteToUDPAddrPort([]byte("port?"), dst); err != nil {
			t.Fatal(err)
		}
		if err := rx.SetReadDeadline(time.Now().Add(500 * time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		if _, src, err := rx.ReadFromUDPAddrPort(buf); err == nil {
			return netip.AddrPortFrom(src.Addr().Unmap(), src.Port())
		}
	}
	t.Fatalf("no datagram from %s port %d reached %s", from.Name, srcPort, dst)
	return netip.AddrPort{}
}
