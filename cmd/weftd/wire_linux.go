package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"

	"github.com/vishvananda/netlink"

	"github.com/weft-net/weft/backend"
	"github.com/weft-net/weft/backend/masq"
	"github.com/weft-net/weft/backend/uvxlan"
	"github.com/weft-net/weft/backend/vxlan"
	"github.com/weft-net/weft/internal/daemon"
	"github.com/weft-net/weft/subnet"
)

// underlayInfo is what weftd needs to know of the underlay device.
type underlayInfo struct {
	index      int
	name       string
	mtu        int
	ipv4, ipv6 netip.Addr
}

func findUnderlay(iface, regex string) (underlayInfo, error) {
	h, err := netlink.NewHandle()
	if err != nil {
		return underlayInfo{}, fmt.Errorf("netlink: %w", err)
	}
	defer h.Close()
	u, err := backend.FindUnderlay(h, backend.UnderlayQuery{Iface: iface, Regex: regex})
	if err != nil {
		return underlayInfo{}, err
	}
	return underlayInfo{index: u.Index, name: u.Name, mtu: u.MTU, ipv4: u.IPv4, ipv6: u.IPv6}, nil
}

// factories wires the dataplanes and the masquerade rules into the daemon.
func factories(c *config, u underlayInfo, live *liveBackend, log *slog.Logger) daemon.Factories {
	f := daemon.Factories{
		Dataplane: func(typ string, cfg *subnet.Config, lease subnet.Lease, mtu int) (daemon.Dataplane, error) {
			if lease.IPv6Subnet.IsValid() {
				if err := enableForwarding(forwardIPv6, log); err != nil {
					return daemon.Dataplane{}, err
				}
			}
			dp, err := newDataplane(typ, cfg, lease, mtu, u, log)
			if err == nil {
				live.set(dp.Backend)
			}
			return dp, err
		},
	}
	if c.ipMasq {
		f.Masquerade = func(cfg *subnet.Config) (daemon.Runner, error) {
			return masq.New(masq.Config{Network: cfg.Network, IPv6Network: cfg.IPv6Network}, log)
		}
	} else if err := masq.Remove(""); err != nil {
		log.Warn("cannot remove masquerade rules left from an earlier run", "err", err)
	}
	return f
}

// uvxlanV6Name names the TAP of a dual-stack node's IPv6 uvxlan half.
func uvxlanV6Name(vni int) string { return fmt.Sprintf("weft-u6.%d", vni) }

// newUVXLAN builds the userspace dataplane: one backend per address family
// (a TAP each), joined when the node is dual-stack. Each opens (and closes)
// its own netlink handle.
func newUVXLAN(cfg *subnet.Config, lease subnet.Lease, mtu int, u underlayInfo, log *slog.Logger) (backend.Backend, error) {
	base := uvxlan.Config{VNI: cfg.Backend.VNI, Port: cfg.Backend.Port, MTU: mtu,
		AllowForeignSources: cfg.Backend.AllowForeignSources}
	var parts []backend.Backend
	if lease.Subnet.IsValid() {
		c := base
		c.Local, c.Subnet = u.ipv4, lease.Subnet
		if d := lease.Attrs.BackendData; d != nil {
			c.MAC = d.VtepMAC // else derived from the address
		}
		b, err := uvxlan.New(c, log)
		if err != nil {
			return nil, err
		}
		parts = append(parts, b)
	}
	if lease.IPv6Subnet.IsValid() {
		c := base
		c.Local, c.IPv6Subnet = u.ipv6, lease.IPv6Subnet
		if d := lease.Attrs.BackendV6Data; d != nil {
			c.MAC = d.VtepMAC
		}
		if len(parts) > 0 {
			c.Name = uvxlanV6Name(c.VNI)
			c.MTU = mtu - (backend.OverheadIPv6 - backend.OverheadIPv4)
		}
		b, err := uvxlan.New(c, log)
		if err != nil {
			return nil, err
		}
		parts = append(parts, b)
	}
	switch len(parts) {
	case 0:
		return nil, errors.New("uvxlan: the lease has no subnet")
	case 1:
		return parts[0], nil
	}
	return backend.Join(parts...), nil
}

// removeUVXLAN removes the userspace dataplane's TAPs.
func removeUVXLAN(h *netlink.Handle, vni int) error {
	return errors.Join(uvxlan.RemoveDevice(h, vni), uvxlan.RemoveDeviceNamed(h, uvxlanV6Name(vni)))
}

func newDataplane(typ string, cfg *subnet.Config, lease subnet.Lease, mtu int, u underlayInfo, log *slog.Logger) (daemon.Dataplane, error) {
	h, err := netlink.NewHandle()
	if err != nil {
		return daemon.Dataplane{}, fmt.Errorf("netlink: %w", err)
	}
	dp, err := buildDataplane(h, typ, cfg, lease, mtu, u, log)
	if err != nil {
		h.Close()
		return daemon.Dataplane{}, err
	}
	dp.Close = h.Close
	return dp, nil
}

func buildDataplane(h *netlink.Handle, typ string, cfg *subnet.Config, lease subnet.Lease, mtu int, u underlayInfo, log *slog.Logger) (daemon.Dataplane, error) {
	switch typ {
	case subnet.BackendTypeVXLAN:
		vc := vxlan.Config{
			Handle:        h,
			VNI:           cfg.Backend.VNI,
			Port:          cfg.Backend.Port,
			UnderlayIndex: u.index,
			MTU:           mtu,
			DirectRouting: cfg.Backend.DirectRouting,
			GBP:           cfg.Backend.GBP,
			Learning:      cfg.Backend.Learning,
		}
		// The device MACs are the ones the lease advertises; the local
		// addresses stay the underlay's even when the advertised public
		// address is overwritten (a node behind NAT).
		if lease.Subnet.IsValid() && lease.Attrs.BackendData != nil {
			vc.Local, vc.Subnet, vc.MAC = u.ipv4, lease.Subnet, lease.Attrs.BackendData.VtepMAC
		}
		if lease.IPv6Subnet.IsValid() && lease.Attrs.BackendV6Data != nil {
			vc.LocalIPv6, vc.IPv6Subnet, vc.MACv6 = u.ipv6, lease.IPv6Subnet, lease.Attrs.BackendV6Data.VtepMAC
		}
		b, err := vxlan.New(vc, log)
		if err != nil {
			return daemon.Dataplane{}, err
		}
		return daemon.Dataplane{Backend: b, Cleanup: func() error { return removeUVXLAN(h, vc.VNI) }}, nil
	case subnet.BackendTypeUVXLAN:
		b, err := newUVXLAN(cfg, lease, mtu, u, log)
		if err != nil {
			return daemon.Dataplane{}, err
		}
		// Any kernel VXLAN device on our port (weft's, or flannel.<VNI>
		// when replacing flanneld) holds the socket this dataplane binds.
		cleanup := func() error { return vxlan.RemovePortHolders(h, cfg.Backend.Port, log) }
		return daemon.Dataplane{Backend: b, Cleanup: cleanup}, nil
	}
	return daemon.Dataplane{}, fmt.Errorf("backend %q: unsupported", typ)
}
