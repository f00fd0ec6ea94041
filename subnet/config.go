package subnet

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// Backend type names. A uvxlan node still advertises BackendTypeVXLAN in its
// lease: on the wire it is VXLAN. host-gw routes each peer's subnet via the
// peer's public address, as Flannel's host-gw backend; extension runs the
// user's commands on lease events; alloc only leases a subnet and programs nothing (its lease has no
// BackendType, as Flannel's).
const (
	BackendTypeVXLAN     = "vxlan"
	BackendTypeUVXLAN    = "uvxlan"
	BackendTypeHostGW    = "host-gw"
	BackendTypeAlloc     = "alloc"
	BackendTypeWireGuard = "wireguard"
	BackendTypeExtension = "extension"
)

// BackendTypes lists the backend types weft runs, in the order its messages
// name them.
var BackendTypes = []string{BackendTypeVXLAN, BackendTypeUVXLAN, BackendTypeHostGW, BackendTypeWireGuard,
	BackendTypeExtension, BackendTypeAlloc}

// CheckBackendType returns nil for a type weft runs (BackendTypes), and for
// any other an error that says what to use: Flannel's udp, ipsec and ipip
// backends are refused with the weft backend that replaces each.
func CheckBackendType(t string) error {
	switch t {
	case BackendTypeVXLAN, BackendTypeUVXLAN, BackendTypeHostGW, BackendTypeWireGuard,
		BackendTypeExtension, BackendTypeAlloc:
		return nil
	case "udp":
		return fmt.Errorf("backend %q: Flannel's udp backend is not supported; use %q, weft's userspace VXLAN "+
			"(it runs in weftd like udp, and speaks VXLAN to flanneld's vxlan nodes)", t, BackendTypeUVXLAN)
	case "ipsec":
		return fmt.Errorf("backend %q: Flannel's ipsec backend is not supported; use %q for encrypted pod traffic", t, BackendTypeWireGuard)
	case "ipip":
		// Not shipped: the kernels weft is tested on have no IPIP
		// (CONFIG_NET_IPIP), so no test could show it carrying a packet.
		return fmt.Errorf("backend %q: Flannel's ipip backend is not supported yet; use %q "+
			"(Flannel's default, on any kernel) or %q (no encapsulation, nodes on one L2 network)",
			t, BackendTypeVXLAN, BackendTypeHostGW)
	}
	return fmt.Errorf("backend %q: unknown, weft runs %s", t, quoteList(BackendTypes))
}

func quoteList(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = fmt.Sprintf("%q", s)
	}
	return strings.Join(q[:len(q)-1], ", ") + " or " + q[len(q)-1]
}

// WireGuard defaults and modes, Flannel's.
const (
	DefaultWireGuardPort   = 51820
	DefaultWireGuardPortV6 = 51821
	WireGuardSeparate      = "separate" // one device per family (flannel-wg, flannel-wg-v6)
	WireGuardAuto          = "auto"     // one device; each peer over IPv4 or IPv6, chosen per peer
	WireGuardIPv4          = "ipv4"     // one device; every peer over IPv4
	WireGuardIPv6          = "ipv6"     // one device; every peer over IPv6
)

// Defaults shared with Flannel.
const (
	DefaultVNI       = 1
	DefaultVXLANPort = 8472
)

// Config is the cluster network config: Flannel's net-conf.json, stored at
// <prefix>/config in etcd or in a file in Kubernetes mode. ParseConfig fills
// every default, so the fields of a parsed Config are final.
type Config struct {
	EnableIPv4     bool
	EnableIPv6     bool
	EnableNFTables bool

	Network   netip.Prefix // IPv4 cluster network, masked
	SubnetLen int          // prefix length of a node subnet
	SubnetMin netip.Addr   // first node subnet handed out
	SubnetMax netip.Addr   // last node subnet handed out

	IPv6Network   netip.Prefix
	IPv6SubnetLen int
	IPv6SubnetMin netip.Addr
	IPv6SubnetMax netip.Addr

	Backend BackendConfig
}

