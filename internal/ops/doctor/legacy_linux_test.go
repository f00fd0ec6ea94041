package doctor

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/subnet"
)

// TestLegacyForward sets iptables-legacy's FORWARD policy and rules in a
// test namespace, with the iptables-legacy tool, and checks what doctor
// says: the policy read from the kernel's x_tables interface, DROP named
// as a suspect only, whatever the rules (the kernel's trace does not see
// them, so doctor gives no verdict on them), and no firewall check fails.
func TestLegacyForward(t *testing.T) {
	ns := nettest.NewNS(t, "legacy")
	cfg := &subnet.Config{Network: netip.MustParsePrefix("10.244.0.0/16")}
	get := func() []Check {
		s := &state{Node: Node{Do: ns.Do, Config: cfg}, r: &Report{}}
		checkFirewall(s)
		for _, c := range s.r.Checks {
			if c.Status == Fail {
				t.Errorf("a firewall check fails on iptables-legacy's rules, which doctor cannot trace: %+v", c)
			}
		}
		return s.r.Find("firewall/iptables-legacy")
	}
	if c := get(); len(c) != 0 {
		t.Fatalf("no legacy table loaded, yet: %+v", c)
	}
	const suspect = "filter FORWARD has policy DROP, a suspect only: forwarded pod traffic passes it only if a rule there accepts 10.244.0.0/16"
	for _, st := range []struct {
		name string
		argv []string
		want string
	}{
		{"filter loaded, policy accept", []string{"-S"}, "iptables-legacy tables filter are loaded: their rules run beside nftables, and neither `nft list ruleset` nor the kernel's trace sees them; filter FORWARD has policy ACCEPT"},
		{"policy drop", []string{"-P", "FORWARD", "DROP"}, suspect},
		{"a rule accepting the network", []string{"-A", "FORWARD", "-s", "10.244.0.0/16", "-j", "ACCEPT"}, suspect},
		{"policy accept again", []string{"-P", "FORWARD", "ACCEPT"}, "filter FORWARD has policy ACCEPT"},
	} {
		if out, err := ns.Run(append([]string{"iptables-legacy", "-w"}, st.argv...)...); err != nil {
			t.Fatalf("%s: %v %s", st.name, err, out)
		}
		c := get()
		if len(c) != 1 || c[0].Status != Warn || !strings.Contains(c[0].Evidence, st.want) {
			t.Errorf("%s: %+v, want one warning with %q", st.name, c, st.want)
		}
	}
}
