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
// reads from the kernel's x_tables interface.
func TestLegacyForward(t *testing.T) {
	ns := nettest.NewNS(t, "legacy")
	cfg := &subnet.Config{Network: netip.MustParsePrefix("10.244.0.0/16")}
	check := func() (Check, bool) {
		s := &state{Node: Node{Do: ns.Do, Config: cfg}, r: &Report{}}
		checkFirewall(s)
		for _, c := range s.r.Checks {
			if c.Name == "firewall/forward-legacy" {
				return c, true
			}
		}
		return Check{}, false
	}
	if c, ok := check(); ok {
		t.Fatalf("no legacy table loaded, yet: %s %q", c.Status, c.Evidence)
	}
	steps := []struct {
		name   string
		argv   []string
		status Status
		want   string
	}{
		{"policy drop", []string{"-P", "FORWARD", "DROP"}, Fail, "iptables-legacy table filter chain FORWARD has policy DROP and no rule accepting 10.244.0.0/16"},
		{"a rule for one interface", []string{"-A", "FORWARD", "-i", "cni0", "-j", "ACCEPT"}, Fail, "no rule accepting"},
		{"a narrower source", []string{"-A", "FORWARD", "-s", "10.244.1.0/24", "-j", "ACCEPT"}, Fail, "no rule accepting"},
		{"a conditional rule", []string{"-A", "FORWARD", "-s", "10.244.0.0/16", "-m", "conntrack", "--ctstate", "ESTABLISHED", "-j", "ACCEPT"}, Fail, "no rule accepting"},
		{"from the network to one host", []string{"-A", "FORWARD", "-s", "10.244.0.0/16", "-d", "192.0.2.1", "-j", "ACCEPT"}, Fail, "no rule accepting"},
		{"a drop for the network", []string{"-A", "FORWARD", "-d", "10.244.0.0/16", "-j", "DROP"}, Fail, "no rule accepting"},
		{"a user chain", []string{"-N", "WEFT-FWD"}, Fail, "no rule accepting"},
		{"a jump to it", []string{"-A", "FORWARD", "-j", "WEFT-FWD"}, Fail, "no rule accepting"},
		{"the network accepted in the chain jumped to", []string{"-A", "WEFT-FWD", "-s", "10.244.0.0/16", "-j", "ACCEPT"}, OK, "has policy DROP but a rule accepts 10.244.0.0/16"},
		{"the jump gone", []string{"-D", "FORWARD", "-j", "WEFT-FWD"}, Fail, "no rule accepting"},
		{"the network accepted", []string{"-A", "FORWARD", "-d", "10.0.0.0/8", "-j", "ACCEPT"}, OK, "has policy DROP but a rule accepts 10.244.0.0/16"},
		{"policy accept", []string{"-P", "FORWARD", "ACCEPT"}, OK, "has policy ACCEPT"},
	}
	for _, st := range steps {
		if out, err := ns.Run(append([]string{"iptables-legacy", "-w"}, st.argv...)...); err != nil {
			t.Fatalf("%s: %v %s", st.name, err, out)
		}
		c, ok := check()
		if !ok || c.Status != st.status || !strings.Contains(c.Evidence, st.want) || (c.Status == Fail) != (c.Fix != "") {
			t.Errorf("%s: %v %s %q (fix %q), want %s with %q", st.name, ok, c.Status, c.Evidence, c.Fix, st.status, st.want)
		}
	}
}
