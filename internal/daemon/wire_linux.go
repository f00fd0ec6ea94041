package daemon

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/weft-net/weft/backend"
	"github.com/weft-net/weft/backend/alloc"
	"github.com/weft-net/weft/backend/extension"
	"github.com/weft-net/weft/backend/forward"
	"github.com/weft-net/weft/backend/hostgw"
	"github.com/weft-net/weft/backend/kernel"
	"github.com/weft-net/weft/backend/masq"
	"github.com/weft-net/weft/backend/uvxlan"
	"github.com/weft-net/weft/backend/vxlan"
	"github.com/weft-net/weft/backend/wireguard"
	"github.com/weft-net/weft/internal/fdstore"
	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/vtep"
)

// underlayInfo is what weftd needs to know of the underlay device.
type underlayInfo struct {
	index      int
	name       string
	mtu        int
	ipv4, ipv6 netip.Addr
	// picked4 and picked6: the node advertises the device's address of
	// that family, taken from the device (no flag or annotation chose it).
	picked4, picked6 bool
}

// findUnderlay picks the underlay device: by --iface, --iface-regex or
// --iface-can-reach when one is set; else, as flanneld does, the device
// holding the public address set by flag or annotation (IPv4 first), and
// the default route's device when there is none. flanneld refuses to start
// when no device holds that address; weft then takes the default route's
// device, which suits a node behind NAT.
func findUnderlay(c *config, pub4, pub6 netip.Addr, log *slog.Logger) (underlayInfo, error) {
	h, err := netlink.NewHandle()
	if err != nil {
		return underlayInfo{}, fmt.Errorf("netlink: %w", err)
	}
	defer h.Close()
	q := kernel.UnderlayQuery{Ifaces: c.ifaces, Regexes: c.ifaceRegexes}
	if c.ifaceCanReach != "" {
		q.CanReach = netip.MustParseAddr(c.ifaceCanReach) // checked by validate
	}
	if len(q.Ifaces) == 0 && len(q.Regexes) == 0 && !q.CanReach.IsValid() {
		if pub := cmp.Or(pub4, pub6); pub.IsValid() {
			u, err := kernel.FindUnderlay(h, kernel.UnderlayQuery{Ifaces: []string{pub.String()}})
			if err == nil {
				log.Info("underlay device chosen by the public IP it holds", "device", u.Name, "publicIP", pub)
				return underlayInfo{index: u.Index, name: u.Name, mtu: u.MTU, ipv4: u.IPv4, ipv6: u.IPv6}, nil
			}
			log.Info("no device holds the public IP: the default route's device is the underlay (flanneld would refuse to start; set --iface to choose)", "publicIP", pub)
		}
	}
	u, err := kernel.FindUnderlay(h, q)
	if err != nil {
		return underlayInfo{}, err
	}
	return underlayInfo{index: u.Index, name: u.Name, mtu: u.MTU, ipv4: u.IPv4, ipv6: u.IPv6}, nil
}

