package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/vtep"
)

// errLeaseLost ends a session: our key was deleted or taken over.
var errLeaseLost = errors.New("lease lost")

// leaseLoop acquires a lease and runs a session on it; when the lease is
// lost it acquires again, preferring the same subnet.
func (d *Daemon) leaseLoop(ctx context.Context, cfg *subnet.Config, typ string) error {
	attrs := d.attrs(cfg, typ)
	if d.cfg.Factories.LeaseData != nil {
		if err := d.cfg.Factories.LeaseData(ctx, typ, cfg, &attrs); err != nil {
			return fmt.Errorf("daemon: lease data: %w", err)
		}
	}
	hints := d.previousSubnets()
	for {
		lease, err := d.acquire(ctx, attrs, hints)
		if err != nil {
			return err
		}
		err = d.session(ctx, cfg, typ, lease)
		if !errors.Is(err, errLeaseLost) {
			return err
		}
		d.ready.Store(false)
		d.cfg.Metrics.setReady(false)
		d.cfg.Metrics.lost()
		d.log.Warn("our lease was deleted or taken over, acquiring again", "subnet", lease.Subnet)
		hints = []netip.Prefix{lease.Subnet, lease.IPv6Subnet}
	}
}

// attrs is the lease value this node advertises. A uvxlan node advertises
// "vxlan" as well: on the wire it is VXLAN. host-gw and alloc leases
// carry the public addresses and no backend data, as Flannel writes them; a
// wireguard lease gets its data (the public key) from Factories.LeaseData,
// an extension lease its data (what PreStartupCommand printed) likewise.
func (d *Daemon) attrs(cfg *subnet.Config, typ string) subnet.LeaseAttrs {
	if typ == subnet.BackendTypeHostGW || typ == subnet.BackendTypeAlloc || typ == subnet.BackendTypeWireGuard ||
		typ == subnet.BackendTypeExtension {
		a := subnet.LeaseAttrs{BackendType: subnet.LeaseBackendType(typ)}
		if cfg.EnableIPv4 {
			a.PublicIP = d.cfg.Node.PublicIP
		}
		if cfg.EnableIPv6 {
			a.PublicIPv6 = d.cfg.Node.PublicIPv6
		}
		return a
	}
	a := subnet.LeaseAttrs{BackendType: subnet.BackendTypeVXLAN}
	if cfg.EnableIPv4 {
		a.PublicIP = d.cfg.Node.PublicIP
		a.BackendData = &subnet.VXLANData{VNI: cfg.Backend.VNI, VtepMAC: vtep.DeviceMAC(d.cfg.Node.PublicIP, cfg.Backend.VNI)}
	}
	if cfg.EnableIPv6 && d.cfg.Node.PublicIPv6.IsValid() {
		a.PublicIPv6 = d.cfg.Node.PublicIPv6
		a.BackendV6Data = &subnet.VXLANData{VNI: cfg.Backend.VNI, VtepMAC: vtep.DeviceMAC(d.cfg.Node.PublicIPv6, cfg.Backend.VNI)}
	}
	return a
}

// previousSubnets are the node subnets, IPv4 and IPv6, named in an existing
// subnet file (flanneld's FLANNEL_SUBNET and FLANNEL_IPV6_SUBNET); the
// registry reuses them when this node has no lease any more.
func (d *Daemon) previousSubnets() []netip.Prefix {
	f, err := subnet.ReadFile(d.cfg.SubnetFile)
	if err != nil {
		return nil
	}
	var hints []netip.Prefix
	for _, p := range []netip.Prefix{f.Subnet, f.IPv6Subnet} {
		if p.IsValid() {
			hints = append(hints, p.Masked())
		}
	}
	return hints
}

func (d *Daemon) acquire(ctx context.Context, attrs subnet.LeaseAttrs, hints []netip.Prefix) (subnet.Lease, error) {
	if err := d.awaitPresence(ctx); err != nil {
		return subnet.Lease{}, err
	}
	for {
		lease, err := d.cfg.Registry.Acquire(ctx, attrs, hints...)
		d.setWaiting(err)
		if err == nil {
			d.cfg.Metrics.acquired()
			d.log.Info("acquired lease", "subnet", lease.Subnet, "ipv6Subnet", lease.IPv6Subnet,
				"publicIP", lease.Attrs.PublicIP, "publicIPv6", lease.Attrs.PublicIPv6, "expires", lease.Expiration)
			return lease, nil
		}
		if ctx.Err() != nil {
			return subnet.Lease{}, ctx.Err()
		}
		d.log.Error("cannot acquire a subnet lease, retrying", "err", err, "retryIn", d.retryDelay())
		if err := sleep(ctx, d.retryDelay()); err != nil {
			return subnet.Lease{}, err
		}
	}
}

