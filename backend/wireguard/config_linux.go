package wireguard

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/weft-net/weft/subnet"
)

// Config describes the node's WireGuard devices. The zero value of an
// optional field means its default.
type Config struct {
	// Handle is bound to the node's network namespace. Required.
	Handle *netlink.Handle
	// NetNS is the path of that namespace, for change notifications ("":
	// the one weftd runs in).
	NetNS string

	PrivateKey wgtypes.Key  // required
	PSK        *wgtypes.Key // optional preshared key for every peer
	Keepalive  int          // PersistentKeepaliveInterval, seconds; 0: off
	Mode       string       // subnet.WireGuardSeparate (default), Auto, IPv4 or IPv6
	// ListenPort and ListenPortV6 are the UDP ports (defaults 51820, 51821).
	ListenPort, ListenPortV6 int
	// MTU is the devices' MTU (the underlay's minus Overhead). Required.
	MTU int

	// Subnet and IPv6Subnet are this node's subnets (an invalid one: that
	// family is off); Network and IPv6Network the cluster networks routed
	// through the devices.
	Subnet, IPv6Subnet   netip.Prefix
	Network, IPv6Network netip.Prefix
	// Local and LocalIPv6 are this node's public addresses (auto mode).
	Local, LocalIPv6 netip.Addr

	// Kernel forces the kernel devices (true) or the in-process ones
	// (false); nil picks the kernel's when it has WireGuard.
	Kernel *bool
	// ResyncInterval is the period of the full resync, the only repair of
	// peers changed behind the backend's back (WireGuard's configuration
	// raises no notification); 0 means DefaultResync.
	ResyncInterval time.Duration
}

// DefaultResync is the WireGuard backends' full resync period. It is
// shorter than the other backends' (kernel.DefaultResync): a peer changed
// or removed with `wg set` raises no notification, so this sync is what
// puts it back, and reading the peers is cheap.
const DefaultResync = 10 * time.Second

// FromBackend fills the cluster-wide settings of c from the network
// config's Backend object.
func (c *Config) FromBackend(b subnet.BackendConfig) error {
	c.Mode, c.ListenPort, c.ListenPortV6, c.Keepalive = b.Mode, b.ListenPort, b.ListenPortV6, b.PersistentKeepaliveInterval
	if b.PSK != "" {
		k, err := wgtypes.ParseKey(b.PSK)
		if err != nil {
			return fmt.Errorf("wireguard PSK: %w", err)
		}
		c.PSK = &k
	}
	return nil
}

func (c Config) withDefaults() (Config, error) {
	if c.Handle == nil {
		return c, errors.New("wireguard config: no netlink handle")
	}
	if c.PrivateKey == (wgtypes.Key{}) {
		return c, errors.New("wireguard config: no private key")
	}
	if c.MTU < 576 {
		return c, fmt.Errorf("wireguard config: MTU %d too small", c.MTU)
	}
	if !c.Subnet.IsValid() && !c.IPv6Subnet.IsValid() {
		return c, errors.New("wireguard config: no subnet")
	}
	if c.Mode == "" {
		c.Mode = subnet.WireGuardSeparate
	}
	if c.ListenPort == 0 {
		c.ListenPort = subnet.DefaultWireGuardPort
	}
	if c.ListenPortV6 == 0 {
		c.ListenPortV6 = subnet.DefaultWireGuardPortV6
	}
	if c.ResyncInterval <= 0 {
		c.ResyncInterval = DefaultResync
	}
	return c, nil
}

// LeaseData is what a node with this configuration advertises in its lease
// for each enabled family: its public key and the port its peers must send
// to (the IPv6 device's in separate mode, else the one device's).
func LeaseData(publicKey wgtypes.Key, b subnet.BackendConfig) (v4, v6 subnet.WireGuardData) {
	v4 = subnet.WireGuardData{PublicKey: publicKey.String(), Port: uint16(b.ListenPort)}
	v6 = subnet.WireGuardData{PublicKey: publicKey.String(), Port: uint16(b.ListenPortV6)}
	if b.Mode != subnet.WireGuardSeparate {
		v6.Port = uint16(b.ListenPort)
	}
	return v4, v6
}
