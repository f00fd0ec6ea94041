package plugin

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/weft-net/weft/subnet"
)

// Defaults of the configuration keys.
const (
	DefaultDataDir = "/var/lib/cni/weft"
	// DefaultIPAMDataDir is host-local's default dataDir: the address
	// store of network <name> is DefaultIPAMDataDir/<name>.
	DefaultIPAMDataDir = "/var/lib/cni/networks"
	DefaultBridge      = "cni0"
)

// Config is the plugin's network configuration (the conflist entry of
// "type": "weft"). Key names follow Flannel's plugin where they overlap.
type Config struct {
	types.PluginConf
	SubnetFile string `json:"subnetFile"`
	// DataDir is where releases before the shared address store kept it
	// (DataDir/ipam/<network>); the plugin moves what it finds there into
	// the store (migrate) and keeps nothing else in it.
	DataDir     string `json:"dataDir"`
	Bridge      string `json:"bridge"`
	MTU         int    `json:"mtu"`
	HairpinMode *bool  `json:"hairpinMode"` // default true, as kube-flannel's conflist sets it
	// Delegate is Flannel's plugin configuration of the bridge it delegates
	// to ({"type":"flannel","delegate":{"hairpinMode":true,...}}): weft,
	// installed as "flannel", reads it from Flannel's conflist and wires the
	// pod itself. Its keys apply where weft's own are not set.
	Delegate *Delegate `json:"delegate"`
	// IPAM is the "ipam" section, read as host-local reads it: the address
	// store is host-local's, IPAM.DataDir/<network name>. Flannel's plugin
	// hands this section (of its own entry) to host-local, so for
	// Flannel's conflist weft and host-local use the same directory.
	IPAM IPAM `json:"ipam"`
}

// IPAM is the part of an "ipam" section weft understands.
type IPAM struct {
	Type    string `json:"type"`    // only "host-local" (Flannel's default)
	DataDir string `json:"dataDir"` // default DefaultIPAMDataDir
	// unknown lists the keys weft does not read (ranges, routes, …),
	// refused by ParseConfig.
	unknown []string
}

// UnmarshalJSON decodes type and dataDir as host-local does (encoding/json,
// keys matched case-insensitively) and records the other keys.
func (i *IPAM) UnmarshalJSON(b []byte) error {
	var known struct {
		Type    string `json:"type"`
		DataDir string `json:"dataDir"`
	}
	if err := json.Unmarshal(b, &known); err != nil {
		return err
	}
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(b, &keys); err != nil {
		return err
	}
	*i = IPAM{Type: known.Type, DataDir: known.DataDir}
	for k := range keys {
		if !strings.EqualFold(k, "type") && !strings.EqualFold(k, "dataDir") {
			i.unknown = append(i.unknown, k)
		}
	}
	slices.Sort(i.unknown)
	return nil
}

// Delegate is the part of Flannel's "delegate" object weft understands.
type Delegate struct {
	Type             string `json:"type"` // only "bridge" (Flannel's default)
	Bridge           string `json:"bridge"`
	MTU              int    `json:"mtu"`
	HairpinMode      *bool  `json:"hairpinMode"`
	IsDefaultGateway *bool  `json:"isDefaultGateway"`
	// IPAM is refused, as Flannel's plugin refuses it: Flannel writes the
	// delegate's ipam section itself, from its own entry's.
	IPAM json.RawMessage `json:"ipam"`
}

// fold applies Flannel's delegate keys where weft's are unset, and refuses
// what weft's wiring cannot do.
func (c *Config) fold() error {
	d := c.Delegate
	if d == nil {
		return nil
	}
	if d.Type != "" && d.Type != "bridge" {
		return fmt.Errorf("delegate type %q: weft wires pods to its bridge itself and cannot delegate to another plugin", d.Type)
	}
	if d.IsDefaultGateway != nil && !*d.IsDefaultGateway {
		return errors.New("delegate isDefaultGateway false: weft always makes the bridge the pods' default gateway")
	}
	if d.IPAM != nil {
		return errors.New("delegate ipam: Flannel's plugin refuses it too (it writes the delegate's ipam from the ipam section of its own entry); set ipam.dataDir in the flannel entry instead")
	}
	if c.Bridge == "" {
		c.Bridge = d.Bridge
	}
	if c.MTU == 0 {
		c.MTU = d.MTU
	}
	if c.HairpinMode == nil {
		c.HairpinMode = d.HairpinMode
	}
	return nil
}

