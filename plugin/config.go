package plugin

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/weft-net/weft/subnet"
)

// Defaults of the configuration keys.
const (
	DefaultDataDir = "/var/lib/cni/weft"
	DefaultBridge  = "cni0"
)

// Config is the plugin's network configuration (the conflist entry of
// "type": "weft"). Key names follow Flannel's plugin where they overlap.
type Config struct {
	types.PluginConf
	SubnetFile  string `json:"subnetFile"`
	DataDir     string `json:"dataDir"`
	Bridge      string `json:"bridge"`
	MTU         int    `json:"mtu"`
	HairpinMode *bool  `json:"hairpinMode"` // default true, as kube-flannel's conflist sets it
	// Delegate is Flannel's plugin configuration of the bridge it delegates
	// to ({"type":"flannel","delegate":{"hairpinMode":true,...}}): weft,
	// installed as "flannel", reads it from Flannel's conflist and wires the
	// pod itself. Its keys apply where weft's own are not set.
	Delegate *Delegate `json:"delegate"`
}

// Delegate is the part of Flannel's "delegate" object weft understands.
type Delegate struct {
	Type             string `json:"type"` // only "bridge" (Flannel's default)
	Bridge           string `json:"bridge"`
	MTU              int    `json:"mtu"`
	HairpinMode      *bool  `json:"hairpinMode"`
	IsDefaultGateway *bool  `json:"isDefaultGateway"`
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
			"check the types of the weft keys: subnetFile, dataDir, bridge (strings), mtu (number), hairpinMode (bool)")
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
	if c.IPAM.Type != "" {
		return nil, types.NewError(types.ErrUnsupportedField,
			fmt.Sprintf("network config: ipam type %q is not supported", c.IPAM.Type),
			"weft allocates pod addresses from the subnet file itself; remove the ipam section")
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

// ipamDir is where the address store of this network lives.
func (c *Config) ipamDir() string { return filepath.Join(c.DataDir, "ipam", c.Name) }
