package vxlan

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/weft-net/weft/backend/kernel"
	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/vtep"
)

// Defaults, the same as Flannel's.
const (
	DefaultVNI  = 1
	DefaultPort = 8472
)

// Config describes the node's VXLAN devices. The zero value of an optional
// field means its default.
type Config struct {
	// Handle is bound to the node's network namespace. Required.
	Handle *netlink.Handle
	// NetNS is the path of the namespace Handle is bound to (for example
	// /run/netns/x), used to subscribe to its change notifications. Empty
	// means the namespace weftd runs in, which is where Handle points in
	// production; tests that pass a Handle bound elsewhere must set it.
	NetNS string

	// Name and NameV6 name the devices; default DeviceName(VNI, false/true).
	Name, NameV6 string
	// VNI is the VXLAN network identifier; 0 means DefaultVNI.
	VNI int
	// Port is the UDP destination port; 0 means DefaultPort.
	Port int
	// UnderlayIndex is the link index of the underlay device that the
	// devices send through (`dev` of ip link add). Required.
	UnderlayIndex int

	// Local and Subnet make the IPv4 device: its underlay source address
	// and the node's own IPv4 subnet (the device gets <Subnet>.0/32). Both
	// unset means no IPv4 device.
	Local  netip.Addr
	Subnet netip.Prefix
	// LocalIPv6 and IPv6Subnet likewise make the IPv6 device (<IPv6Subnet>::/128).
	LocalIPv6  netip.Addr
	IPv6Subnet netip.Prefix

	// MAC and MACv6 are the device MACs the node advertises in its lease;
	// zero means vtep.DeviceMAC(Local, VNI) (and LocalIPv6). They must be
	// stable across restarts: peers hold FDB entries for them.
	MAC, MACv6 subnet.MAC
	// MTU is the overlay MTU the node advertises (FLANNEL_MTU): the IPv4
	// device's (underlay MTU − 50). With both devices, the IPv6 one gets 20
	// bytes less for its larger outer header; an IPv6-only node's device
	// gets MTU as it is. 0 means the underlay's MTU minus the encapsulation
	// overhead of each device's family (vtep.OverlayMTU).
	MTU int

	// Network and IPv6Network are the cluster networks: a frame that comes
	// out of the device of a family with a source outside that family's
	// network is dropped (see the package documentation). An unset one is
	// not checked.
	Network, IPv6Network netip.Prefix
	// AllowForeignSources leaves the overlay's inner sources unchecked
	// (Backend.AllowForeignSources, as uvxlan's): routed setups that send
	// other sources through a node without masquerading them need it.
	AllowForeignSources bool
	// NoPeerFilter leaves the VXLAN port open to any sender and the
	// overlay's sources unchecked, as Flannel does, and removes weft's
	// filter table if one is left (weftd --vxlan-peer-filter=false).
	NoPeerFilter bool

	// DirectRouting routes peers whose public address is on-link straight
	// over the underlay, without encapsulation.
	DirectRouting bool
	// GBP turns on the VXLAN Group Based Policy extension.
	GBP bool
	// Learning lets the kernel learn FDB entries from received frames
	// (Flannel's "Learning"); weft's own entries are permanent regardless.
	Learning bool

	// KernelRelease is the running kernel's release, as uname -r gives it;
	// empty means read it with uname. On kernels before 5.7 the backend
	// turns its devices' transmit checksum offload off (see
	// offload_linux.go); tests set it to see what happens on another kernel.
	KernelRelease string

	// ResyncInterval is the period of the full resync, which re-reads the
	// whole state and repairs it even when no change notification arrived;
	// 0 means kernel.DefaultResync.
	ResyncInterval time.Duration

	// AddLink creates a device; nil means Handle.LinkAdd. A test seam: a
	// test makes creation fail as a kernel without the vxlan driver does
	// (unix.EOPNOTSUPP), which no test can arrange in a real kernel.
	AddLink func(netlink.Link) error
}

// DeviceName is the default device name: weft.<VNI>, or weft-v6.<VNI>.
func DeviceName(vni int, ipv6 bool) string {
	if ipv6 {
		return "weft-v6." + strconv.Itoa(vni)
	}
	return "weft." + strconv.Itoa(vni)
}

