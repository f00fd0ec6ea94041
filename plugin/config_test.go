package plugin

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/weft-net/weft/subnet"
)

func TestParseConfig(t *testing.T) {
	cases := []struct {
		name string
		json string
		code uint // 0: valid
		want func(*Config) bool
	}{
		{"defaults", `{"cniVersion":"1.0.0","name":"n","type":"weft"}`, 0, func(c *Config) bool {
			return c.SubnetFile == subnet.DefaultSubnetFile && c.DataDir == DefaultDataDir && c.Bridge == "cni0" && c.MTU == 0 && c.hairpin() &&
				c.storeDir() == "/var/lib/cni/networks/n" && c.oldStoreDir() == "/var/lib/cni/weft/ipam/n"
		}},
		{"all keys", `{"name":"n","subnetFile":"/s","dataDir":"/d","bridge":"br1","mtu":1400,"hairpinMode":false,"dns":{"nameservers":["10.96.0.10"]}}`, 0, func(c *Config) bool {
			return c.SubnetFile == "/s" && c.DataDir == "/d" && c.Bridge == "br1" && c.MTU == 1400 && !c.hairpin() && c.DNS.Nameservers[0] == "10.96.0.10"
		}},
		// kube-flannel.yml's entry: host-local, under Flannel's plugin,
		// keeps the store at its default dataDir and the network name.
		{"Flannel's conflist entry", `{"name":"cbr0","type":"flannel","delegate":{"hairpinMode":true,"isDefaultGateway":true}}`, 0, func(c *Config) bool {
			return c.SubnetFile == subnet.DefaultSubnetFile && c.Bridge == "cni0" && c.hairpin() && c.MTU == 0 &&
				c.storeDir() == "/var/lib/cni/networks/cbr0"
		}},
		// Flannel hands its entry's ipam section to host-local; its own
		// dataDir (scratch files) is weft's old store's parent.
		{"Flannel's ipam dataDir", `{"name":"cbr0","type":"flannel","dataDir":"/var/lib/cni/flannel","ipam":{"type":"host-local","dataDir":"/srv/ipam"},"delegate":{}}`, 0, func(c *Config) bool {
			return c.storeDir() == "/srv/ipam/cbr0" && c.oldStoreDir() == "/var/lib/cni/flannel/ipam/cbr0"
		}},
		{"ipam keys as host-local matches them", `{"name":"n","ipam":{"Type":"host-local","datadir":"/x"}}`, 0, func(c *Config) bool { return c.storeDir() == "/x/n" }},
		{"Flannel's delegate keys", `{"name":"n","type":"flannel","delegate":{"bridge":"br9","mtu":1400,"hairpinMode":false}}`, 0, func(c *Config) bool {
			return c.Bridge == "br9" && c.MTU == 1400 && !c.hairpin()
		}},
		{"weft's keys win over the delegate's", `{"name":"n","type":"flannel","mtu":1300,"delegate":{"mtu":1400}}`, 0, func(c *Config) bool { return c.MTU == 1300 }},
		{"delegate ipam (Flannel refuses it too)", `{"name":"n","type":"flannel","delegate":{"ipam":{"dataDir":"/x"}}}`, types.ErrUnsupportedField, nil},
		{"delegate to another plugin", `{"type":"flannel","delegate":{"type":"calico"}}`, types.ErrUnsupportedField, nil},
		{"delegate without default gateway", `{"type":"flannel","delegate":{"isDefaultGateway":false}}`, types.ErrUnsupportedField, nil},
		{"not JSON", `{"name":`, types.ErrDecodingFailure, nil},
		{"mtu string", `{"name":"n","mtu":"x"}`, types.ErrInvalidNetworkConfig, nil},
		{"mtu too big", `{"name":"n","mtu":70000}`, types.ErrInvalidNetworkConfig, nil},
		{"relative dataDir", `{"name":"n","dataDir":"x"}`, types.ErrInvalidNetworkConfig, nil},
		{"bridge with slash", `{"name":"n","bridge":"a/b"}`, types.ErrInvalidNetworkConfig, nil},
		{"ipam of another type", `{"name":"n","ipam":{"type":"static"}}`, types.ErrUnsupportedField, nil},
		{"ipam ranges", `{"name":"n","ipam":{"type":"host-local","ranges":[]}}`, types.ErrUnsupportedField, nil},
		{"ipam dataDir not a string", `{"name":"n","ipam":{"dataDir":7}}`, types.ErrInvalidNetworkConfig, nil},
		{"relative ipam dataDir", `{"name":"n","ipam":{"dataDir":"x"}}`, types.ErrInvalidNetworkConfig, nil},
		{"no network name", `{"type":"weft"}`, types.ErrInvalidNetworkConfig, nil},
		{"network name with a slash", `{"name":"../n"}`, types.ErrInvalidNetworkConfig, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			conf, err := ParseConfig([]byte(c.json))
			if c.code == 0 {
				if err != nil || !c.want(conf) {
					t.Fatalf("got %+v, %v", conf, err)
				}
				return
			}
			var ce *types.Error
			if !errors.As(err, &ce) || ce.Code != c.code {
				t.Fatalf("error %v, want code %d", err, c.code)
			}
		})
	}
}

