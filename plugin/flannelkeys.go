package plugin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
)

// The keys of Flannel's "delegate" object (the bridge plugin's
// configuration, containernetworking/plugins v1.10.0) and of the
// conventions host-local and bridge read (runtimeConfig ips and mac,
// args.cni ips and mac, CNI_ARGS IP and MAC). Each is either honoured or
// refused with an error naming it; plugin/README.md has the table.

// Delegate is Flannel's "delegate" object: the bridge plugin's
// configuration, which weft, installed as "flannel", reads and wires
// itself.
type Delegate struct {
	Type             string          `json:"type"` // only "bridge" (Flannel's default)
	CNIVersion       string          `json:"cniVersion"`
	Bridge           string          `json:"bridge"`
	MTU              int             `json:"mtu"`
	HairpinMode      *bool           `json:"hairpinMode"`
	PromiscMode      bool            `json:"promiscMode"`
	IsGateway        *bool           `json:"isGateway"`
	IsDefaultGateway *bool           `json:"isDefaultGateway"`
	ForceAddress     *bool           `json:"forceAddress"`
	IPMasq           *bool           `json:"ipMasq"`
	IPMasqBackend    string          `json:"ipMasqBackend"`
	DNS              types.DNS       `json:"dns"`
	Args             *Args           `json:"args"`
	RuntimeConfig    *RuntimeConfig  `json:"runtimeConfig"`
	IPAM             json.RawMessage `json:"ipam"` // refused, as Flannel refuses it
	Name             json.RawMessage `json:"name"` // refused, as Flannel refuses it

	keys map[string]json.RawMessage
}

// UnmarshalJSON decodes the keys as the bridge plugin does (encoding/json,
// matched case-insensitively) and keeps them all for check.
func (d *Delegate) UnmarshalJSON(b []byte) error {
	type plain Delegate
	var p plain
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	if err := json.Unmarshal(b, &p.keys); err != nil {
		return err
	}
	*d = Delegate(p)
	return nil
}

// delegateKeys are the keys of Delegate; delegateZeroKeys are the bridge
// plugin's keys weft does not implement, accepted only with their default
// (zero) value, which is what weft does.
var (
	delegateKeys = []string{"type", "cniVersion", "bridge", "mtu", "hairpinMode", "promiscMode", "isGateway",
		"isDefaultGateway", "forceAddress", "ipMasq", "ipMasqBackend", "dns", "args", "runtimeConfig"}
	delegateZeroKeys = []string{"vlan", "vlanTrunk", "preserveDefaultVlan", "macspoofchk", "enabledad",
		"disableContainerInterface", "portIsolation"}
)

// check refuses what weft's wiring cannot do: errors name the key.
func (d *Delegate) check() error {
	switch {
	case d.Type != "" && d.Type != "bridge":
		return fmt.Errorf("delegate type %q: weft wires pods to its bridge itself and cannot delegate to another plugin", d.Type)
	case d.IPAM != nil:
		return errors.New("delegate ipam: Flannel's plugin refuses it too (it writes the delegate's ipam from the ipam section of its own entry); set ipam keys in the flannel entry instead")
	case d.Name != nil:
		return errors.New("delegate name: Flannel's plugin refuses it too (the delegate gets the network's name)")
	case d.IPMasqBackend != "" && d.IPMasqBackend != "nftables":
		return fmt.Errorf("delegate ipMasqBackend %q: weft masquerades with nftables only (\"nftables\" or unset)", d.IPMasqBackend)
	}
	for k, v := range d.keys {
		switch {
		case containsFold(delegateKeys, k):
		case containsFold(delegateZeroKeys, k):
			if !isZeroJSON(v) {
				return fmt.Errorf("delegate %s %s: weft's bridge wiring does not implement it (only its default, which is weft's behaviour)", k, v)
			}
		default:
			return fmt.Errorf("delegate key %q: not a key of the bridge plugin that weft knows; remove it", k)
		}
	}
	return nil
}

// RuntimeConfig is the "runtimeConfig" object a runtime passes for the
// capabilities the conflist entry declares: "ips" (host-local) and "mac"
// (bridge). Other capabilities are refused: weft would not use them.
type RuntimeConfig struct {
	IPs []string `json:"ips"`
	MAC string   `json:"mac"`

	unknown []string
}