// BackendConfig is the "Backend" object of the config.
type BackendConfig struct {
	Type          string // BackendTypeVXLAN or BackendTypeUVXLAN
	VNI           int    // VXLAN network identifier, 24 bits
	Port          int    // UDP destination port
	MTU           int    // underlay MTU; 0 means the underlay device's MTU
	GBP           bool
	Learning      bool
	DirectRouting bool
	// AllowForeignSources turns off the inner source checks: uvxlan's (it
	// drops an inner packet whose source is outside the sending node's
	// subnet) and the vxlan backend's (it drops frames out of its device
	// whose source is outside the cluster network). Routed setups that
	// forward other sources through a node need it.
	AllowForeignSources bool
	// FastPath has the uvxlan dataplane's traffic to and from peers carried
	// by tc BPF programs weft loads (uvxlan.Config.FastPath) wherever a node
	// runs uvxlan: Type uvxlan, a vxlan node that falls back to it, a node
	// run with --backend uvxlan. On unless the config says "FastPath":
	// false; a node where the programs cannot be loaded or attached says why
	// and runs the userspace path.
	FastPath bool

	// wireguard only (Flannel's names and defaults).
	ListenPort, ListenPortV6    int    // UDP ports of the IPv4 and IPv6 devices
	PSK                         string // optional preshared key, base64
	PersistentKeepaliveInterval int    // seconds; 0: off
	Mode                        string // WireGuardSeparate, Auto, IPv4 or IPv6

	// extension only (Flannel's names): commands run by sh, see
	// backend/extension.
	PreStartupCommand, PostStartupCommand string
	SubnetAddCommand, SubnetRemoveCommand string
}

// rawConfig mirrors the JSON. encoding/json matches field names without
// regard to case, as Flannel does. Pointers tell "absent" from "zero".
type rawConfig struct {
	EnableIPv4     *bool
	EnableIPv6     bool
	EnableNFTables bool
	Network        string
	SubnetLen      int
	SubnetMin      string
	SubnetMax      string
	IPv6Network    string
	IPv6SubnetLen  int
	IPv6SubnetMin  string
	IPv6SubnetMax  string
	Backend        *rawBackend
}

type rawBackend struct {
	Type                string
	VNI                 *int
	Port                int
	MTU                 int
	GBP                 bool
	Learning            bool
	DirectRouting       bool
	AllowForeignSources bool
	FastPath            *bool

	ListenPort, ListenPortV6    int
	PSK                         string
	PersistentKeepaliveInterval int
	Mode                        string

	PreStartupCommand, PostStartupCommand string
	SubnetAddCommand, SubnetRemoveCommand string
}

// ParseConfig parses and validates a network config and fills its defaults
// exactly as Flannel does. Errors name the field and the rule broken.
func ParseConfig(data []byte) (*Config, error) {
	var raw rawConfig
	if err := json.Unmarshal(data, &raw); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return nil, fmt.Errorf("network config: %s: a JSON %s, want a %s: %w", te.Field, te.Value, te.Type, err)
		}
		return nil, fmt.Errorf("parse network config: %w", err)
	}
	cfg := &Config{
		EnableIPv4:     raw.EnableIPv4 == nil || *raw.EnableIPv4,
		EnableIPv6:     raw.EnableIPv6,
		EnableNFTables: raw.EnableNFTables,
	}
	if !cfg.EnableIPv4 && !cfg.EnableIPv6 {
		return nil, errors.New("network config: EnableIPv4 and EnableIPv6 are both false: enable at least one")
	}
	if cfg.EnableIPv4 {
		f, err := parseFamily(familyV4, raw.Network, raw.SubnetLen, raw.SubnetMin, raw.SubnetMax)
		if err != nil {
			return nil, fmt.Errorf("network config: %w", err)
		}
		cfg.Network, cfg.SubnetLen, cfg.SubnetMin, cfg.SubnetMax = f.network, f.subnetLen, f.min, f.max
	}
	if cfg.EnableIPv6 {
		f, err := parseFamily(familyV6, raw.IPv6Network, raw.IPv6SubnetLen, raw.IPv6SubnetMin, raw.IPv6SubnetMax)
		if err != nil {
			return nil, fmt.Errorf("network config: %w", err)
		}
		cfg.IPv6Network, cfg.IPv6SubnetLen, cfg.IPv6SubnetMin, cfg.IPv6SubnetMax = f.network, f.subnetLen, f.min, f.max
	}
	b, err := parseBackend(raw.Backend)
	if err != nil {
		return nil, fmt.Errorf("network config: %w", err)
	}
	cfg.Backend = b
	return cfg, nil
}

// family holds the per-address-family rules, named as the JSON fields are.
type family struct {
	prefix       string // "" or "IPv6", the field name prefix
	bits         int
	maxSubnetLen int // longest node subnet
	maxNetLen    int // longest usable Network
	defaultLen   int // node subnet length for large networks
}

var (
	familyV4 = family{prefix: "", bits: 32, maxSubnetLen: 30, maxNetLen: 28, defaultLen: 24}
	familyV6 = family{prefix: "IPv6", bits: 128, maxSubnetLen: 126, maxNetLen: 124, defaultLen: 64}
)

type parsedFamily struct {
	network   netip.Prefix
	subnetLen int
	min, max  netip.Addr
}

func (f family) field(name string) string { return f.prefix + name }

