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
	// DefaultFlannelDataDir is Flannel's plugin's dataDir: as "flannel",
	// weft writes there the state file Flannel's DEL reads.
	DefaultFlannelDataDir = "/var/lib/cni/flannel"
	// DefaultIPAMDataDir is host-local's default dataDir: the address
	// store of network <name> is DefaultIPAMDataDir/<name>.
	DefaultIPAMDataDir = "/var/lib/cni/networks"
	DefaultBridge      = "cni0"
)

// Config is the plugin's network configuration (the conflist entry of
// "type": "weft", or of "type": "flannel" when weft is installed as
// Flannel's plugin). Key names follow Flannel's plugin where they overlap.
type Config struct {
	types.PluginConf
	SubnetFile string `json:"subnetFile"`
	// DataDir, as "flannel", is Flannel's plugin's state directory
	// (default DefaultFlannelDataDir): ADD writes <dataDir>/<containerID>
	// as Flannel does, so that Flannel's DEL after a rollback frees the
	// pod. As "weft" it is accepted and unused.
	DataDir     string `json:"dataDir"`
	Bridge      string `json:"bridge"`
	MTU         int    `json:"mtu"`
	HairpinMode *bool  `json:"hairpinMode"`
	// Delegate is Flannel's plugin configuration of the bridge it delegates
	// to ({"type":"flannel","delegate":{"hairpinMode":true,...}}): weft,
	// installed as "flannel", reads it from Flannel's conflist and wires the
	// pod itself. Its keys apply where weft's own are not set.
	Delegate *Delegate `json:"delegate"`
	// IPAM is the "ipam" section, read as host-local reads it: the address
	// store is host-local's, IPAM.DataDir/<network name>. Flannel's plugin
	// hands this section (of its own entry) to host-local, so for
	// Flannel's conflist weft and host-local use the same directory.
	IPAM          IPAM           `json:"ipam"`
	RuntimeConfig *RuntimeConfig `json:"runtimeConfig"`
	Args          *Args          `json:"args"`
}

// IPAM is the part of an "ipam" section weft understands: host-local's
// keys that Flannel's plugin passes on.
type IPAM struct {
	Type       string         `json:"type"`    // only "host-local" (Flannel's default)
	DataDir    string         `json:"dataDir"` // default DefaultIPAMDataDir
	Routes     []*types.Route `json:"routes"`  // more routes in the pod
	ResolvConf string         `json:"resolvConf"`
	// refused lists the keys weft does not implement, refused by
	// ParseConfig with why.
	refused []string
}

// ipamRefused are host-local's keys that Flannel's plugin passes on and
// weft refuses, with why.
var ipamRefused = map[string]string{
	"ranges":     "Flannel's plugin replaces it with the node subnet of the subnet file",
	"subnet":     "host-local would add it as another range beside the node subnet",
	"rangeStart": "host-local would add a range of it beside the node subnet",
	"rangeEnd":   "host-local would add a range of it beside the node subnet",
	"gateway":    "host-local would add a range of it beside the node subnet",
}

// UnmarshalJSON decodes the keys as host-local does (encoding/json, keys
// matched case-insensitively) and records the others.
func (i *IPAM) UnmarshalJSON(b []byte) error {
	type plain IPAM
	var p plain
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	var err error
	if p.refused, err = otherKeys(b, "type", "dataDir", "routes", "resolvConf"); err != nil {
		return err
	}
	*i = IPAM(p)
	return nil
}

// check refuses the ipam keys weft does not implement, naming each.
func (i *IPAM) check() error {
	if t := i.Type; t != "" && t != "host-local" {
		return fmt.Errorf("ipam type %q is not supported: weft allocates pod addresses from the subnet file in host-local's store; use type host-local or no type", t)
	}
	for _, k := range i.refused {
		why := "not a host-local key weft implements"
		for rk, w := range ipamRefused {
			if strings.EqualFold(rk, k) {
				why = w
			}
		}
		return fmt.Errorf("ipam %s: %s; remove it", k, why)
	}
	for _, r := range i.Routes {
		switch {
		case r == nil || r.Dst.IP == nil:
			return errors.New("ipam routes: a route without dst")
		case r.MTU != 0, r.AdvMSS != 0:
			return fmt.Errorf("ipam routes %s: mtu and advmss are not supported (the bridge plugin ignores them too); remove them", r.Dst.String())
		case r.Table != nil, r.Scope != nil:
			return fmt.Errorf("ipam routes %s: table and scope are not supported; remove them", r.Dst.String())
		}
	}
	return nil
}

// asFlannel reports whether weft runs as Flannel's plugin ("type":
// "flannel"): Flannel's and the bridge plugin's defaults apply then.
func (c *Config) asFlannel() bool { return c.Type == "flannel" }

