package runtimes

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/test/e2e"
)

// serveCmd is every test container's command: busybox serving, on port
// 5000, the sha256 of what a client sends, and on port 5001 netstat's view
// of its connections (so a client learns the source address it was seen
// with), each in a loop, until the container is removed.
var serveCmd = []string{"sh", "-c",
	"while :; do nc -l -p 5000 -e sha256sum; done & " +
		"while :; do nc -l -p 5001 -e netstat -tn; done & " +
		"while :; do sleep 3600; done"}

// container is a running test container, whatever runtime started it.
type container struct {
	Name string
	IP   netip.Addr
	// Exec runs argv inside the container and returns its output.
	Exec func(argv ...string) (string, error)
}

func (c *container) mustExec(t *testing.T, argv ...string) string {
	t.Helper()
	out, err := c.Exec(argv...)
	if err != nil {
		t.Fatalf("in %s: %s: %v\n%s", c.Name, strings.Join(argv, " "), err, out)
	}
	return out
}

// checkPair: a pings b, sends b 10 MiB over TCP (b's sha256 of what arrived
// equals a's of what it sent), and b sees a's own address as the source.
func checkPair(t *testing.T, a, b *container) {
	t.Helper()
	e2e.Eventually(t, 30*time.Second, fmt.Sprintf("ping %s → %s (%s)", a.Name, b.Name, b.IP), func() error {
		_, err := a.Exec("ping", "-c", "1", "-W", "1", b.IP.String())
		return err
	})
	sent := a.mustExec(t, "sh", "-c", "dd if=/dev/urandom of=/tmp/data bs=1048576 count=10 2>/dev/null && sha256sum < /tmp/data")
	var got string
	e2e.Eventually(t, 30*time.Second, "10 MiB from "+a.Name+" to "+b.Name, func() error {
		out, err := a.Exec("sh", "-c", fmt.Sprintf("nc %s 5000 < /tmp/data", b.IP))
		if err != nil || strings.TrimSpace(out) == "" {
			return fmt.Errorf("nc: %v: %q", err, out)
		}
		got = out
		return nil
	})
	if strings.Fields(got)[0] != strings.Fields(sent)[0] {
		t.Fatalf("%s received data with sha256 %s, %s sent %s", b.Name, strings.Fields(got)[0], a.Name, strings.Fields(sent)[0])
	}
	var seen []netip.Addr
	e2e.Eventually(t, 30*time.Second, "source address seen by "+b.Name, func() error {
		out, err := a.Exec("sh", "-c", fmt.Sprintf("nc %s 5001 </dev/null", b.IP))
		if err != nil {
			return err
		}
		seen = peersOn(out, 5001)
		if len(seen) == 0 {
			return fmt.Errorf("no connection on port 5001 in %q", out)
		}
		return nil
	})
	for _, s := range seen {
		if s != a.IP {
			t.Errorf("%s saw a connection from %s, want %s's own address %s (no NAT inside the cluster)", b.Name, s, a.Name, a.IP)
		}
	}
}

// peersOn parses `netstat -tn` and returns the remote addresses of the
// connections (established or closing) to local port.
func peersOn(netstat string, port int) []netip.Addr {
	var out []netip.Addr
	for _, line := range strings.Split(netstat, "\n") {
		f := strings.Fields(line)
		if len(f) < 6 || f[0] != "tcp" && f[0] != "tcp6" {
			continue
		}
		_, lport, ok1 := splitHostPort(f[3])
		remote, _, ok2 := splitHostPort(f[4])
		if !ok1 || !ok2 || lport != port {
			continue
		}
		out = append(out, remote)
	}
	return out
}

// checkOutside: from c, an address outside the cluster network (a host on
// the underlay with no route to the pods) is reachable, and sees the
// connection coming from the node's own underlay address: masqueraded
// exactly once, by the node.
func checkOutside(t *testing.T, c *container, node *e2e.Node, outside *nettest.Host) {
	t.Helper()
	if _, err := c.Exec("ping", "-c", "1", "-W", "2", outside.Addr.String()); err != nil {
		t.Fatalf("%s cannot ping %s outside the cluster: %v", c.Name, outside.Addr, err)
	}
	ln, err := outside.Listen("tcp", net.JoinHostPort(outside.Addr.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	seen := make(chan netip.Addr, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			close(seen)
			return
		}
		conn.Close()
		seen <- conn.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
	}()
	if out, err := c.Exec("nc", outside.Addr.String(), fmt.Sprint(ln.Addr().(*net.TCPAddr).Port)); err != nil {
		t.Fatalf("%s → %s: %v\n%s", c.Name, ln.Addr(), err, out)
	}
	select {
	case a := <-seen:
		if a != node.Addr {
			t.Errorf("outside saw %s's connection from %s, want the node's address %s", c.Name, a, node.Addr)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("outside never accepted %s's connection", c.Name)
	}
}

// splitHostPort splits netstat's "addr:port", where addr may be an IPv6
// address without brackets (::ffff:10.244.1.2:5001).
func splitHostPort(s string) (netip.Addr, int, bool) {
	i := strings.LastIndexByte(s, ':')
	if i < 0 {
		return netip.Addr{}, 0, false
	}
	a, err1 := netip.ParseAddr(s[:i])
	p, err2 := strconv.Atoi(s[i+1:])
	if err1 != nil || err2 != nil {
		return netip.Addr{}, 0, false
	}
	return a.Unmap(), p, true
}

// checkPlacement: the container's address lies in its node's subnet and its
// eth0 has the overlay MTU (1450: the 1500 underlay less VXLAN's 50 bytes).
func checkPlacement(t *testing.T, ct *container, n *e2e.Node) {
	t.Helper()
	if sub := n.Subnet(); !sub.Contains(ct.IP) {
		t.Fatalf("container %s on %s has %s, outside the node subnet %s", ct.Name, n.Label, ct.IP, sub)
	}
	if mtu := strings.TrimSpace(ct.mustExec(t, "cat", "/sys/class/net/eth0/mtu")); mtu != "1450" {
		t.Errorf("container %s has MTU %s, want the overlay's 1450", ct.Name, mtu)
	}
}