// factories wires the dataplanes, the masquerade rules and the forward
// accept rules into the loop.
// files keeps the userspace dataplane's TAP queues and receive sockets
// across restarts when a service manager offers its store.
func factories(c *config, u underlayInfo, live *liveBackend, files *fdstore.Store, log *slog.Logger) Factories {
	f := Factories{
		LeaseData: func(ctx context.Context, typ string, cfg *subnet.Config, a *subnet.LeaseAttrs) error {
			return leaseData(ctx, typ, cfg, a, log)
		},
		Dataplane: func(typ string, cfg *subnet.Config, lease subnet.Lease, mtu int) (Dataplane, error) {
			if lease.IPv6Subnet.IsValid() {
				if err := enableForwarding(forwardIPv6, log); err != nil {
					return Dataplane{}, err
				}
			}
			dp, err := newDataplane(typ, c.backend != "", cfg, lease, mtu, u, files, site{openVXLAN: !c.vxlanPeerFilter, podBridge: c.podBridge}, log)
			if err != nil {
				return dp, err
			}
			if (typ == subnet.BackendTypeUVXLAN || dp.Fallback != nil) && c.dataplaneNice != 0 {
				if err := kernel.SetProcessNice(c.dataplaneNice); err != nil {
					log.Warn("cannot raise the priority of the userspace dataplane (--dataplane-nice)", "err", err)
				} else {
					log.Info("dataplane runs in weftd: raised its priority", "nice", c.dataplaneNice)
				}
			}
			live.set(dp.Backend)
			if c.flannel.blackholeRoute {
				dp.Runners = append(dp.Runners, newBlackholes(lease, log))
			}
			return dp, nil
		},
	}
	resync := time.Duration(c.flannel.resyncSeconds) * time.Second
	// Closed once weft's masquerade rules are in place (at once without
	// --ip-masq): flanneld's nat rules are removed only then.
	natReady, natOnce := make(chan struct{}), &sync.Once{}
	natDone := func() { natOnce.Do(func() { close(natReady) }) }
	f.Forward = func(cfg *subnet.Config) (Runner, error) {
		accept := c.flannel.forwardRules
		if accept && cfg.EnableNFTables {
			accept = false
			log.Warn("EnableNFTables is set in the network config: weft writes no iptables rules, so an iptables FORWARD policy DROP " +
				"is not overridden for the cluster network (Flannel in nftables mode does the same)")
		}
		return forward.New(forward.Config{Network: cfg.Network, IPv6Network: cfg.IPv6Network, Accept: accept,
			CheckInterval: resync, NATReady: natReady}, log)
	}
	if c.ipMasq {
		f.Masquerade = func(cfg *subnet.Config, lease subnet.Lease) (Runner, error) {
			m, err := masq.New(masq.Config{Network: cfg.Network, IPv6Network: cfg.IPv6Network,
				Subnet: lease.Subnet, IPv6Subnet: lease.IPv6Subnet, KeepPorts: c.flannel.masqRandomDisable}, log)
			if err != nil {
				return nil, err
			}
			return masqRunner{m, natDone}, nil
		}
	} else {
		natDone()
		if err := masq.Remove(""); err != nil {
			log.Warn("cannot remove masquerade rules left from an earlier run", "err", err)
		}
	}
	return f
}

// masqRunner runs the masquerade rules and calls ready once they are first
// in place.
type masqRunner struct {
	m     *masq.Masq
	ready func()
}

func (r masqRunner) Run(ctx context.Context) error {
	go func() {
		select {
		case <-r.m.Ready():
			r.ready()
		case <-ctx.Done():
		}
	}()
	return r.m.Run(ctx)
}

// uvxlanV6Name names the TAP of a dual-stack node's IPv6 uvxlan half.
func uvxlanV6Name(vni int) string { return fmt.Sprintf("weft-u6.%d", vni) }

// newUVXLAN builds the userspace dataplane: one backend per address family
// (a TAP each), joined when the node is dual-stack. Each opens (and closes)
// its own netlink handle.
func newUVXLAN(cfg *subnet.Config, lease subnet.Lease, mtu int, u underlayInfo, files *fdstore.Store, at site, log *slog.Logger) (backend.Backend, []string, error) {
	base := uvxlan.Config{VNI: cfg.Backend.VNI, Port: cfg.Backend.Port, MTU: mtu, NetNS: at.netns,
		AllowForeignSources: cfg.Backend.AllowForeignSources, FastPath: cfg.Backend.FastPath, Files: files, PodBridge: at.podBridge}
	base.PodMTU = podMTU(subnet.BackendTypeUVXLAN, lease, mtu, u.ipv4.IsValid()) // the subnet file's
	var parts []backend.Backend
	var names []string
	if lease.Subnet.IsValid() {
		c := base
		c.Local, c.Subnet = u.ipv4, lease.Subnet
		if d := lease.Attrs.BackendData; d != nil {
			c.MAC = d.VtepMAC // else derived from the address
		}
		b, err := uvxlan.New(c, log)
		if err != nil {
			return nil, nil, err
		}
		parts = append(parts, b)
		names = append(names, b.Config().Name)
	}
	if lease.IPv6Subnet.IsValid() {
		c := base
		c.Local, c.IPv6Subnet = u.ipv6, lease.IPv6Subnet
		if d := lease.Attrs.BackendV6Data; d != nil {
			c.MAC = d.VtepMAC
		}
		if len(parts) > 0 {
			c.Name = uvxlanV6Name(c.VNI)
			c.MTU = mtu - (vtep.OverheadIPv6 - vtep.OverheadIPv4)
		}
		b, err := uvxlan.New(c, log)
		if err != nil {
			return nil, nil, err
		}
		parts = append(parts, b)
		names = append(names, b.Config().Name)
	}
	switch len(parts) {
	case 0:
		return nil, nil, errors.New("uvxlan: the lease has no subnet")
	case 1:
		return parts[0], names, nil
	}
	return backend.Join(parts...), names, nil
}