// withDefaults validates c and fills in its defaults.
func (c Config) withDefaults() (Config, error) {
	if c.Handle == nil {
		return c, errors.New("vxlan config: no netlink handle")
	}
	if c.UnderlayIndex <= 0 {
		return c, errors.New("vxlan config: no underlay link index")
	}
	if c.VNI == 0 {
		c.VNI = DefaultVNI
	}
	if c.VNI < 0 || c.VNI > 1<<24-1 {
		return c, fmt.Errorf("vxlan config: VNI %d out of range", c.VNI)
	}
	if c.Port == 0 {
		c.Port = DefaultPort
	}
	if c.Port < 0 || c.Port > 65535 {
		return c, fmt.Errorf("vxlan config: port %d out of range", c.Port)
	}
	if c.ResyncInterval <= 0 {
		c.ResyncInterval = kernel.DefaultResync
	}
	if c.Network.IsValid() && !c.Network.Addr().Is4() || c.IPv6Network.IsValid() && !c.IPv6Network.Addr().Is6() {
		return c, fmt.Errorf("vxlan config: cluster networks %v, %v of the wrong family", c.Network, c.IPv6Network)
	}
	c.Network, c.IPv6Network = c.Network.Masked(), c.IPv6Network.Masked()
	if c.KernelRelease == "" {
		r, err := kernelRelease()
		if err != nil {
			return c, fmt.Errorf("vxlan config: %w", err)
		}
		c.KernelRelease = r
	}
	if _, err := checksumBug(c.KernelRelease); err != nil {
		return c, fmt.Errorf("vxlan config: %w", err)
	}
	v4, v6 := c.Local.IsValid() || c.Subnet.IsValid(), c.LocalIPv6.IsValid() || c.IPv6Subnet.IsValid()
	if !v4 && !v6 {
		return c, errors.New("vxlan config: neither an IPv4 nor an IPv6 local address and subnet")
	}
	if v4 {
		if !c.Local.Is4() || !c.Subnet.Addr().Is4() {
			return c, fmt.Errorf("vxlan config: IPv4 device needs an IPv4 local address and subnet (have %v, %v)", c.Local, c.Subnet)
		}
		if c.Name == "" {
			c.Name = DeviceName(c.VNI, false)
		}
		if c.MAC.IsZero() {
			c.MAC = vtep.DeviceMAC(c.Local, c.VNI)
		}
	}
	if v6 {
		if !c.LocalIPv6.Is6() || !c.IPv6Subnet.Addr().Is6() {
			return c, fmt.Errorf("vxlan config: IPv6 device needs an IPv6 local address and subnet (have %v, %v)", c.LocalIPv6, c.IPv6Subnet)
		}
		if c.NameV6 == "" {
			c.NameV6 = DeviceName(c.VNI, true)
		}
		if c.MACv6.IsZero() {
			c.MACv6 = vtep.DeviceMAC(c.LocalIPv6, c.VNI)
		}
	}
	for _, n := range []string{c.Name, c.NameV6} {
		if len(n) > 15 {
			return c, fmt.Errorf("vxlan config: device name %q longer than 15 bytes", n)
		}
	}
	return c, nil
}

// specs returns the device of each configured family.
func (c Config) specs() []deviceSpec {
	var out []deviceSpec
	mtu6 := c.MTU
	if mtu6 != 0 && c.Local.IsValid() {
		mtu6 -= vtep.OverheadIPv6 - vtep.OverheadIPv4
	}
	if c.Local.IsValid() {
		out = append(out, deviceSpec{
			name: c.Name, family: netlink.FAMILY_V4, vni: c.VNI, port: c.Port, underlay: c.UnderlayIndex,
			local: c.Local, addr: netip.PrefixFrom(c.Subnet.Masked().Addr(), 32), mac: c.MAC, mtu: c.MTU,
			gbp: c.GBP, learning: c.Learning, add: c.AddLink,
		})
	}
	if c.LocalIPv6.IsValid() {
		out = append(out, deviceSpec{
			name: c.NameV6, family: netlink.FAMILY_V6, vni: c.VNI, port: c.Port, underlay: c.UnderlayIndex,
			local: c.LocalIPv6, addr: netip.PrefixFrom(c.IPv6Subnet.Masked().Addr(), 128), mac: c.MACv6, mtu: mtu6,
			gbp: c.GBP, learning: c.Learning, add: c.AddLink,
		})
	}
	return out
}