// overlayMTU is the MTU of the overlay device and of pods. Without
// encapsulation (host-gw, alloc, and extension, whose commands weft does not
// know) it is the underlay's MTU, as Flannel's.
func (d *Daemon) overlayMTU(cfg *subnet.Config, typ string) int {
	underlay := d.cfg.Node.UnderlayMTU
	if typ == subnet.BackendTypeHostGW || typ == subnet.BackendTypeAlloc || typ == subnet.BackendTypeExtension {
		return underlay
	}
	if typ == subnet.BackendTypeWireGuard { // Flannel's: the configured or underlay MTU minus 80
		if cfg.Backend.MTU != 0 {
			underlay = cfg.Backend.MTU
		}
		return underlay - wireGuardOverhead
	}
	if cfg.Backend.MTU != 0 {
		underlay = cfg.Backend.MTU
	}
	return vtep.OverlayMTU(underlay, !d.cfg.Node.PublicIP.IsValid())
}

// podMTU is the pods' MTU (FLANNEL_MTU) for overlay MTU mtu: on a dual-stack
// node of vxlan or uvxlan, whose IPv6 device has an IPv6 outer header and so
// an MTU 20 bytes below mtu (the IPv4 device's), that smaller one, so that
// pods' full-size IPv6 packets fit without path-MTU discovery; else mtu.
func (d *Daemon) podMTU(typ string, lease subnet.Lease, mtu int) int {
	return podMTU(typ, lease, mtu, d.cfg.Node.PublicIP.IsValid())
}

// podMTU is Daemon.podMTU for a node with (publicIPv4) or without an IPv4
// public address; the uvxlan dataplane cuts super-segments to it.
func podMTU(typ string, lease subnet.Lease, mtu int, publicIPv4 bool) int {
	vxlan := typ == subnet.BackendTypeVXLAN || typ == subnet.BackendTypeUVXLAN
	if vxlan && lease.Subnet.IsValid() && lease.IPv6Subnet.IsValid() && publicIPv4 {
		return mtu - (vtep.OverheadIPv6 - vtep.OverheadIPv4)
	}
	return mtu
}

// wireGuardOverhead is what Flannel's wireguard backend takes off the MTU.
const wireGuardOverhead = 80

// leaseMover is a registry that can rewrite the addresses of a lease it
// handed out (subnet/etcd). A Kubernetes node's subnet is its podCIDR and
// follows the node whatever its address, so that registry needs none.
type leaseMover interface {
	// Move rewrites l's value to attrs if it still holds l.Attrs, keeping
	// its subnets and expiry; ErrLeaseLost if it does not.
	Move(ctx context.Context, l subnet.Lease, attrs subnet.LeaseAttrs) (subnet.Lease, error)
}

// MoveLease rewrites this node's lease to advertise addr, the underlay's new
// address, in place of the old one of its family (and the VXLAN MAC derived
// from it): peers then send to the new address, and the next start, which
// finds its lease by its public address, keeps the subnet and its pods'
// addresses. Without a lease, or with a registry that cannot move one, it
// does nothing.
func (d *Daemon) MoveLease(ctx context.Context, addr netip.Addr) error {
	l := d.Lease()
	mv, ok := d.cfg.Registry.(leaseMover)
	if l == nil || !ok {
		return nil
	}
	attrs := l.Attrs
	if addr.Is4() {
		attrs.PublicIP = addr
		if attrs.BackendData != nil {
			attrs.BackendData = &subnet.VXLANData{VNI: attrs.BackendData.VNI, VtepMAC: vtep.DeviceMAC(addr, attrs.BackendData.VNI)}
		}
	} else {
		attrs.PublicIPv6 = addr
		if attrs.BackendV6Data != nil {
			attrs.BackendV6Data = &subnet.VXLANData{VNI: attrs.BackendV6Data.VNI, VtepMAC: vtep.DeviceMAC(addr, attrs.BackendV6Data.VNI)}
		}
	}
	moved, err := mv.Move(ctx, *l, attrs)
	if err != nil {
		return fmt.Errorf("move lease %s to %s: %w", l.Subnet, addr, err)
	}
	d.log.Info("moved our lease to the new underlay address", "subnet", moved.Subnet, "ipv6Subnet", moved.IPv6Subnet,
		"publicIP", moved.Attrs.PublicIP, "publicIPv6", moved.Attrs.PublicIPv6)
	return nil
}
