package doctor

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/ops/inspect"
	"github.com/weft-net/weft/subnet"
)

func TestCheckCNI(t *testing.T) {
	weft := `{"cniVersion":"1.1.0","name":"weft","plugins":[{"type":"weft","subnetFile":"/run/weft/subnet.env"},{"type":"portmap"}]}`
	tests := []struct {
		name   string
		files  map[string]string
		status Status
		want   string
	}{
		{"weft first", map[string]string{"10-weft.conflist": weft, "20-other.conflist": `{"name":"x","plugins":[{"type":"bridge"}]}`}, OK, "reads " + "DIR/10-weft.conflist first: plugins [weft portmap]"},
		{"another file first", map[string]string{"05-bridge.conf": `{"name":"x","type":"bridge"}`, "10-weft.conflist": weft}, Fail, "reads only DIR/05-bridge.conf (plugins [bridge]); weft's DIR/10-weft.conflist comes after it"},
		{"flannel's plugin", map[string]string{"10-flannel.conflist": `{"name":"cbr0","plugins":[{"type":"flannel"}]}`}, Warn, "runs Flannel's plugin"},
		{"other subnet file", map[string]string{"10-weft.conflist": strings.Replace(weft, "/run/weft/", "/run/flannel/", 1)}, Fail, "reads the subnet file /run/flannel/subnet.env, weftd writes /run/weft/subnet.env"},
		{"no weft", map[string]string{"10-bridge.conflist": `{"name":"x","plugins":[{"type":"bridge"}]}`}, Fail, "no weft plugin"},
		{"first does not parse", map[string]string{"00-broken.conflist": `{`, "10-weft.conflist": weft}, Fail, "does not parse"},
		{"empty", map[string]string{"README": "not a config"}, Fail, "no CNI configuration"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, body := range tt.files {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			s := &state{Node: Node{CNIConfDir: dir, SubnetFile: "/run/weft/subnet.env"}, r: &Report{}}
			checkCNI(s)
			c := s.r.Checks[0]
			want := strings.ReplaceAll(tt.want, "DIR", dir)
			if len(s.r.Checks) != 1 || c.Status != tt.status || !strings.Contains(c.Evidence, want) || (c.Status != OK) != (c.Fix != "") {
				t.Errorf("got %s %q (fix %q), want %s with %q", c.Status, c.Evidence, c.Fix, tt.status, want)
			}
		})
	}
}

func TestLeaseAndSubnetFile(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	sub := netip.MustParsePrefix("10.244.7.0/24")
	lease := subnet.Lease{Subnet: sub, Attrs: subnet.LeaseAttrs{PublicIP: netip.MustParseAddr("192.168.77.1")}}
	cfg := &subnet.Config{Network: netip.MustParsePrefix("10.244.0.0/16")}
	k := &inspect.Kernel{Device: inspect.Device{Name: "weft.1", MTU: 1450}}
	tests := []struct {
		name      string
		expires   time.Duration // from now; 0: no TTL
		file      subnet.File
		lease     Status
		matches   Status
		wantMatch string
	}{
		{"current", 20 * time.Hour, subnet.File{Network: cfg.Network, Subnet: subnet.GatewayPrefix(sub), MTU: 1450}, OK, OK, "matches the lease"},
		{"no TTL", 0, subnet.File{Network: cfg.Network, Subnet: subnet.GatewayPrefix(sub), MTU: 1450}, OK, OK, "matches"},
		{"about to expire", 10 * time.Minute, subnet.File{Network: cfg.Network, Subnet: subnet.GatewayPrefix(sub), MTU: 1450}, Warn, OK, "matches"},
		{"expired", -time.Minute, subnet.File{Network: cfg.Network, Subnet: subnet.GatewayPrefix(sub), MTU: 1450}, Fail, OK, "matches"},
		{"file of another lease", 20 * time.Hour, subnet.File{Network: cfg.Network, Subnet: netip.MustParsePrefix("10.244.9.1/24"), MTU: 1450}, OK, Fail, "FLANNEL_SUBNET 10.244.9.1/24 but the lease is 10.244.7.0/24"},
		{"MTU too large", 20 * time.Hour, subnet.File{Network: cfg.Network, Subnet: subnet.GatewayPrefix(sub), MTU: 1500}, OK, Fail, "FLANNEL_MTU 1500 exceeds weft.1's MTU 1450"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "subnet.env")
			if err := subnet.WriteFile(path, tt.file); err != nil {
				t.Fatal(err)
			}
			l := lease
			if tt.expires != 0 {
				l.Expiration = now.Add(tt.expires)
			}
			s := &state{Node: Node{Config: cfg, SubnetFile: path, Now: func() time.Time { return now }}, r: &Report{}, k: k, self: &l}
			checkLease(s)
			checkSubnetFile(s)
			got := map[string]Check{}
			for _, c := range s.r.Checks {
				got[c.Name] = c
			}
			if c := got["lease/current"]; c.Status != tt.lease {
				t.Errorf("lease/current = %s %q, want %s", c.Status, c.Evidence, tt.lease)
			}
			if c := got["subnetfile/matches"]; c.Status != tt.matches || !strings.Contains(c.Evidence, tt.wantMatch) {
				t.Errorf("subnetfile/matches = %s %q, want %s with %q", c.Status, c.Evidence, tt.matches, tt.wantMatch)
			}
		})
	}
}
