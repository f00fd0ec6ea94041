package web

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/ops/inspect"
	"github.com/weft-net/weft/subnet"
)

func TestParseCounters(t *testing.T) {
	text := `# TYPE weft_dataplane_frames_total counter
weft_dataplane_frames_total{direction="rx"} 12
weft_dataplane_frames_total{direction="tx"} 30
# TYPE weft_repairs_total counter
weft_repairs_total{kind="route"} 2
weft_repairs_total{kind="fdb"} 1
# TYPE weft_leases_rejected_total counter
weft_leases_rejected_total{reason="prefix_length"} 3
weft_leases_rejected_total{reason="public_ip"} 1
# TYPE weft_ready gauge
weft_ready 1
# TYPE weft_dataplane_events_total counter
weft_dataplane_events_total{event="fastpath_tx_bytes"} 5000
weft_dataplane_events_total{event="fastpath_rx_bytes"} 7000
weft_dataplane_events_total{event="fastpath_attaches"} 1
`
	c, err := ParseCounters(text)
	if err != nil {
		t.Fatal(err)
	}
	if c.TxFrames != 30 || c.RxFrames != 12 || c.Repairs["route"] != 2 || c.Repairs["fdb"] != 1 || c.Rejected != 4 || !c.Ready {
		t.Errorf("counters: %+v", c)
	}
	if c.fastTx != 5000 || c.fastRx != 7000 {
		t.Errorf("fast path bytes tx %d rx %d, want 5000 and 7000", c.fastTx, c.fastRx)
	}
	if _, err := ParseCounters("weft_ready{ 1\n"); err == nil {
		t.Error("a broken exposition parsed")
	}
}

func lease(t *testing.T, key, public, mac string) subnet.Lease {
	t.Helper()
	v4, v6, err := subnet.ParseKey(key)
	if err != nil {
		t.Fatal(err)
	}
	m, err := subnet.ParseMAC(mac)
	if err != nil {
		t.Fatal(err)
	}
	return subnet.Lease{Subnet: v4, IPv6Subnet: v6, Attrs: subnet.LeaseAttrs{PublicIP: netip.MustParseAddr(public),
		BackendType: subnet.BackendTypeVXLAN, BackendData: &subnet.VXLANData{VNI: 1, VtepMAC: m}}}
}

// TestBuild: three leases, one of them rejected (prefix length), one node
// observed with a route to only one of its two peers.
func TestBuild(t *testing.T) {
	cfg, err := subnet.ParseConfig([]byte(`{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}`))
	if err != nil {
		t.Fatal(err)
	}
	ls := []subnet.Lease{
		lease(t, "10.244.1.0-24", "192.168.77.1", "02:00:00:00:00:01"),
		lease(t, "10.244.2.0-24", "192.168.77.2", "02:00:00:00:00:02"),
		lease(t, "10.244.3.0-24", "192.168.77.3", "02:00:00:00:00:03"),
		lease(t, "10.244.9.0-26", "192.168.77.9", "02:00:00:00:00:09"),
	}
	k := &inspect.Kernel{
		Device:     inspect.Device{Name: "weft.1", Kind: inspect.KindVXLAN, Addrs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/32")}},
		Routes:     []inspect.Route{{Dst: netip.MustParsePrefix("10.244.2.0/24"), Gw: netip.MustParseAddr("10.244.2.0"), OnLink: true}},
		Neighbours: []inspect.Neighbour{{IP: netip.MustParseAddr("10.244.2.0"), MAC: ls[1].Attrs.BackendData.VtepMAC, Permanent: true}},
		FDB:        []inspect.FDBEntry{{MAC: ls[1].Attrs.BackendData.VtepMAC, Dst: netip.MustParseAddr("192.168.77.2")}},
	}
	obs := []Observation{{Name: "node1", Underlay: netip.MustParseAddr("192.168.77.1"), Kernel: k, Pods: []Pod{{Name: "node1-pod1", IP: "10.244.1.2"}}}}
	s := Build(time.Unix(0, 0), "etcd", cfg, ls, obs)
	var names []string
	for _, n := range s.Nodes {
		names = append(names, n.Name)
	}
	if want := []string{"node1", "192.168.77.2", "192.168.77.3", "192.168.77.9"}; !slices.Equal(names, want) {
		t.Fatalf("nodes %v, want %v", names, want)
	}
	if n := s.Nodes[0]; n.Dataplane != "kernel VXLAN device weft.1" || len(n.Pods) != 1 || n.Subnet != "10.244.1.0/24" {
		t.Errorf("node1: %+v", n)
	}
	if r := s.Nodes[3].Rejected; r == "" {
		t.Error("the /26 lease is not marked rejected")
	}
	if len(s.Rejected) != 1 || s.Rejected[0].Key != "10.244.9.0-26" || s.Rejected[0].Node != "192.168.77.9" {
		t.Errorf("rejected: %+v", s.Rejected)
	}
	want := map[string][]string{
		"node1--192.168.77.2":        {"node1 → 192.168.77.2: ok"},
		"node1--192.168.77.3":        {"node1 → 192.168.77.3: " + inspect.Missing},
		"192.168.77.2--192.168.77.3": {},
	}
	if len(s.Links) != len(want) {
		t.Fatalf("links %+v, want %v", s.Links, want)
	}
	for _, l := range s.Links {
		if w, ok := want[l.ID]; !ok || !slices.Equal(l.State, w) {
			t.Errorf("link %s: %q, want %q", l.ID, l.State, w)
		}
	}
}