func (f family) parsePrefix(s string) (netip.Prefix, error) {
	name := f.field("Network")
	if s == "" {
		return netip.Prefix{}, fmt.Errorf("%s: missing: set it to the cluster CIDR", name)
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%s %q: not a CIDR: %w", name, s, err)
	}
	if p.Addr().BitLen() != f.bits || p.Addr().Is4In6() {
		return netip.Prefix{}, fmt.Errorf("%s %q: must be an IPv%d CIDR", name, s, map[int]int{32: 4, 128: 6}[f.bits])
	}
	return p.Masked(), nil
}

func parseFamily(f family, network string, subnetLen int, min, max string) (parsedFamily, error) {
	var out parsedFamily
	p, err := f.parsePrefix(network)
	if err != nil {
		return out, err
	}
	out.network = p
	switch {
	case subnetLen < 0:
		return out, fmt.Errorf("%s %d: must not be negative", f.field("SubnetLen"), subnetLen)
	case subnetLen > 0 && subnetLen > f.maxSubnetLen:
		return out, fmt.Errorf("%s %d: must be at most %d", f.field("SubnetLen"), subnetLen, f.maxSubnetLen)
	case subnetLen > 0 && subnetLen < p.Bits()+2:
		return out, fmt.Errorf("%s %d: must be at least %d (%s /%d must hold at least four subnets)",
			f.field("SubnetLen"), subnetLen, p.Bits()+2, f.field("Network"), p.Bits())
	case subnetLen == 0 && p.Bits() > f.maxNetLen:
		return out, fmt.Errorf("%s %s: too small, must be /%d or larger", f.field("Network"), p, f.maxNetLen)
	case subnetLen == 0 && p.Bits() <= f.defaultLen-2:
		subnetLen = f.defaultLen
	case subnetLen == 0:
		subnetLen = p.Bits() + 2
	}
	out.subnetLen = subnetLen
	if out.min, err = f.bound("SubnetMin", min, p, subnetLen, nthSubnet(p, subnetLen, 1)); err != nil {
		return out, err
	}
	if out.max, err = f.bound("SubnetMax", max, p, subnetLen, lastSubnet(p, subnetLen)); err != nil {
		return out, err
	}
	if out.min.Compare(out.max) > 0 {
		return out, fmt.Errorf("%s %s: must not be after %s %s", f.field("SubnetMin"), out.min, f.field("SubnetMax"), out.max)
	}
	return out, nil
}

// bound parses SubnetMin or SubnetMax: an address inside the network,
// aligned to the subnet length. Flannel also accepts "a.b.c.d/len".
func (f family) bound(name, s string, network netip.Prefix, subnetLen int, def netip.Addr) (netip.Addr, error) {
	name = f.field(name)
	if s == "" {
		return def, nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		p, perr := netip.ParsePrefix(s)
		if perr != nil {
			return netip.Addr{}, fmt.Errorf("%s %q: not an address: %w", name, s, err)
		}
		a = p.Addr()
	}
	if !network.Contains(a) {
		return netip.Addr{}, fmt.Errorf("%s %s: not inside %s %s", name, a, f.field("Network"), network)
	}
	if netip.PrefixFrom(a, subnetLen).Masked().Addr() != a {
		return netip.Addr{}, fmt.Errorf("%s %s: not aligned to %s %d", name, a, f.field("SubnetLen"), subnetLen)
	}
	return a, nil
}