// removeUVXLAN removes the userspace dataplane's TAPs.
func removeUVXLAN(h *netlink.Handle, vni int) error {
	return errors.Join(uvxlan.RemoveDevice(h, vni), uvxlan.RemoveDeviceNamed(h, uvxlanV6Name(vni)))
}

func newDataplane(typ string, explicit bool, cfg *subnet.Config, lease subnet.Lease, mtu int, u underlayInfo, files *fdstore.Store, at site, log *slog.Logger) (Dataplane, error) {
	h, err := netlink.NewHandle()
	if err != nil {
		return Dataplane{}, fmt.Errorf("netlink: %w", err)
	}
	dp, err := buildOrFallBack(h, typ, explicit, cfg, lease, mtu, u, files, at, log)
	if err != nil {
		h.Close()
		return Dataplane{}, err
	}
	if typ != subnet.BackendTypeUVXLAN && dp.Fallback == nil { // no other dataplane keeps files
		dp.Cleanup = withRelease(dp.Cleanup, files, nil, log)
	}
	dp.Close = h.Close
	return dp, nil
}

// site is where a dataplane is built: weftd's own network namespace, or in
// tests a namespace of the test's with a device-creation seam.
type site struct {
	netns   string                   // path of the namespace h is bound to; "" = weftd's
	addLink func(netlink.Link) error // creates the kernel's VXLAN devices; nil = the kernel
	// openVXLAN leaves the kernel VXLAN port open to any host
	// (--vxlan-peer-filter=false).
	openVXLAN bool
	podBridge string // the CNI plugin's bridge (--pod-bridge); "" = uvxlan's default
}

// installVXLAN says how to give a kernel its VXLAN driver.
const installVXLAN = "install the kernel's vxlan module (Ubuntu and Raspberry Pi OS: apt install linux-modules-extra-$(uname -r); then modprobe vxlan) and restart weftd"

// buildOrFallBack builds typ's dataplane. A node whose network config asks
// for vxlan (Flannel's default) on a kernel without the VXLAN driver runs
// uvxlan in its place, with the fast path where it attaches (unless the
// config says "FastPath": false): the lease,
// VNI, port, MACs and frames are the same, so peers see no difference. It
// logs why, once per lease. --backend vxlan (explicit) fails instead.
func buildOrFallBack(h *netlink.Handle, typ string, explicit bool, cfg *subnet.Config, lease subnet.Lease, mtu int, u underlayInfo, files *fdstore.Store, at site, log *slog.Logger) (Dataplane, error) {
	dp, err := buildDataplane(h, typ, cfg, lease, mtu, u, files, at, log)
	if typ != subnet.BackendTypeVXLAN || !errors.Is(err, vxlan.ErrNoDriver) {
		return dp, err
	}
	if explicit {
		return dp, fmt.Errorf("%w: --backend vxlan asks for the kernel's VXLAN; %s, or run --backend uvxlan "+
			"(without --backend, a vxlan network config falls back to uvxlan by itself)", err, installVXLAN)
	}
	log.Warn("the kernel cannot make a VXLAN device: this node runs uvxlan in place of vxlan, with the same lease and wire "+
		"(VNI, port, MACs)", "fast_path", cfg.Backend.FastPath, "reason", err, "fix", installVXLAN)
	dp, uerr := buildDataplane(h, subnet.BackendTypeUVXLAN, cfg, lease, mtu, u, files, at, log)
	if uerr != nil {
		return dp, fmt.Errorf("%w; uvxlan in its place: %w", err, uerr)
	}
	dp.Fallback = &Fallback{Type: subnet.BackendTypeUVXLAN, Code: "no_vxlan_driver", Reason: err.Error()}
	return dp, nil
}

