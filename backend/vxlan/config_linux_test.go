package vxlan

import (
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
)

func TestConfigDefaults(t *testing.T) {
	h := &netlink.Handle{}
	v4 := Config{Handle: h, UnderlayIndex: 2, Local: netip.MustParseAddr("192.168.0.1"), Subnet: netip.MustParsePrefix("10.244.1.0/24")}
	v6 := Config{Handle: h, UnderlayIndex: 2, LocalIPv6: netip.MustParseAddr("fd77::1"), IPv6Subnet: netip.MustParsePrefix("fd00:1::/64")}
	dual := v4
	dual.LocalIPv6, dual.IPv6Subnet = v6.LocalIPv6, v6.IPv6Subnet
	with := func(c Config, f func(*Config)) Config { f(&c); return c }

	cases := []struct {
		name    string
		in      Config
		err     string
		devices string // name/family/mtu/addr of each device
	}{
		{name: "IPv4 defaults", in: v4, devices: "weft.1/2/0/10.244.1.0/32"},
		{name: "dual stack with MTU", in: with(dual, func(c *Config) { c.MTU = 1450 }),
			devices: "weft.1/2/1450/10.244.1.0/32 weft-v6.1/10/1430/fd00:1::/128"},
		{name: "IPv6 only keeps MTU", in: with(v6, func(c *Config) { c.MTU = 1430; c.VNI = 7 }),
			devices: "weft-v6.7/10/1430/fd00:1::/128"},
		{name: "custom name", in: with(v4, func(c *Config) { c.Name = "vx0" }), devices: "vx0/2/0/10.244.1.0/32"},
		{name: "no handle", in: with(v4, func(c *Config) { c.Handle = nil }), err: "no netlink handle"},
		{name: "no underlay", in: with(v4, func(c *Config) { c.UnderlayIndex = 0 }), err: "no underlay"},
		{name: "nothing to do", in: Config{Handle: h, UnderlayIndex: 2}, err: "neither"},
		{name: "family mismatch", in: with(v4, func(c *Config) { c.Local = netip.MustParseAddr("fd77::1") }), err: "IPv4 device needs"},
		{name: "VNI out of range", in: with(v4, func(c *Config) { c.VNI = 1 << 24 }), err: "VNI"},
		{name: "name too long", in: with(v6, func(c *Config) { c.VNI = 16777215 }), err: "longer than 15"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := tc.in.withDefaults()
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, s := range c.specs() {
				got = append(got, s.name+"/"+strconv.Itoa(s.family)+"/"+strconv.Itoa(s.mtu)+"/"+s.addr.String())
				if s.mac.IsZero() || s.port != DefaultPort {
					t.Errorf("%s: mac %s port %d", s.name, s.mac, s.port)
				}
			}
			if g := strings.Join(got, " "); g != tc.devices {
				t.Errorf("devices %q, want %q", g, tc.devices)
			}
		})
	}
}