// hairpin reports whether a pod may reach itself through a service
// address (the bridge port sends frames back out where they came from).
func (c *Config) hairpin() bool { return c.HairpinMode == nil || *c.HairpinMode }

// ParseConfig decodes and validates stdin data, filling defaults. Errors
// are *types.Error with code 6 (not JSON), 2 (unsupported field) or 7.
func ParseConfig(data []byte) (*Config, error) {
	c := &Config{}
	if err := json.Unmarshal(data, c); err != nil {
		var syn *json.SyntaxError
		if errors.As(err, &syn) {
			return nil, types.NewError(types.ErrDecodingFailure, "decode network config: "+err.Error(), "")
		}
		return nil, types.NewError(types.ErrInvalidNetworkConfig, "decode network config: "+err.Error(),
			"check the types of the weft keys: subnetFile, dataDir, bridge, ipam.dataDir (strings), mtu (number), hairpinMode (bool)")
	}
	if err := c.fold(); err != nil {
		return nil, types.NewError(types.ErrUnsupportedField, "network config: "+err.Error(), "")
	}
	if c.SubnetFile == "" {
		c.SubnetFile = subnet.DefaultSubnetFile
	}
	if c.DataDir == "" {
		c.DataDir = DefaultDataDir
	}
	if c.Bridge == "" {
		c.Bridge = DefaultBridge
	}
	if c.IPAM.DataDir == "" {
		c.IPAM.DataDir = DefaultIPAMDataDir
	}
	if t := c.IPAM.Type; t != "" && t != "host-local" {
		return nil, types.NewError(types.ErrUnsupportedField,
			fmt.Sprintf("network config: ipam type %q is not supported", t),
			"weft allocates pod addresses from the subnet file in host-local's store; use type host-local or no ipam section")
	}
	if len(c.IPAM.unknown) > 0 {
		return nil, types.NewError(types.ErrUnsupportedField,
			fmt.Sprintf("network config: ipam keys %s are not supported", strings.Join(c.IPAM.unknown, ", ")),
			"weft allocates pod addresses from the subnet file and reads only ipam.type (host-local) and ipam.dataDir")
	}
	if err := c.validate(); err != nil {
		return nil, types.NewError(types.ErrInvalidNetworkConfig, "network config: "+err.Error(), "")
	}
	return c, nil
}

func (c *Config) validate() error {
	switch {
	case !filepath.IsAbs(c.SubnetFile):
		return fmt.Errorf("subnetFile %q must be an absolute path", c.SubnetFile)
	case !filepath.IsAbs(c.DataDir):
		return fmt.Errorf("dataDir %q must be an absolute path", c.DataDir)
	case !filepath.IsAbs(c.IPAM.DataDir):
		return fmt.Errorf("ipam dataDir %q must be an absolute path", c.IPAM.DataDir)
	case c.Name == "" || c.Name == "." || c.Name == ".." || strings.ContainsAny(c.Name, "/\x00"):
		return fmt.Errorf("network name %q cannot name a directory of the address store", c.Name)
	case c.MTU != 0 && (c.MTU < 68 || c.MTU > 65535):
		return fmt.Errorf("mtu %d is outside 68..65535 (0 means the subnet file's FLANNEL_MTU)", c.MTU)
	}
	return validLinkName(c.Bridge)
}

func validLinkName(name string) error {
	if len(name) > 15 || name == "." || name == ".." || strings.ContainsAny(name, "/: \t\n") {
		return fmt.Errorf("bridge %q is not a valid interface name (at most 15 characters, no '/', ':' or spaces)", name)
	}
	return nil
}

// storeDir is the address store of this network, where host-local keeps
// it for the same configuration: <ipam.dataDir>/<network name>.
func (c *Config) storeDir() string { return filepath.Join(c.IPAM.DataDir, c.Name) }

// oldStoreDir is where releases before the shared store kept it.
func (c *Config) oldStoreDir() string { return filepath.Join(c.DataDir, "ipam", c.Name) }
