package subnet

import (
	"errors"
	"fmt"
	"net/netip"
)

// Reasons a lease is rejected: the values of the label "reason" of
// weft_leases_rejected_total.
const (
	RejectMalformedKey   = "malformed_key"   // the key is not a lease key
	RejectMalformedValue = "malformed_value" // the value (or annotation) does not parse
	RejectFamily         = "family"          // a subnet of a family the config does not enable, or none
	RejectOutsideNetwork = "outside_network" // a subnet not inside the configured Network
	RejectPrefixLength   = "prefix_length"   // a subnet of another prefix length than the cluster's
	RejectBackendType    = "backend_type"    // another backend type than the cluster's
	RejectBackendData    = "backend_data"    // backend data missing, or the wrong VNI, or no VTEP MAC
	RejectPublicIP       = "public_ip"       // no, or an unusable, underlay address
)

// RejectError says why a lease is not taken into account.
type RejectError struct {
	Reason string // one of the Reject* constants
	Err    error
}

func (e *RejectError) Error() string { return e.Reason + ": " + e.Err.Error() }
func (e *RejectError) Unwrap() error { return e.Err }

func reject(reason, format string, args ...any) *RejectError {
	return &RejectError{Reason: reason, Err: fmt.Errorf(format, args...)}
}

// RejectReason returns the reason carried by err (a *RejectError), or
// RejectMalformedValue for any other error.
func RejectReason(err error) string {
	var re *RejectError
	if errors.As(err, &re) {
		return re.Reason
	}
	return RejectMalformedValue
}

// LeaseBackendType is the backend type the nodes of this config write in
// their leases, and so the only type a peer's lease may carry. A uvxlan node
// advertises "vxlan": on the wire it is VXLAN. An alloc node advertises no
// type, as flanneld's. Every other type advertises itself.
func LeaseBackendType(configType string) string {
	switch configType {
	case BackendTypeUVXLAN:
		return BackendTypeVXLAN
	case BackendTypeAlloc:
		return ""
	}
	return configType
}

// PrefixLens are the node subnet lengths a peer's lease must have, per
// family. Zero means the config's SubnetLen (IPv6SubnetLen).
type PrefixLens struct{ V4, V6 int }

// CheckLease reports why a peer's lease must not become a peer (a
// *RejectError), or nil. A lease must carry a subnet of each family the
// config enables and of no other, each inside the Network of its family
// with the expected prefix length, the config's backend type (as leases
// carry it, see LeaseBackendType) with that backend's data (for VXLAN the
// config's VNI and a VTEP MAC), and per family a usable public address:
// unicast, not loopback, link-local or unspecified, and not inside a pod
// Network.
func (c *Config) CheckLease(l Lease, lens PrefixLens) error {
	if lens.V4 == 0 {
		lens.V4 = c.SubnetLen
	}
	if lens.V6 == 0 {
		lens.V6 = c.IPv6SubnetLen
	}
	fams := []struct {
		on      bool
		sub     netip.Prefix
		network netip.Prefix
		bits    int
		pub     netip.Addr
		data    *VXLANData
		wg      *WireGuardData
		name    string
	}{
		{c.EnableIPv4, l.Subnet, c.Network, lens.V4, l.Attrs.PublicIP, l.Attrs.BackendData, l.Attrs.WireGuard, "IPv4"},
		{c.EnableIPv6, l.IPv6Subnet, c.IPv6Network, lens.V6, l.Attrs.PublicIPv6, l.Attrs.BackendV6Data, l.Attrs.WireGuardV6, "IPv6"},
	}
	if want := LeaseBackendType(c.Backend.Type); l.Attrs.BackendType != want {
		return reject(RejectBackendType, "backend type %q, the cluster's is %q", l.Attrs.BackendType, want)
	}
	for _, f := range fams {
		if f.on != f.sub.IsValid() {
			return reject(RejectFamily, "%s subnet %s: the network config has %s enabled=%t", f.name, f.sub, f.name, f.on)
		}
		if !f.on {
			continue
		}
		if f.sub.Bits() < f.network.Bits() || !f.network.Contains(f.sub.Addr()) {
			return reject(RejectOutsideNetwork, "subnet %s is outside the network %s", f.sub, f.network)
		}
		if f.sub.Bits() != f.bits {
			return reject(RejectPrefixLength, "subnet %s: prefix length %d, the cluster's is %d", f.sub, f.sub.Bits(), f.bits)
		}
		if err := c.checkPublicIP(f.pub, f.sub.Addr().Is6()); err != nil {
			return reject(RejectPublicIP, "%s public address: %w", f.name, err)
		}
		if err := c.checkBackendData(l.Attrs.BackendType, f.data); err != nil {
			return reject(RejectBackendData, "%s backend data: %w", f.name, err)
		}
		if err := checkWireGuardData(l.Attrs.BackendType, f.wg); err != nil {
			return reject(RejectBackendData, "%s backend data: %w", f.name, err)
		}
	}
	return nil
}

// checkPublicIP checks a peer's underlay address.
func (c *Config) checkPublicIP(a netip.Addr, v6 bool) error {
	switch {
	case !a.IsValid():
		return errors.New("missing")
	case a.Is6() != v6 || a.Is4In6():
		return fmt.Errorf("%s: wrong address family", a)
	case a.IsUnspecified(), a.IsLoopback(), a.IsMulticast(), a.IsLinkLocalUnicast(),
		a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return fmt.Errorf("%s: not a usable unicast address", a)
	case c.Network.IsValid() && c.Network.Contains(a), c.IPv6Network.IsValid() && c.IPv6Network.Contains(a):
		return fmt.Errorf("%s: inside the pod network", a)
	}
	return nil
}

// checkBackendData checks the backend data of one family. Only VXLAN leases
// carry data weft reads; a new backend type with data adds its case here.
func (c *Config) checkBackendData(typ string, d *VXLANData) error {
	if typ != BackendTypeVXLAN {
		return nil
	}
	switch {
	case d == nil:
		return errors.New("missing")
	case d.VNI != c.Backend.VNI:
		return fmt.Errorf("VNI %d, the cluster's is %d", d.VNI, c.Backend.VNI)
	case d.VtepMAC.IsZero() || d.VtepMAC[0]&1 == 1:
		return fmt.Errorf("VTEP MAC %s: not a unicast address", d.VtepMAC)
	}
	return nil
}
