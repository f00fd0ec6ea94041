package e2e

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/testkit/nettest"
)

// notifySocket is a service manager's notification socket (NOTIFY_SOCKET)
// that records what arrives and, for each message, whether the subnet file
// existed when it arrived.
type notifySocket struct {
	path string
	msgs chan notifyMsg
}

type notifyMsg struct {
	state      string
	subnetFile bool // the node's subnet file existed on arrival
	device     bool // the VXLAN device existed on arrival
}

func newNotifySocket(t *testing.T, node *atomic.Pointer[Node]) *notifySocket {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify.sock")
	ln, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	s := &notifySocket{path: path, msgs: make(chan notifyMsg, 16)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 4096)
		for {
			k, err := ln.Read(buf)
			if err != nil {
				return
			}
			m := notifyMsg{state: string(buf[:k])}
			if node := node.Load(); node != nil {
				_, err := os.Stat(node.SubnetFile)
				m.subnetFile = err == nil
				_, err = node.Run("ip", "link", "show", device)
				m.device = err == nil
			}
			s.msgs <- m
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return s
}

// next returns the next message holding want, skipping others (FDSTORE=…).
func (s *notifySocket) next(t *testing.T, want string, within time.Duration) (notifyMsg, error) {
	t.Helper()
	deadline := time.After(within)
	for {
		select {
		case m := <-s.msgs:
			if strings.Contains(m.state, want) {
				return m, nil
			}
		case <-deadline:
			return notifyMsg{}, fmt.Errorf("no %s within %s", want, within)
		}
	}
}

// TestWeftdNotifiesSystemd runs weftd as a Type=notify unit runs it: with
// NOTIFY_SOCKET. It sends READY=1 only once it holds its lease, has written
// the subnet file and programmed its device (not while it waits for the
// network config), READY=1 again and no STOPPING=1 when it starts the node
// again on a recreated underlay, and STOPPING=1 when it is told to stop.
func TestWeftdNotifiesSystemd(t *testing.T) {
	c := NewCluster(t, Options{NoConfig: true})
	var node atomic.Pointer[Node]
	sock := newNotifySocket(t, &node)
	c.OnNode = func(n *Node) {
		node.Store(n)
		n.Env = append(n.Env, "NOTIFY_SOCKET="+sock.path)
	}
	n := c.AddNode("n1")
	Eventually(t, 10*time.Second, "weftd has found no network config", func() error {
		if log, _ := os.ReadFile(n.LogFile); !strings.Contains(string(log), "cannot read the network config") {
			return errors.New("not yet")
		}
		return nil
	})
	if m, err := sock.next(t, "READY=1", time.Second); err == nil {
		t.Fatalf("READY=1 without a network config (subnet file there: %v)", m.subnetFile)
	}
	c.Put(Prefix+"/config", `{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}`)
	m, err := sock.next(t, "READY=1", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !m.subnetFile || !m.device {
		t.Fatalf("READY=1 before weftd was ready: subnet file there %v, %s there %v", m.subnetFile, device, m.device)
	}
	if code, _, err := n.HTTPGet("http://127.0.0.1:9470/readyz"); err != nil || code != 200 {
		t.Errorf("/readyz after READY=1: %d %v", code, err)
	}
	// The underlay device recreated: weftd starts the node again in the
	// same process, and says READY=1 again but never STOPPING=1 meanwhile
	// (systemd would take it for a stop and kill weftd).
	nettest.MustRun(t, n, "ip", "link", "del", "eth0")
	plugUnderlay(t, c, n, "p-n1-again", n.Addr.String())
	deadline := time.After(30 * time.Second)
	for again := false; !again; {
		select {
		case m := <-sock.msgs:
			if strings.Contains(m.state, "STOPPING=1") {
				t.Fatalf("STOPPING=1 while weftd started the node again on the new underlay: %q", m.state)
			}
			again = strings.Contains(m.state, "READY=1")
		case <-deadline:
			t.Fatal("no READY=1 within 30s of the underlay's return")
		}
	}
	n.Stop()
	if _, err := sock.next(t, "STOPPING=1", 5*time.Second); err != nil {
		t.Fatal(err)
	}
}

// TestWeftdRepairsBlackholeRoute runs weftd with flanneld's
// --ip-blackhole-route: the blackhole route for the node's subnet is added,
// comes back promptly when deleted, and a blackhole weft left for a subnet
// that is no longer the node's is removed.
func TestWeftdRepairsBlackholeRoute(t *testing.T) {
	c := NewCluster(t, Options{})
	c.OnNode = func(n *Node) {
		nettest.MustRun(t, n, "ip", "route", "add", "blackhole", "10.244.250.0/24", "proto", "87", "metric", "65535")
	}
	n := c.AddNode("n1", "--ip-blackhole-route")
	n.WaitReady()
	sn := n.Subnet().String()
	blackholes := func() string { return nettest.MustRun(t, n, "ip", "route", "show", "type", "blackhole") }
	Eventually(t, 5*time.Second, "blackhole route for "+sn, func() error {
		if out := blackholes(); !strings.Contains(out, "blackhole "+sn+" proto 87 metric 65535") {
			return fmt.Errorf("blackhole routes:\n%s", out)
		}
		return nil
	})
	Eventually(t, 5*time.Second, "stale blackhole removed", func() error {
		if out := blackholes(); strings.Contains(out, "10.244.250.0/24") {
			return fmt.Errorf("blackhole routes:\n%s", out)
		}
		return nil
	})
	for i := range 3 {
		nettest.MustRun(t, n, "ip", "route", "del", "blackhole", sn, "metric", "65535")
		took := Eventually(t, 5*time.Second, fmt.Sprintf("blackhole route back after deletion %d", i+1), func() error {
			if out := blackholes(); !strings.Contains(out, "blackhole "+sn+" proto 87 metric 65535") {
				return fmt.Errorf("blackhole routes:\n%s", out)
			}
			return nil
		})
		t.Logf("blackhole route back %v after deletion %d", took.Round(time.Millisecond), i+1)
	}
}

// TestWeftdPublicIPChoosesInterface: with --public-ip and no --iface,
// weftd takes the device holding that address as its underlay, as flanneld
// does, not the default route's device: a host with its default route on
// eth0 and the address on eth1 runs its VXLAN device over eth1.
func TestWeftdPublicIPChoosesInterface(t *testing.T) {
	c := NewCluster(t, Options{})
	const pub = "10.77.0.1"
	c.OnNode = func(n *Node) {
		for _, cmd := range [][]string{
			{"ip", "link", "add", "eth1", "type", "veth", "peer", "name", "eth1p"},
			{"ip", "addr", "add", pub + "/24", "dev", "eth1"},
			{"ip", "link", "set", "eth1p", "up"},
			{"ip", "link", "set", "eth1", "up"},
		} {
			nettest.MustRun(t, n, cmd...)
		}
		n.OwnArgs = true
		n.Args = []string{"--etcd-endpoints", c.Endpoints(), "--subnet-file", n.SubnetFile,
			"--health-addr", "127.0.0.1:9470", "--log-level", "debug", "--public-ip", pub}
	}
	n := c.AddNode("n1")
	n.WaitReady()
	if out := nettest.MustRun(t, n, "ip", "route", "show", "default"); !strings.Contains(out, "dev eth0") {
		t.Fatalf("the default route is not on eth0:\n%s", out)
	}
	out := nettest.MustRun(t, n, "ip", "-d", "link", "show", device)
	if !strings.Contains(out, "local "+pub+" dev eth1 ") {
		t.Errorf("%s does not run over eth1 from %s:\n%s", device, pub, out)
	}
	if a, _ := c.lease(t, n.Subnet()); a.PublicIP.String() != pub {
		t.Errorf("lease public IP %s, want %s", a.PublicIP, pub)
	}
}