// fold applies Flannel's delegate keys where weft's are unset, and refuses
// what weft's wiring cannot do.
func (c *Config) fold() error {
	if err := c.IPAM.check(); err != nil {
		return err
	}
	if rc := c.runtimeConfig(); rc != nil && len(rc.unknown) > 0 {
		return fmt.Errorf("runtimeConfig %s: weft serves only the ips and mac capabilities; remove the others from this entry's capabilities",
			strings.Join(rc.unknown, ", "))
	}
	d := c.Delegate
	if d == nil {
		return nil
	}
	if err := d.check(); err != nil {
		return err
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
// address (the bridge port sends frames back out where they came from):
// by default yes for "weft", no as "flannel" (the bridge plugin's default,
// which Flannel does not change; kube-flannel's conflist sets it).
func (c *Config) hairpin() bool {
	if c.HairpinMode != nil {
		return *c.HairpinMode
	}
	return !c.asFlannel()
}

// delegateBool is the delegate's key, or def when unset.
func (c *Config) delegateBool(get func(*Delegate) *bool, def bool) bool {
	if c.Delegate != nil {
		if v := get(c.Delegate); v != nil {
			return *v
		}
	}
	return def
}

// defaultGateway reports whether pods get a default route via the bridge:
// delegate isDefaultGateway, by default yes for "weft", no as "flannel"
// (the bridge plugin's default).
func (c *Config) defaultGateway() bool {
	return c.delegateBool(func(d *Delegate) *bool { return d.IsDefaultGateway }, !c.asFlannel())
}

// gateway reports whether the bridge holds the gateway addresses: delegate
// isGateway (default true, as Flannel sets it), forced by isDefaultGateway.
func (c *Config) gateway() bool {
	return c.defaultGateway() || c.delegateBool(func(d *Delegate) *bool { return d.IsGateway }, true)
}

// masquerade reports whether the plugin masquerades pod traffic leaving
// the cluster: delegate ipMasq, by default when the daemon does not.
func (c *Config) masquerade(daemonMasq bool) bool {
	return c.delegateBool(func(d *Delegate) *bool { return d.IPMasq }, !daemonMasq)
}

// forceAddress is the delegate's forceAddress, nil when unset.
func (c *Config) forceAddress() *bool {
	if c.Delegate != nil {
		return c.Delegate.ForceAddress
	}
	return nil
}

// promisc reports whether the bridge is put in promiscuous mode.
func (c *Config) promisc() bool { return c.Delegate != nil && c.Delegate.PromiscMode }

// dns is the result's DNS: weft's dns key, else the delegate's (the
// bridge plugin's), else none (ipam resolvConf is read at ADD).
func (c *Config) dns() types.DNS {
	if c.DNS.Nameservers != nil || c.DNS.Search != nil || c.DNS.Options != nil || c.DNS.Domain != "" {
		return c.DNS
	}
	if c.Delegate != nil {
		return c.Delegate.DNS
	}
	return types.DNS{}
}

// ParseConfig decodes and validates stdin data, filling defaults. Errors
// are *types.Error with code 6 (not JSON), 2 (unsupported field) or 7.
func ParseConfig(data []byte) (*Config, error) { return parseConfig(data, false) }

// ParseConfigForDel is ParseConfig for DEL and GC: keys weft refuses are
// let pass.
// A refused key that was added to the network config while pods ran must
// not keep those pods' addresses and interfaces from being released, and
// DEL reads none of them (only the network name, the stores' directories
// and the type).
func ParseConfigForDel(data []byte) (*Config, error) { return parseConfig(data, true) }

func parseConfig(data []byte, forDel bool) (*Config, error) {
	c := &Config{}
	if err := json.Unmarshal(data, c); err != nil {
		var syn *json.SyntaxError
		if errors.As(err, &syn) {
			return nil, types.NewError(types.ErrDecodingFailure, "decode network config: "+err.Error(), "")
		}
		return nil, types.NewError(types.ErrInvalidNetworkConfig, "decode network config: "+err.Error(),
			"check the types of the weft keys: subnetFile, dataDir, bridge, ipam.dataDir (strings), mtu (number), hairpinMode (bool)")
	}
	if err := c.fold(); err != nil && !forDel {
		return nil, types.NewError(types.ErrUnsupportedField, "network config: "+err.Error(), "")
	}
	if c.SubnetFile == "" {
		c.SubnetFile = subnet.DefaultSubnetFile
	}
	if c.Bridge == "" {
		c.Bridge = DefaultBridge
	}
	if c.IPAM.DataDir == "" {
		c.IPAM.DataDir = DefaultIPAMDataDir
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
	case c.DataDir != "" && !filepath.IsAbs(c.DataDir):
		return fmt.Errorf("dataDir %q must be an absolute path", c.DataDir)
	case !filepath.IsAbs(c.IPAM.DataDir):
		return fmt.Errorf("ipam dataDir %q must be an absolute path", c.IPAM.DataDir)
	case c.Name == "" || c.Name == "." || c.Name == ".." || strings.ContainsAny(c.Name, "/\x00"):
		return fmt.Errorf("network name %q cannot name a directory of the address store", c.Name)
	case c.MTU != 0 && (c.MTU < 68 || c.MTU > 65535):
		return fmt.Errorf("mtu %d is outside 68..65535 (0 means the subnet file's FLANNEL_MTU)", c.MTU)
	case c.hairpin() && c.promisc():
		return errors.New("delegate hairpinMode and promiscMode are both true: the bridge plugin refuses that too; set one")
	case c.IPAM.ResolvConf != "" && !filepath.IsAbs(c.IPAM.ResolvConf):
		return fmt.Errorf("ipam resolvConf %q must be an absolute path", c.IPAM.ResolvConf)
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

// stateDir is where weft, as "flannel", writes the state file Flannel's
// DEL reads (<stateDir>/<containerID>); "" for "weft", which writes none.
func (c *Config) stateDir() string {
	switch {
	case !c.asFlannel():
		return ""
	case c.DataDir != "":
		return c.DataDir
	}
	return DefaultFlannelDataDir
}