func buildDataplane(h *netlink.Handle, typ string, cfg *subnet.Config, lease subnet.Lease, mtu int, u underlayInfo, files *fdstore.Store, at site, log *slog.Logger) (Dataplane, error) {
	switch typ {
	case subnet.BackendTypeHostGW:
		return newHostGW(h, cfg, lease, u, at.netns, log)
	case subnet.BackendTypeExtension:
		return newExtension(h, cfg, lease, at.netns, log)
	case subnet.BackendTypeWireGuard:
		return newWireGuard(h, cfg, lease, mtu, u, at.netns, log)
	case subnet.BackendTypeAlloc:
		return Dataplane{Backend: alloc.New(), Cleanup: func() error { return removeOthers(h, cfg, "", at.netns, log) }}, nil
	case subnet.BackendTypeVXLAN:
		vc := vxlan.Config{
			Handle:        h,
			NetNS:         at.netns,
			AddLink:       at.addLink,
			VNI:           cfg.Backend.VNI,
			Port:          cfg.Backend.Port,
			UnderlayIndex: u.index,
			MTU:           mtu,
			DirectRouting: cfg.Backend.DirectRouting,
			GBP:           cfg.Backend.GBP,
			Learning:      cfg.Backend.Learning,
			Network:       cfg.Network,
			IPv6Network:   cfg.IPv6Network,
			NoPeerFilter:  at.openVXLAN,
			// Outside sources that a routed setup sends unmasqueraded.
			AllowForeignSources: cfg.Backend.AllowForeignSources,
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
			return Dataplane{}, err
		}
		if err := b.Create(); err != nil {
			return Dataplane{}, err
		}
		return Dataplane{Backend: b, Cleanup: func() error {
			return errors.Join(removeUVXLAN(h, vc.VNI), wireguard.RemoveDevices(h), hostgw.RemoveFilter(at.netns))
		}}, nil
	case subnet.BackendTypeUVXLAN:
		b, devices, err := newUVXLAN(cfg, lease, mtu, u, files, at, log)
		if err != nil {
			return Dataplane{}, err
		}
		// Any kernel VXLAN device on our port (weft's, or flannel.<VNI>
		// when replacing flanneld) holds the socket this dataplane binds.
		cleanup := func() error {
			return errors.Join(vxlan.RemovePortHolders(h, cfg.Backend.Port, log), vxlan.RemoveFilter(at.netns),
				hostgw.RemoveFilter(at.netns), wireguard.RemoveDevices(h))
		}
		// Files kept for a device this lease no longer has (the IPv6 half
		// of a node that was dual-stack) go; each device's own take theirs.
		ours := func(name string) bool {
			return slices.ContainsFunc(devices, func(d string) bool { return strings.HasPrefix(name, d+"-") })
		}
		return Dataplane{Backend: b, Cleanup: withRelease(cleanup, files, ours, log)}, nil
	}
	return Dataplane{}, fmt.Errorf("backend %q: unsupported", typ)
}

// removeOthers removes what the other backends left on a node that now
// runs keep (host-gw, wireguard or alloc, "" for alloc): the kernel VXLAN
// devices (weft's or flanneld's), the uvxlan TAPs, and unless keep is
// wireguard the wireguard devices,
// whose route for the whole cluster network would catch pod traffic, and
// the kernel VXLAN backend's port filter, whose peer sets no one keeps up
// any more, in the namespace at netns.
func removeOthers(h *netlink.Handle, cfg *subnet.Config, keep, netns string, log *slog.Logger) error {
	errs := []error{vxlan.RemovePortHolders(h, cfg.Backend.Port, log), vxlan.RemoveDevices(h, cfg.Backend.VNI),
		removeUVXLAN(h, cfg.Backend.VNI), vxlan.RemoveFilter(netns)}
	if keep != subnet.BackendTypeWireGuard {
		errs = append(errs, wireguard.RemoveDevices(h))
	}
	if keep != subnet.BackendTypeHostGW {
		errs = append(errs, hostgw.RemoveFilter(netns))
	}
	return errors.Join(errs...)
}

