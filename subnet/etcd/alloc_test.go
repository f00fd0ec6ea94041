package etcd

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/weft-net/weft/subnet"
)

func mustConfig(t *testing.T, js string) *subnet.Config {
	t.Helper()
	cfg, err := subnet.ParseConfig([]byte(js))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func entriesFor(keys ...string) []entry {
	var out []entry
	for _, k := range keys {
		v4, v6, err := subnet.ParseKey(k)
		if err != nil {
			panic(err)
		}
		out = append(out, entry{name: k, lease: subnet.Lease{Subnet: v4, IPv6Subnet: v6}})
	}
	return out
}

func TestPick(t *testing.T) {
	tests := []struct {
		name    string
		conf    string
		taken   []string
		hint    string   // comma-separated hints
		want4   []string // acceptable results; empty means none expected
		want6   []string
		exhaust bool
	}{
		{"only one left", tinyConf, []string{"10.1.0.4-30", "10.1.0.12-30"}, "", []string{"10.1.0.8/30"}, nil, false},
		{"all taken", tinyConf, []string{"10.1.0.4-30", "10.1.0.8-30", "10.1.0.12-30"}, "", nil, nil, true},
		{"hint used", tinyConf, nil, "10.1.0.12/30", []string{"10.1.0.12/30"}, nil, false},
		{"hint taken", tinyConf, []string{"10.1.0.4-30", "10.1.0.12-30"}, "10.1.0.12/30", []string{"10.1.0.8/30"}, nil, false},
		{"old wider key covers two subnets", tinyConf, []string{"10.1.0.0-29"}, "", []string{"10.1.0.8/30", "10.1.0.12/30"}, nil, false},
		{"old wider key makes the hint busy", tinyConf, []string{"10.1.0.8-29"}, "10.1.0.12/30", []string{"10.1.0.4/30"}, nil, false},
		{"old narrower key", tinyConf, []string{"10.1.0.4-31", "10.1.0.8-30"}, "", []string{"10.1.0.12/30"}, nil, false},
		{"last subnet of the address space",
			`{"Network": "255.255.255.240/28", "SubnetLen": 30}`, []string{"255.255.255.244-30", "255.255.255.248-30"}, "",
			[]string{"255.255.255.252/30"}, nil, false},
		{"dual-stack takes both families into account",
			`{"EnableIPv6": true, "Network": "10.1.0.0/28", "SubnetLen": 30, "IPv6Network": "fd00::/124"}`,
			[]string{"10.1.0.4-30&fd00::8-126", "10.1.0.12-30&fd00::4-126"}, "",
			[]string{"10.1.0.8/30"}, []string{"fd00::c/126"}, false},
		{"dual-stack hints, both used",
			`{"EnableIPv6": true, "Network": "10.1.0.0/28", "SubnetLen": 30, "IPv6Network": "fd00::/124"}`, nil, "10.1.0.12/30,fd00::8/126",
			[]string{"10.1.0.12/30"}, []string{"fd00::8/126"}, false},
		{"dual-stack hints, the IPv6 one taken",
			`{"EnableIPv6": true, "Network": "10.1.0.0/28", "SubnetLen": 30, "IPv6Network": "fd00::/124"}`,
			[]string{"10.1.0.4-30&fd00::8-126"}, "10.1.0.12/30,fd00::8/126",
			[]string{"10.1.0.12/30"}, []string{"fd00::4/126", "fd00::c/126"}, false},
		{"IPv6 hint",
			`{"EnableIPv4": false, "EnableIPv6": true, "IPv6Network": "fd00::/124"}`, nil, "fd00::8/126",
			nil, []string{"fd00::8/126"}, false},
		{"IPv6 exhausted by a wide old key",
			`{"EnableIPv4": false, "EnableIPv6": true, "IPv6Network": "fd00::/120", "IPv6SubnetLen": 126}`,
			[]string{"0.0.0.0-0&fd00::-121", "0.0.0.0-0&fd00::80-121"}, "", nil, nil, true},
		{"a key as wide as the Network claims nothing",
			`{"EnableIPv4": false, "EnableIPv6": true, "IPv6Network": "fd00::/124"}`,
			[]string{"0.0.0.0-0&fd00::-124", "0.0.0.0-0&fd00::4-126", "0.0.0.0-0&fd00::c-126"}, "", nil, []string{"fd00::8/126"}, false},
		{"a route hijack key claims nothing", tinyConf, []string{"0.0.0.0-1", "10.1.0.4-30", "10.1.0.12-30"}, "", []string{"10.1.0.8/30"}, nil, false},
		{"a key outside the Network claims nothing", tinyConf, []string{"10.250.0.0-24", "10.1.0.4-30", "10.1.0.8-30"}, "", []string{"10.1.0.12/30"}, nil, false},
		{"a key wider than the Network claims nothing", tinyConf, []string{"10.0.0.0-8", "10.1.0.4-30", "10.1.0.8-30"}, "", []string{"10.1.0.12/30"}, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := mustConfig(t, tt.conf)
			var hints []netip.Prefix
			for _, h := range strings.Split(tt.hint, ",") {
				if h != "" {
					hints = append(hints, netip.MustParsePrefix(h))
				}
			}
			for range 20 { // the choice is random: try it a few times
				v4, v6, err := pick(cfg, entriesFor(tt.taken...), hints...)
				if tt.exhaust {
					if !errors.Is(err, subnet.ErrExhausted) {
						t.Fatalf("pick = %v, %v, %v; want ErrExhausted", v4, v6, err)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				if !oneOf(v4, tt.want4) || !oneOf(v6, tt.want6) {
					t.Fatalf("pick = %v, %v; want one of %v and %v", v4, v6, tt.want4, tt.want6)
				}
			}
		})
	}
}

func oneOf(p netip.Prefix, want []string) bool {
	if len(want) == 0 {
		return !p.IsValid()
	}
	for _, w := range want {
		if p == netip.MustParsePrefix(w) {
			return true
		}
	}
	return false
}

func TestPickSpreadsAmongFirstFree(t *testing.T) {
	cfg := mustConfig(t, netConf) // 255 subnets
	seen := map[netip.Prefix]bool{}
	for range 500 {
		v4, _, err := pick(cfg, nil, netip.Prefix{})
		if err != nil {
			t.Fatal(err)
		}
		if v4.Addr().Compare(netip.MustParseAddr("10.244.100.0")) > 0 {
			t.Fatalf("picked %s, beyond the first %d free subnets", v4, pickAmong)
		}
		seen[v4] = true
	}
	if len(seen) < 50 {
		t.Errorf("500 picks hit only %d subnets: not spread", len(seen))
	}
}

func TestLastAddr(t *testing.T) {
	tests := map[string]string{
		"10.1.0.0/28":      "10.1.0.15",
		"10.1.0.4/30":      "10.1.0.7",
		"10.1.0.5/32":      "10.1.0.5",
		"0.0.0.0/0":        "255.255.255.255",
		"10.1.0.77/16":     "10.1.255.255",
		"fd00::/64":        "fd00::ffff:ffff:ffff:ffff",
		"fd00:0:0:1::/126": "fd00:0:0:1::3",
		"fd00::/7":         "fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
	}
	for in, want := range tests {
		t.Run(in, func(t *testing.T) {
			if got := lastAddr(netip.MustParsePrefix(in)); got != netip.MustParseAddr(want) {
				t.Errorf("lastAddr(%s) = %s, want %s", in, got, want)
			}
		})
	}
	if p := after(netip.MustParsePrefix("255.255.255.252/30"), 30); p.IsValid() {
		t.Errorf("after the last /30: %s, want invalid", p)
	}
	if p := after(netip.MustParsePrefix("10.1.0.0/29"), 30); p != netip.MustParsePrefix("10.1.0.8/30") {
		t.Errorf("after 10.1.0.0/29: %s", p)
	}
}