func parseBackend(raw *rawBackend) (BackendConfig, error) {
	b := BackendConfig{Type: BackendTypeVXLAN, VNI: DefaultVNI, Port: DefaultVXLANPort, FastPath: true}
	if raw == nil {
		return b, nil
	}
	if t := strings.ToLower(raw.Type); t != "" {
		if err := CheckBackendType(t); err != nil {
			return b, fmt.Errorf("Backend.Type: %w", err)
		}
		b.Type = t
	}
	if raw.VNI != nil {
		b.VNI = *raw.VNI
	}
	if b.VNI < 0 || b.VNI > 1<<24-1 {
		return b, fmt.Errorf("Backend.VNI %d: must be between 0 and %d", b.VNI, 1<<24-1)
	}
	if raw.Port != 0 {
		b.Port = raw.Port
	}
	if b.Port < 1 || b.Port > 65535 {
		return b, fmt.Errorf("Backend.Port %d: must be between 1 and 65535", raw.Port)
	}
	if raw.MTU != 0 && (raw.MTU < 1280 || raw.MTU > 65535) {
		return b, fmt.Errorf("Backend.MTU %d: must be between 1280 and 65535, or 0 for the underlay device's MTU", raw.MTU)
	}
	b.MTU, b.GBP, b.Learning, b.DirectRouting = raw.MTU, raw.GBP, raw.Learning, raw.DirectRouting
	b.AllowForeignSources = raw.AllowForeignSources
	if raw.FastPath != nil {
		if b.Type != BackendTypeUVXLAN && b.Type != BackendTypeVXLAN {
			return b, fmt.Errorf("Backend.FastPath: only the %q backend has a fast path (and %q, which falls back to it), not %q",
				BackendTypeUVXLAN, BackendTypeVXLAN, b.Type)
		}
		b.FastPath = *raw.FastPath
	}
	b.PreStartupCommand, b.PostStartupCommand = raw.PreStartupCommand, raw.PostStartupCommand
	b.SubnetAddCommand, b.SubnetRemoveCommand = raw.SubnetAddCommand, raw.SubnetRemoveCommand
	if b.Type != BackendTypeExtension {
		for _, c := range []struct{ name, v string }{{"PreStartupCommand", b.PreStartupCommand},
			{"PostStartupCommand", b.PostStartupCommand}, {"SubnetAddCommand", b.SubnetAddCommand},
			{"SubnetRemoveCommand", b.SubnetRemoveCommand}} {
			if c.v != "" {
				return b, fmt.Errorf("Backend.%s: only the %q backend runs commands, not %q", c.name, BackendTypeExtension, b.Type)
			}
		}
	}
	if b.Type == BackendTypeWireGuard {
		return parseWireGuard(b, raw)
	}
	if b.Type == BackendTypeUVXLAN && (b.GBP || b.Learning) {
		return b, errors.New("Backend.GBP and Backend.Learning: not supported by the uvxlan backend (a TAP device sees neither the skb mark nor kernel learning)")
	}
	return b, nil
}

// nthSubnet returns the address of the n-th subnet of length l in p.
func nthSubnet(p netip.Prefix, l int, n uint64) netip.Addr {
	return addUint(p.Addr(), l, n)
}

// lastSubnet returns the address of the last subnet of length l in p: the
// bits between p's length and l all set.
func lastSubnet(p netip.Prefix, l int) netip.Addr {
	a := p.Addr()
	hi, lo := be128(a.As16())
	netHi, netLo := lowMask128(uint(a.BitLen() - p.Bits()))
	subHi, subLo := lowMask128(uint(a.BitLen() - l))
	out := put128(hi|netHi&^subHi, lo|netLo&^subLo)
	if a.Is4() {
		return netip.AddrFrom4([4]byte(out[12:]))
	}
	return netip.AddrFrom16(out)
}

// addUint adds n subnets of length l to a. It works on the 128-bit form of a
// so that both families share it.
func addUint(a netip.Addr, l int, n uint64) netip.Addr {
	b := a.As16()
	shift := a.BitLen() - l // bit position of the subnet's lowest bit
	// add n << shift to the big-endian 128-bit number b (low 32 bits for IPv4)
	hi, lo := be128(b)
	addHi, addLo := shl128(n, uint(shift))
	lo, carry := add64(lo, addLo)
	hi += addHi + carry
	out := put128(hi, lo)
	if a.Is4() {
		return netip.AddrFrom4([4]byte(out[12:]))
	}
	return netip.AddrFrom16(out)
}

// SubnetCount returns how many node subnets lie between SubnetMin and
// SubnetMax of one family (capped at 2^63).
func (c *Config) SubnetCount(v6 bool) uint64 {
	min, max, l := c.SubnetMin, c.SubnetMax, c.SubnetLen
	if v6 {
		min, max, l = c.IPv6SubnetMin, c.IPv6SubnetMax, c.IPv6SubnetLen
	}
	if !min.IsValid() {
		return 0
	}
	n := subnetIndex(min, max, l)
	if n == 1<<63 {
		return n
	}
	return n + 1
}

// SubnetAt returns the i-th node subnet counted from SubnetMin.
func (c *Config) SubnetAt(v6 bool, i uint64) netip.Prefix {
	if v6 {
		return netip.PrefixFrom(addUint(c.IPv6SubnetMin, c.IPv6SubnetLen, i), c.IPv6SubnetLen)
	}
	return netip.PrefixFrom(addUint(c.SubnetMin, c.SubnetLen, i), c.SubnetLen)
}

// Fits reports whether p is a node subnet this config can hand out: inside
// the network, of the subnet length, and between SubnetMin and SubnetMax.
func (c *Config) Fits(p netip.Prefix) bool {
	if !p.IsValid() || p != p.Masked() {
		return false
	}
	network, l, min, max := c.Network, c.SubnetLen, c.SubnetMin, c.SubnetMax
	if p.Addr().Is6() {
		network, l, min, max = c.IPv6Network, c.IPv6SubnetLen, c.IPv6SubnetMin, c.IPv6SubnetMax
	}
	return network.IsValid() && p.Bits() == l && network.Contains(p.Addr()) &&
		p.Addr().Compare(min) >= 0 && p.Addr().Compare(max) <= 0
}
