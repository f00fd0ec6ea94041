package inspect

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/vtep"
)

func vxlanLease(sn, pub string, vni int) subnet.Lease {
	a := netip.MustParseAddr(pub)
	return subnet.Lease{Subnet: netip.MustParsePrefix(sn), Attrs: subnet.LeaseAttrs{PublicIP: a, BackendType: "vxlan",
		BackendData: &subnet.VXLANData{VNI: vni, VtepMAC: vtep.DeviceMAC(a, vni)}}}
}

// TestCheckLeases: the hostile leases of the fault suite are rejected with
// weftd's reasons; self and good peers are kept; without a config every
// lease is kept.
func TestCheckLeases(t *testing.T) {
	cfg, err := subnet.ParseConfig([]byte(`{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}`))
	if err != nil {
		t.Fatal(err)
	}
	self := vxlanLease("10.244.1.0/24", "192.168.77.1", 1)
	good := vxlanLease("10.244.2.0/24", "192.168.77.2", 1)
	hostile := map[string]subnet.Lease{
		subnet.RejectOutsideNetwork: vxlanLease("0.0.0.0/1", "192.168.77.66", 1),
		subnet.RejectPrefixLength:   vxlanLease("10.244.200.0/25", "192.168.77.68", 1),
		subnet.RejectBackendData:    vxlanLease("10.244.201.0/24", "192.168.77.69", 42),
		subnet.RejectPublicIP:       vxlanLease("10.244.203.0/24", "127.0.0.1", 1),
	}
	ls := []subnet.Lease{self, good}
	for _, l := range hostile {
		ls = append(ls, l)
	}
	ok, rejected := CheckLeases(cfg, self, ls)
	if len(ok) != 2 || ok[0].Key() != self.Key() || ok[1].Key() != good.Key() {
		t.Errorf("kept %v, want self and the good peer", ok)
	}
	if len(rejected) != len(hostile) {
		t.Fatalf("rejected %d leases, want %d: %v", len(rejected), len(hostile), rejected)
	}
	var out strings.Builder
	RenderRejected(&out, rejected)
	for reason, l := range hostile {
		found := false
		for _, r := range rejected {
			if r.Lease.Key() == l.Key() {
				found = true
				if got := subnet.RejectReason(r.Err); got != reason {
					t.Errorf("%s rejected for %s, want %s", l.Key(), got, reason)
				}
			}
		}
		if !found {
			t.Errorf("%s not rejected", l.Key())
		}
		if !strings.Contains(out.String(), "rejected lease "+l.Key()+" (node "+l.Attrs.PublicIP.String()+")") {
			t.Errorf("output does not name %s:\n%s", l.Key(), out.String())
		}
	}
	if ok, rejected := CheckLeases(nil, self, ls); len(ok) != len(ls) || len(rejected) != 0 {
		t.Errorf("without a config: kept %d, rejected %d; want all kept", len(ok), len(rejected))
	}
}

// TestSelfCandidates: a lease whose subnet holds every address (0.0.0.0-1)
// must not be taken for the node's own; a node's own length is not checked.
func TestSelfCandidates(t *testing.T) {
	cfg, err := subnet.ParseConfig([]byte(`{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}`))
	if err != nil {
		t.Fatal(err)
	}
	own := vxlanLease("10.244.1.0/25", "192.168.77.1", 1)
	ls := []subnet.Lease{vxlanLease("0.0.0.0/1", "192.168.77.66", 1), own, vxlanLease("10.244.203.0/24", "127.0.0.1", 1)}
	got := SelfCandidates(cfg, ls)
	if len(got) != 1 || got[0].Key() != own.Key() {
		t.Errorf("candidates %v, want only %s", got, own.Key())
	}
	if got := SelfCandidates(nil, ls); len(got) != len(ls) {
		t.Errorf("without a config: %d candidates, want all %d", len(got), len(ls))
	}
}
