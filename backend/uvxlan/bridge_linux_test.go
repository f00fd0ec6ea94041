package uvxlan

import (
	"net"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/weft-net/weft/internal/testkit/nettest"
	"golang.org/x/sys/unix"
)

// TestBridgePortUpdates feeds the ports map forwarding database changes as
// the kernel reports them and checks what it holds after each: entries on
// the pod bridge's ports are written and follow moves; the bridge's own
// and permanent (local) entries, group addresses, other bridges' entries
// and ports' own (NTF_SELF, no master) entries are not; a deletion on
// another port than the map's leaves the entry.
func TestBridgePortUpdates(t *testing.T) {
	nettest.RequireRoot(t)
	f, err := newFastPath()
	if err != nil {
		t.Fatal(err)
	}
	defer f.closeMaps()
	const bridge = 5
	f.brIndex = bridge
	pod := net.HardwareAddr{0x0a, 0x58, 10, 244, 1, 2}
	entry := func(typ uint16, mac net.HardwareAddr, port, master, state int) netlink.NeighUpdate {
		return netlink.NeighUpdate{Type: typ, Neigh: netlink.Neigh{Family: unix.AF_BRIDGE, LinkIndex: port,
			MasterIndex: master, HardwareAddr: mac, State: state, Flags: netlink.NTF_MASTER}}
	}
	held := func() map[string]uint32 {
		got := map[string]uint32{}
		var k txKey
		var v uint32
		it := f.ports.Iterate()
		for it.Next(&k, &v) {
			got[net.HardwareAddr(k[:6]).String()] = v
		}
		if err := it.Err(); err != nil {
			t.Fatal(err)
		}
		if len(got) != len(f.portKeys) {
			t.Errorf("map holds %v, its mirror %v", got, f.portKeys)
		}
		return got
	}
	for _, step := range []struct {
		name string
		u    netlink.NeighUpdate
		want map[string]uint32
	}{
		{"learned on a port", entry(unix.RTM_NEWNEIGH, pod, 7, bridge, netlink.NUD_REACHABLE), map[string]uint32{pod.String(): 7}},
		{"moved to another port", entry(unix.RTM_NEWNEIGH, pod, 8, bridge, netlink.NUD_REACHABLE), map[string]uint32{pod.String(): 8}},
		{"deleted on the old port", entry(unix.RTM_DELNEIGH, pod, 7, bridge, 0), map[string]uint32{pod.String(): 8}},
		{"another bridge's entry", entry(unix.RTM_NEWNEIGH, pod, 9, 6, netlink.NUD_REACHABLE), map[string]uint32{pod.String(): 8}},
		{"a port's own entry, no master", entry(unix.RTM_NEWNEIGH, pod, 9, 0, netlink.NUD_PERMANENT), map[string]uint32{pod.String(): 8}},
		{"now the bridge's own", entry(unix.RTM_NEWNEIGH, pod, bridge, bridge, netlink.NUD_NOARP), map[string]uint32{}},
		{"learned again", entry(unix.RTM_NEWNEIGH, pod, 7, bridge, netlink.NUD_STALE), map[string]uint32{pod.String(): 7}},
		{"made permanent (local)", entry(unix.RTM_NEWNEIGH, pod, 7, bridge, netlink.NUD_PERMANENT), map[string]uint32{}},
		{"static", entry(unix.RTM_NEWNEIGH, pod, 7, bridge, netlink.NUD_NOARP), map[string]uint32{pod.String(): 7}},
		{"a group address", entry(unix.RTM_NEWNEIGH, net.HardwareAddr{0x01, 0, 0x5e, 0, 0, 1}, 7, bridge, netlink.NUD_NOARP), map[string]uint32{pod.String(): 7}},
		{"deleted", entry(unix.RTM_DELNEIGH, pod, 7, bridge, 0), map[string]uint32{}},
	} {
		f.portUpdate(step.u)
		got := held()
		if len(got) != len(step.want) {
			t.Fatalf("%s: map holds %v, want %v", step.name, got, step.want)
		}
		for k, v := range step.want {
			if got[k] != v {
				t.Fatalf("%s: map holds %v, want %v", step.name, got, step.want)
			}
		}
	}
}