// UnmarshalJSON decodes ips and mac and records other keys.
func (r *RuntimeConfig) UnmarshalJSON(b []byte) error {
	type plain RuntimeConfig
	var p plain
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	var err error
	if p.unknown, err = otherKeys(b, "ips", "mac"); err != nil {
		return err
	}
	*r = RuntimeConfig(p)
	return nil
}

// Args is the "args" object of the CNI conventions: args.cni.ips
// (host-local) and args.cni.mac (bridge) are read; other args are
// ignored, as the conventions ask of plugins that do not know them.
type Args struct {
	CNI struct {
		IPs []string `json:"ips"`
		MAC string   `json:"mac"`
	} `json:"cni"`
}

// request is what the runtime asks of one attachment: static addresses
// (at most one per range) and the pod interface's MAC.
type request struct {
	ips []netip.Addr
	mac net.HardwareAddr
}

// parseRequest collects the requested addresses and MAC as host-local and
// bridge do: CNI_ARGS IP and MAC, then args.cni, then runtimeConfig (a
// later MAC wins; every address is requested). envArgs is CNI_ARGS.
func (c *Config) parseRequest(envArgs string) (request, error) {
	var r request
	var ips []string
	var mac string
	for _, kv := range strings.Split(envArgs, ";") {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "IP":
			ips = append(ips, strings.Split(v, ",")...)
		case "MAC":
			mac = v
		}
	}
	for _, a := range []*Args{c.delegateArgs(), c.Args} {
		if a != nil {
			ips = append(ips, a.CNI.IPs...)
			if a.CNI.MAC != "" {
				mac = a.CNI.MAC
			}
		}
	}
	if rc := c.runtimeConfig(); rc != nil {
		ips = append(ips, rc.IPs...)
		if rc.MAC != "" {
			mac = rc.MAC
		}
	}
	for _, s := range ips {
		a, err := netip.ParseAddr(s)
		if p, perr := netip.ParsePrefix(s); err != nil && perr == nil {
			a, err = p.Addr(), nil
		}
		if err != nil {
			return r, fmt.Errorf("requested ip %q (CNI_ARGS IP, args.cni.ips or runtimeConfig ips): not an address", s)
		}
		if !slices.Contains(r.ips, a.Unmap()) {
			r.ips = append(r.ips, a.Unmap())
		}
	}
	if mac != "" {
		hw, err := net.ParseMAC(mac)
		if err != nil || len(hw) != 6 || hw[0]&1 != 0 {
			return r, fmt.Errorf("requested mac %q (CNI_ARGS MAC, args.cni.mac or runtimeConfig mac): not a unicast Ethernet address", mac)
		}
		r.mac = hw
	}
	return r, nil
}

// runtimeConfig is the entry's runtimeConfig, or else the delegate's (Flannel
// replaces the delegate's with the entry's when the runtime passes one).
func (c *Config) runtimeConfig() *RuntimeConfig {
	if c.RuntimeConfig != nil {
		return c.RuntimeConfig
	}
	if c.Delegate != nil {
		return c.Delegate.RuntimeConfig
	}
	return nil
}

func (c *Config) delegateArgs() *Args {
	if c.Delegate != nil {
		return c.Delegate.Args
	}
	return nil
}

// otherKeys returns, sorted, the keys of the JSON object b that are not
// among known (matched case-insensitively, as encoding/json matches them).
func otherKeys(b []byte, known ...string) ([]string, error) {
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(b, &keys); err != nil {
		return nil, err
	}
	var out []string
	for k := range keys {
		if !containsFold(known, k) {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out, nil
}

func containsFold(keys []string, k string) bool {
	return slices.ContainsFunc(keys, func(s string) bool { return strings.EqualFold(s, k) })
}

// isZeroJSON reports whether v is a JSON zero value: 0, false, null, "",
// [] or {}.
func isZeroJSON(v json.RawMessage) bool {
	switch string(bytes.TrimSpace(v)) {
	case "0", "false", "null", `""`, "[]", "{}":
		return true
	}
	return false
}