// newExtension builds the extension dataplane. Its cleanup removes weft's
// and Flannel's devices by name only: the user's PreStartupCommand may have
// made a VXLAN device on weft's port, which must stay.
func newExtension(h *netlink.Handle, cfg *subnet.Config, lease subnet.Lease, netns string, log *slog.Logger) (Dataplane, error) {
	b, err := extension.New(extension.Config{Commands: extension.FromConfig(cfg.Backend),
		Network: cfg.Network, IPv6Network: cfg.IPv6Network, Lease: lease}, log)
	if err != nil {
		return Dataplane{}, err
	}
	return Dataplane{Backend: b, Cleanup: func() error {
		return errors.Join(vxlan.RemoveDevices(h, cfg.Backend.VNI), removeUVXLAN(h, cfg.Backend.VNI),
			vxlan.RemoveFilter(netns), hostgw.RemoveFilter(netns), wireguard.RemoveDevices(h))
	}}, nil
}

// leaseData adds the backend data only the dataplane knows to the lease
// value: the wireguard public key, or what the extension backend's
// PreStartupCommand printed.
func leaseData(ctx context.Context, typ string, cfg *subnet.Config, a *subnet.LeaseAttrs, log *slog.Logger) error {
	if typ != subnet.BackendTypeExtension {
		return wireGuardLeaseData(typ, cfg, a)
	}
	data, err := extension.PreStartup(ctx, "", cfg.Backend.PreStartupCommand, log)
	if err != nil {
		return err
	}
	a.ExtensionData = data
	return nil
}

// newHostGW builds the host-gw dataplane. As Flannel's, it refuses a node
// whose advertised address is not the underlay's own (a node behind NAT):
// peers route to that address directly.
func newHostGW(h *netlink.Handle, cfg *subnet.Config, lease subnet.Lease, u underlayInfo, netns string, log *slog.Logger) (Dataplane, error) {
	a := lease.Attrs
	if a.PublicIP.IsValid() && a.PublicIP != u.ipv4 || a.PublicIPv6.IsValid() && a.PublicIPv6 != u.ipv6 {
		return Dataplane{}, fmt.Errorf("host-gw: the public address (%s %s) differs from the underlay's (%s %s): "+
			"a node behind NAT cannot use host-gw, peers route to its public address directly", a.PublicIP, a.PublicIPv6, u.ipv4, u.ipv6)
	}
	b, err := hostgw.New(hostgw.Config{Handle: h, NetNS: netns, UnderlayIndex: u.index, Local: u.ipv4, LocalIPv6: u.ipv6,
		Subnet: lease.Subnet, IPv6Subnet: lease.IPv6Subnet, Network: cfg.Network, IPv6Network: cfg.IPv6Network}, log)
	if err != nil {
		return Dataplane{}, err
	}
	return Dataplane{Backend: b, Cleanup: func() error { return removeOthers(h, cfg, subnet.BackendTypeHostGW, netns, log) }}, nil
}

// withRelease adds to cleanup the release of the files the last run kept
// that keep does not claim: a port or TAP queue held for a dataplane this
// node no longer runs would keep its port bound.
func withRelease(cleanup func() error, files *fdstore.Store, keep func(string) bool, log *slog.Logger) func() error {
	return func() error {
		var err error
		if cleanup != nil {
			err = cleanup()
		}
		released, rerr := files.ReleaseUnclaimed(keep)
		if len(released) > 0 {
			log.Info("released files kept by the last run for another dataplane", "names", released)
		}
		return errors.Join(err, rerr)
	}
}
