package plugin

import (
	"errors"
	"fmt"
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
			return c.SubnetFile == subnet.DefaultSubnetFile && c.stateDir() == "" && c.Bridge == "cni0" && c.MTU == 0 && c.hairpin() &&
				c.defaultGateway() && c.gateway() && !c.promisc() && c.forceAddress() == nil &&
				c.storeDir() == "/var/lib/cni/networks/n"
		}},
		{"all keys", `{"name":"n","subnetFile":"/s","dataDir":"/d","bridge":"br1","mtu":1400,"hairpinMode":false,"dns":{"nameservers":["10.96.0.10"]}}`, 0, func(c *Config) bool {
			return c.SubnetFile == "/s" && c.DataDir == "/d" && c.Bridge == "br1" && c.MTU == 1400 && !c.hairpin() && c.DNS.Nameservers[0] == "10.96.0.10"
		}},
		// kube-flannel.yml's entry: host-local, under Flannel's plugin,
		// keeps the store at its default dataDir and the network name.
		{"Flannel's conflist entry", `{"name":"cbr0","type":"flannel","delegate":{"hairpinMode":true,"isDefaultGateway":true}}`, 0, func(c *Config) bool {
			return c.SubnetFile == subnet.DefaultSubnetFile && c.Bridge == "cni0" && c.hairpin() && c.MTU == 0 &&
				c.defaultGateway() && c.storeDir() == "/var/lib/cni/networks/cbr0" &&
				c.stateDir() == "/var/lib/cni/flannel"
		}},
		// Flannel's delegate without keys: the bridge plugin's defaults.
		{"Flannel's defaults", `{"name":"cbr0","type":"flannel"}`, 0, func(c *Config) bool {
			return !c.hairpin() && !c.defaultGateway() && c.gateway() && c.masquerade(false) && !c.masquerade(true)
		}},
		{"every honoured delegate key", `{"name":"n","type":"flannel","delegate":{"type":"bridge","cniVersion":"0.3.1","bridge":"br1","mtu":1400,` +
			`"hairpinMode":false,"promiscMode":true,"isGateway":false,"isDefaultGateway":false,"forceAddress":true,"ipMasq":true,"ipMasqBackend":"nftables",` +
			`"dns":{"nameservers":["10.96.0.10"]},"args":{"cni":{"ips":["10.244.59.7"],"mac":"0a:00:00:00:00:07"}},"runtimeConfig":{"mac":"0a:00:00:00:00:08"},` +
			`"vlan":0,"vlanTrunk":null,"preserveDefaultVlan":false,"macspoofchk":false,"enabledad":false,"disableContainerInterface":false,"portIsolation":false}}`, 0, func(c *Config) bool {
			return c.Bridge == "br1" && c.MTU == 1400 && !c.hairpin() && c.promisc() && !c.gateway() && !c.defaultGateway() &&
				*c.forceAddress() && c.masquerade(true) && c.dns().Nameservers[0] == "10.96.0.10"
		}},
		{"every honoured ipam key", `{"name":"n","type":"flannel","ipam":{"type":"host-local","dataDir":"/x","routes":[{"dst":"10.9.0.0/16","gw":"10.244.59.3","priority":5}],"resolvConf":"/etc/resolv.conf"}}`, 0, func(c *Config) bool {
			return c.storeDir() == "/x/n" && len(c.IPAM.Routes) == 1 && c.IPAM.ResolvConf == "/etc/resolv.conf"
		}},
		{"runtimeConfig ips and mac", `{"name":"n","type":"flannel","runtimeConfig":{"ips":["10.244.59.7/24"],"mac":"0a:00:00:00:00:07"}}`, 0, func(c *Config) bool {
			return c.runtimeConfig().IPs[0] == "10.244.59.7/24" && c.runtimeConfig().MAC == "0a:00:00:00:00:07"
		}},
		// Flannel hands its entry's ipam section to host-local; its own
		// dataDir is its state directory.
		{"Flannel's ipam dataDir", `{"name":"cbr0","type":"flannel","dataDir":"/var/lib/cni/flannel","ipam":{"type":"host-local","dataDir":"/srv/ipam"},"delegate":{}}`, 0, func(c *Config) bool {
			return c.storeDir() == "/srv/ipam/cbr0" && c.stateDir() == "/var/lib/cni/flannel"
		}},
		{"ipam keys as host-local matches them", `{"name":"n","ipam":{"Type":"host-local","datadir":"/x"}}`, 0, func(c *Config) bool { return c.storeDir() == "/x/n" }},
		{"Flannel's delegate keys", `{"name":"n","type":"flannel","delegate":{"bridge":"br9","mtu":1400,"hairpinMode":false}}`, 0, func(c *Config) bool {
			return c.Bridge == "br9" && c.MTU == 1400 && !c.hairpin()
		}},
		{"weft's keys win over the delegate's", `{"name":"n","type":"flannel","mtu":1300,"delegate":{"mtu":1400}}`, 0, func(c *Config) bool { return c.MTU == 1300 }},
		{"delegate ipam (Flannel refuses it too)", `{"name":"n","type":"flannel","delegate":{"ipam":{"dataDir":"/x"}}}`, types.ErrUnsupportedField, nil},
		{"delegate to another plugin", `{"type":"flannel","delegate":{"type":"calico"}}`, types.ErrUnsupportedField, nil},
		{"delegate name (Flannel refuses it too)", `{"name":"n","type":"flannel","delegate":{"name":"x"}}`, types.ErrUnsupportedField, nil},
		{"hairpin and promiscuous", `{"name":"n","type":"flannel","delegate":{"hairpinMode":true,"promiscMode":true}}`, types.ErrInvalidNetworkConfig, nil},
		{"relative resolvConf", `{"name":"n","ipam":{"resolvConf":"r"}}`, types.ErrInvalidNetworkConfig, nil},
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
	v4 := subnet.File{Network: f.Network, Subnet: f.Subnet, MTU: 1450, IPMasq: true}
	cases := []struct {
		name     string
		file     subnet.File
		conf     string
		ranges   int
		gateways int
		routes   string
		masq     int
		wantMTU  int
	}{
		{"dual-stack, plugin masquerades", f, `{"type":"weft"}`, 2, 2, "10.244.0.0/16>10.244.59.1 fd00:10:244::/56>fd00:10:244:50::1 0.0.0.0/0>10.244.59.1 ::/0>fd00:10:244:50::1", 2, 1450},
		{"v4 only, daemon masquerades, mtu override", v4, `{"type":"weft","mtu":1400}`, 1, 1, "10.244.0.0/16>10.244.59.1 0.0.0.0/0>10.244.59.1", 0, 1400},
		// The bridge plugin's default: no default route.
		{"as flannel, delegate without isDefaultGateway", v4, `{"type":"flannel","delegate":{}}`, 1, 1, "10.244.0.0/16>10.244.59.1", 0, 1450},
		{"isDefaultGateway false", v4, `{"type":"flannel","delegate":{"isDefaultGateway":false}}`, 1, 1, "10.244.0.0/16>10.244.59.1", 0, 1450},
		{"isGateway false", v4, `{"type":"flannel","delegate":{"isGateway":false}}`, 1, 0, "10.244.0.0/16>10.244.59.1", 0, 1450},
		{"isDefaultGateway makes a gateway", v4, `{"type":"flannel","delegate":{"isGateway":false,"isDefaultGateway":true}}`, 1, 1, "10.244.0.0/16>10.244.59.1 0.0.0.0/0>10.244.59.1", 0, 1450},
		{"ipam routes first, with and without gw", v4, `{"type":"flannel","ipam":{"routes":[{"dst":"192.168.9.0/24"},{"dst":"172.16.0.0/12","gw":"10.244.59.9","priority":7}]},"delegate":{"isDefaultGateway":true}}`, 1, 1,
			"192.168.9.0/24>10.244.59.1 172.16.0.0/12>10.244.59.9/7 10.244.0.0/16>10.244.59.1 0.0.0.0/0>10.244.59.1", 0, 1450},
		{"an ipam default route with gw replaces the bridge's", v4, `{"type":"flannel","ipam":{"routes":[{"dst":"0.0.0.0/0","gw":"10.244.59.254"}]},"delegate":{"isDefaultGateway":true}}`, 1, 1,
			"0.0.0.0/0>10.244.59.254 10.244.0.0/16>10.244.59.1", 0, 1450},
		{"ipMasq true though the daemon masquerades", v4, `{"type":"flannel","delegate":{"ipMasq":true}}`, 1, 1, "10.244.0.0/16>10.244.59.1", 1, 1450},
		{"ipMasq false though the daemon does not", f, `{"type":"flannel","delegate":{"ipMasq":false,"isDefaultGateway":true}}`, 2, 2,
			"10.244.0.0/16>10.244.59.1 fd00:10:244::/56>fd00:10:244:50::1 0.0.0.0/0>10.244.59.1 ::/0>fd00:10:244:50::1", 0, 1450},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			conf, err := ParseConfig([]byte(c.conf[:len(c.conf)-1] + `,"name":"n"}`))
			if err != nil {
				t.Fatal(err)
			}
			p := newPlan(c.file, conf)
			var rs []string
			for _, r := range p.routes {
				s := r.dst.String() + ">" + r.gw.String()
				if r.priority != 0 {
					s += fmt.Sprintf("/%d", r.priority)
				}
				rs = append(rs, s)
			}
			if len(p.ranges) != c.ranges || len(p.gateways) != c.gateways || strings.Join(rs, " ") != c.routes || len(p.masq) != c.masq || p.mtu != c.wantMTU {
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
		for _, r := range newPlan(c.f, &Config{}).ranges {
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

// TestRefusedKeys: every key of Flannel's entry, its delegate (the bridge
// plugin) and host-local that weft does not implement is refused with code
// 2 and an error naming it.
func TestRefusedKeys(t *testing.T) {
	for _, c := range []struct{ json, key string }{
		{`"delegate":{"type":"ipvlan"}`, "delegate type"},
		{`"delegate":{"ipam":{}}`, "delegate ipam"},
		{`"delegate":{"name":"x"}`, "delegate name"},
		{`"delegate":{"ipMasqBackend":"iptables"}`, "delegate ipMasqBackend"},
		{`"delegate":{"vlan":100}`, "delegate vlan"},
		{`"delegate":{"vlanTrunk":[{"id":5}]}`, "delegate vlanTrunk"},
		{`"delegate":{"preserveDefaultVlan":true}`, "delegate preserveDefaultVlan"},
		{`"delegate":{"macspoofchk":true}`, "delegate macspoofchk"},
		{`"delegate":{"enabledad":true}`, "delegate enabledad"},
		{`"delegate":{"disableContainerInterface":true}`, "delegate disableContainerInterface"},
		{`"delegate":{"portIsolation":true}`, "delegate portIsolation"},
		{`"delegate":{"hairpin":true}`, `delegate key "hairpin"`},
		{`"ipam":{"type":"whereabouts"}`, "ipam type"},
		{`"ipam":{"ranges":[[{"subnet":"10.9.0.0/24"}]]}`, "ipam ranges"},
		{`"ipam":{"subnet":"10.9.0.0/24"}`, "ipam subnet"},
		{`"ipam":{"rangeStart":"10.244.59.10"}`, "ipam rangeStart"},
		{`"ipam":{"rangeEnd":"10.244.59.20"}`, "ipam rangeEnd"},
		{`"ipam":{"gateway":"10.244.59.1"}`, "ipam gateway"},
		{`"ipam":{"foo":1}`, "ipam foo"},
		{`"ipam":{"routes":[{"dst":"10.9.0.0/16","mtu":1400}]}`, "ipam routes 10.9.0.0/16: mtu"},
		{`"ipam":{"routes":[{"dst":"10.9.0.0/16","advmss":1400}]}`, "ipam routes 10.9.0.0/16: mtu and advmss"},
		{`"ipam":{"routes":[{"dst":"10.9.0.0/16","table":100}]}`, "ipam routes 10.9.0.0/16: table"},
		{`"ipam":{"routes":[{"dst":"10.9.0.0/16","scope":253}]}`, "ipam routes 10.9.0.0/16: table and scope"},
		{`"runtimeConfig":{"ipRanges":[[{"subnet":"10.9.0.0/24"}]]}`, "runtimeConfig ipRanges"},
		{`"runtimeConfig":{"portMappings":[]}`, "runtimeConfig portMappings"},
		{`"delegate":{"runtimeConfig":{"bandwidth":{}}}`, "runtimeConfig bandwidth"},
	} {
		t.Run(c.key, func(t *testing.T) {
			_, err := ParseConfig([]byte(`{"name":"cbr0","type":"flannel",` + c.json + `}`))
			var ce *types.Error
			if !errors.As(err, &ce) || ce.Code != types.ErrUnsupportedField || !strings.Contains(ce.Msg, c.key) {
				t.Fatalf("error %v, want code 2 naming %q", err, c.key)
			}
		})
	}
}

// TestParseRequest: requested addresses and MAC from CNI_ARGS, args.cni
// and runtimeConfig, as host-local and bridge read them (a later MAC wins).
func TestParseRequest(t *testing.T) {
	conf, err := ParseConfig([]byte(`{"name":"n","type":"flannel","args":{"cni":{"ips":["10.244.59.8"],"mac":"0a:00:00:00:00:02"}},` +
		`"runtimeConfig":{"ips":["fd00:10:244:50::9/64"],"mac":"0a:00:00:00:00:03"}}`))
	if err != nil {
		t.Fatal(err)
	}
	r, err := conf.parseRequest("IgnoreUnknown=1;K8S_POD_NAME=p;IP=10.244.59.7;MAC=0a:00:00:00:00:01")
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(r.ips) != "[10.244.59.7 10.244.59.8 fd00:10:244:50::9]" || r.mac.String() != "0a:00:00:00:00:03" {
		t.Fatalf("request %v %s", r.ips, r.mac)
	}
	plain, err := ParseConfig([]byte(`{"name":"n","type":"flannel"}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"IP=banana", "MAC=ff:ff:ff:ff:ff:ff", "MAC=zz"} {
		if _, err := plain.parseRequest(bad); err == nil {
			t.Errorf("CNI_ARGS %s accepted", bad)
		}
	}
}

// TestRequestedIn: a requested address goes to the range holding it; one
// outside the node subnet, the gateway, the broadcast or a second in a
// range is refused.
func TestRequestedIn(t *testing.T) {
	rs := []Range{{Subnet: netip.MustParsePrefix("10.244.59.0/24"), Gateway: netip.MustParseAddr("10.244.59.1")},
		{Subnet: netip.MustParsePrefix("fd00::/64"), Gateway: netip.MustParseAddr("fd00::1"), ID: 1}}
	got, err := requestedIn(rs, []netip.Addr{netip.MustParseAddr("fd00::7"), netip.MustParseAddr("10.244.59.7")})
	if err != nil || got[0].String() != "10.244.59.7" || got[1].String() != "fd00::7" {
		t.Fatalf("%v, %v", got, err)
	}
	for _, bad := range [][]string{{"10.244.60.7"}, {"10.244.59.1"}, {"10.244.59.255"}, {"10.244.59.0"}, {"10.244.59.7", "10.244.59.8"}} {
		var want []netip.Addr
		for _, b := range bad {
			want = append(want, netip.MustParseAddr(b))
		}
		if _, err := requestedIn(rs, want); !errors.Is(err, ErrRequested) {
			t.Errorf("%v: %v", bad, err)
		}
	}
}

func TestParseResolvConf(t *testing.T) {
	dns, err := parseResolvConf(strings.NewReader("# c\nnameserver 10.96.0.10\nnameserver 8.8.8.8\ndomain cluster.local\nsearch a.svc b.svc\noptions ndots:5\n"))
	if err != nil || fmt.Sprintln(dns.Nameservers, dns.Domain, dns.Search, dns.Options) != "[10.96.0.10 8.8.8.8] cluster.local [a.svc b.svc] [ndots:5]\n" {
		t.Fatalf("%+v, %v", dns, err)
	}
}
