package policy

import (
	"encoding/binary"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weft-net/weft/internal/testkit/nettest"
)

// TestARPSenderChecked sends ARP requests for p2's address (10.9.0.3)
// with a chosen sender address, as a raw frame from a pod's eth0, and
// reads what p2 made of them: p2 answers a request and records its sender
// in its neighbour table, so a request that reached it shows there. From
// p1's port (a pod's, listed in the plan) a request with p1's own address
// or with 0.0.0.0 (a duplicate address probe) reaches p2, one with any
// other sender (another pod's, or no pod's) is dropped; from p3's port (on the bridge but not a pod's)
// any sender passes, as frames of ports weft did not wire are not
// checked.
func TestARPSenderChecked(t *testing.T) {
	node, p1, p2 := bridgePods(t)
	p3 := nettest.NewNS(t, "npbr3")
	nettest.Veth(t, node, "v3", p3, "eth0")
	nettest.MustRun(t, node, "ip", "link", "set", "v3", "master", "br0")
	// 10.9.0.4 is the address of a pod on another port (v9, not made).
	plan := Plan{Ports: []PodPort{{ip("10.9.0.2"), "v1"}, {ip("10.9.0.3"), "v2"}, {ip("10.9.0.4"), "v9"}}}
	if err := Program(node.Path, plan); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		from   *nettest.NS
		sender string
		passes bool
	}{
		{"a pod, its own address", p1, "10.9.0.2", true},
		{"a pod, a duplicate address probe", p1, "0.0.0.0", true},
		{"a pod, another pod's address", p1, "10.9.0.4", false},
		{"a pod, an address no pod has", p1, "10.9.0.77", false},
		{"a port that is no pod's, any address", p3, "10.9.0.88", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			nettest.MustRun(t, p2, "ip", "neigh", "flush", "dev", "eth0")
			reply := sendARPRequest(t, c.from, netip.MustParseAddr(c.sender), ip("10.9.0.3"))
			if reply != c.passes {
				t.Errorf("ARP request from %s with sender %s: answered %v, want %v", c.from.Name, c.sender, reply, c.passes)
			}
			if c.sender == "0.0.0.0" {
				return // a probe's sender is recorded nowhere
			}
			out := nettest.MustRun(t, p2, "ip", "neigh", "show", c.sender, "dev", "eth0")
			if learnt := strings.TrimSpace(out) != ""; learnt != c.passes {
				t.Errorf("p2's neighbour entry for %s: %q, want one: %v", c.sender, out, c.passes)
			}
		})
	}
	out := nettest.MustRun(t, node, "nft", "list", "chain", "bridge", Table, "prerouting")
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, `"weft: ARP sender not the pod's"`) && !strings.Contains(l, "packets 2 ") {
			t.Errorf("the ARP drop rule did not count the two forged requests: %s", l)
		}
	}
	if !strings.Contains(out, `"weft: ARP sender not the pod's"`) {
		t.Errorf("no ARP drop rule:\n%s", out)
	}
}

// sendARPRequest sends from n's eth0 an ARP request for target with
// sender as its sender address and eth0's MAC address as its hardware
// address, and says whether an ARP reply from target came back within a
// second.
func sendARPRequest(t *testing.T, n *nettest.NS, sender, target netip.Addr) bool {
	t.Helper()
	var fd int
	var mac net.HardwareAddr
	var ifindex int
	if err := n.Do(func() error {
		ifc, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		mac, ifindex = ifc.HardwareAddr, ifc.Index
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ARP)))
		if err != nil {
			return err
		}
		return unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ARP), Ifindex: ifindex})
	}); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	frame := make([]byte, 0, 42)
	frame = append(frame, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff)
	frame = append(frame, mac...)
	frame = binary.BigEndian.AppendUint16(frame, unix.ETH_P_ARP)
	frame = binary.BigEndian.AppendUint16(frame, 1)             // Ethernet
	frame = binary.BigEndian.AppendUint16(frame, unix.ETH_P_IP) // IPv4
	frame = append(frame, 6, 4)
	frame = binary.BigEndian.AppendUint16(frame, 1) // request
	frame = append(frame, mac...)
	frame = append(frame, sender.AsSlice()...)
	frame = append(frame, make([]byte, 6)...)
	frame = append(frame, target.AsSlice()...)
	to := &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ARP), Ifindex: ifindex, Halen: 6}
	copy(to.Addr[:], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	if err := unix.Sendto(fd, frame, 0, to); err != nil {
		t.Fatalf("send the ARP request: %v", err)
	}
	tv := unix.NsecToTimeval((200 * time.Millisecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 128)
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); {
		m, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			continue
		}
		// An ARP reply (operation 2) whose sender is target.
		if m >= 42 && binary.BigEndian.Uint16(buf[20:22]) == 2 && netip.AddrFrom4([4]byte(buf[28:32])) == target {
			return true
		}
	}
	return false
}

// htons is v in network byte order, as AF_PACKET takes its protocol.
func htons(v uint16) uint16 { return binary.NativeEndian.Uint16(binary.BigEndian.AppendUint16(nil, v)) }