func TestNewPlan(t *testing.T) {
	f := subnet.File{
		Network: netip.MustParsePrefix("10.244.0.0/16"), Subnet: netip.MustParsePrefix("10.244.59.1/24"),
		IPv6Network: netip.MustParsePrefix("fd00:10:244::/56"), IPv6Subnet: netip.MustParsePrefix("fd00:10:244:50::1/64"),
		MTU: 1450,
	}
	cases := []struct {
		name    string
		file    subnet.File
		mtu     int
		ranges  int
		routes  string
		masq    int
		wantMTU int
	}{
		{"dual-stack, plugin masquerades", f, 0, 2, "0.0.0.0/0>10.244.59.1 10.244.0.0/16>10.244.59.1 ::/0>fd00:10:244:50::1 fd00:10:244::/56>fd00:10:244:50::1", 2, 1450},
		{"v4 only, daemon masquerades, mtu override", subnet.File{Network: f.Network, Subnet: f.Subnet, MTU: 1450, IPMasq: true}, 1400, 1,
			"0.0.0.0/0>10.244.59.1 10.244.0.0/16>10.244.59.1", 0, 1400},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := newPlan(c.file, c.mtu)
			var rs []string
			for _, r := range p.routes {
				rs = append(rs, r.dst.String()+">"+r.gw.String())
			}
			if len(p.ranges) != c.ranges || strings.Join(rs, " ") != c.routes || len(p.masq) != c.masq || p.mtu != c.wantMTU {
				t.Fatalf("plan %+v, routes %v", p, rs)
			}
			if p.ranges[0].Subnet.String() != "10.244.59.0/24" || p.ranges[0].Gateway.String() != "10.244.59.1" {
				t.Fatalf("range %+v", p.ranges[0])
			}
		})
	}
}

// TestRangeIDs: ranges are numbered as host-local numbers the ranges
// Flannel's plugin gives it, IPv4 first: an IPv6-only node's range is 0.
func TestRangeIDs(t *testing.T) {
	v4 := subnet.File{Network: netip.MustParsePrefix("10.244.0.0/16"), Subnet: netip.MustParsePrefix("10.244.59.1/24"), MTU: 1450}
	v6 := subnet.File{IPv6Network: netip.MustParsePrefix("fd00:10:244::/56"), IPv6Subnet: netip.MustParsePrefix("fd00:10:244:50::1/64"), MTU: 1450}
	dual := v4
	dual.IPv6Network, dual.IPv6Subnet = v6.IPv6Network, v6.IPv6Subnet
	for _, c := range []struct {
		name string
		f    subnet.File
		ids  []int
	}{{"IPv4", v4, []int{0}}, {"IPv6", v6, []int{0}}, {"dual-stack", dual, []int{0, 1}}} {
		var ids []int
		for _, r := range newPlan(c.f, 0).ranges {
			ids = append(ids, r.ID)
		}
		if !slices.Equal(ids, c.ids) {
			t.Errorf("%s: range IDs %v, want %v", c.name, ids, c.ids)
		}
	}
}

// TestHostVethNameGolden pins the host veth names. They must survive
// upgrades: DEL and GC find a pod's veth by this name, so a change would
// leave every pod attached by an older plugin undeletable. The values were
// computed once outside weft ("veth" and the first 11 hex digits of the
// sha256 of container ID, "\r\n" and interface name). Never update them to
// make the test pass.
func TestHostVethNameGolden(t *testing.T) {
	for _, tt := range []struct {
		id, ifname, want string
	}{
		{"c1", "eth0", "vethd2528480aff"},
		{"c1", "eth1", "vethfed60046479"},
		{"c2", "eth0", "veth50d33405d10"},
		{"9f1c0ac6e0e54b1db3c8a2f5c1f0b8e7d6a5c4b3a2918f7e6d5c4b3a29180716", "eth0", "vetha5540cb2daa"},
	} {
		if got := hostVethName(Attachment{tt.id, tt.ifname}); got != tt.want {
			t.Errorf("hostVethName(%s, %s) = %s, want %s: DEL would no longer find veths made by older versions", tt.id, tt.ifname, got, tt.want)
		}
	}
}

func TestHostVethName(t *testing.T) {
	a := hostVethName(Attachment{"c1", "eth0"})
	if len(a) != 15 || !strings.HasPrefix(a, "veth") {
		t.Fatalf("name %q", a)
	}
	if a == hostVethName(Attachment{"c1", "eth1"}) || a == hostVethName(Attachment{"c2", "eth0"}) {
		t.Fatal("names collide across attachments")
	}
	if a != hostVethName(Attachment{"c1", "eth0"}) {
		t.Fatal("name not stable")
	}
}
