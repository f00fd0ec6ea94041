package subnet

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// Lease is one node's claim on a subnet (and, dual-stack, an IPv6 subnet).
type Lease struct {
	Subnet     netip.Prefix // IPv4 node subnet; invalid when IPv4 is off
	IPv6Subnet netip.Prefix // IPv6 node subnet; invalid when IPv6 is off
	Attrs      LeaseAttrs
	// Expiration is when the lease runs out; zero for a key without TTL (an
	// admin reservation), which never expires and is never renewed.
	Expiration time.Time
	// Revision is the datastore revision that last wrote the lease (etcd
	// mod revision; 0 where the store has none).
	Revision int64
}

// Key returns the lease's datastore key, "10.244.59.0-24" or
// "10.244.92.0-24&fd00:10:244:50::-64".
func (l Lease) Key() string { return MakeKey(l.Subnet, l.IPv6Subnet) }

// LeaseAttrs is the lease value, stored as JSON with Flannel's field names.
type LeaseAttrs struct {
	PublicIP      netip.Addr
	PublicIPv6    netip.Addr
	BackendType   string
	BackendData   *VXLANData // vxlan backend data of the IPv4 VTEP; nil for other backends
	BackendV6Data *VXLANData // vxlan backend data of the IPv6 VTEP
	// WireGuard and WireGuardV6 are the BackendData and BackendV6Data of a
	// wireguard lease; nil for other backends.
	WireGuard, WireGuardV6 *WireGuardData
	// ExtensionData is the BackendData of an extension lease, as the JSON
	// text stored (Flannel's extension backend writes a JSON string: what
	// its PreStartupCommand printed); "" when there is none.
	ExtensionData string
}

// Equal reports whether a and b describe a node the same way: the same
// addresses, backend type and backend data.
func (a LeaseAttrs) Equal(b LeaseAttrs) bool {
	return a.PublicIP == b.PublicIP && a.PublicIPv6 == b.PublicIPv6 && a.BackendType == b.BackendType &&
		samePtr(a.BackendData, b.BackendData) && samePtr(a.BackendV6Data, b.BackendV6Data) &&
		samePtr(a.WireGuard, b.WireGuard) && samePtr(a.WireGuardV6, b.WireGuardV6) && a.ExtensionData == b.ExtensionData
}

func samePtr[T comparable](a, b *T) bool { return a == b || a != nil && b != nil && *a == *b }

// VXLANData is the BackendData of a vxlan lease.
type VXLANData struct {
	VNI     int
	VtepMAC MAC
}

// wireAttrs is the JSON form, with flanneld's field names, order and
// omissions: PublicIP is always written ("0.0.0.0" when the node has no IPv4
// address, because flanneld cannot read null there), PublicIPv6 is null when
// absent, and empty backend fields are left out.
type wireAttrs struct {
	PublicIP      *netip.Addr     `json:"PublicIP"`
	PublicIPv6    *netip.Addr     `json:"PublicIPv6"`
	BackendType   string          `json:"BackendType,omitempty"`
	BackendData   json.RawMessage `json:"BackendData,omitempty"`
	BackendV6Data json.RawMessage `json:"BackendV6Data,omitempty"`
}

// MarshalJSON writes the value as flanneld does:
// {"PublicIP":"…","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"…"}}
func (a LeaseAttrs) MarshalJSON() ([]byte, error) {
	pub := netip.IPv4Unspecified()
	w := wireAttrs{PublicIP: &pub, BackendType: a.BackendType}
	if a.PublicIP.IsValid() {
		if !a.PublicIP.Is4() {
			return nil, fmt.Errorf("marshal lease attrs: PublicIP %s: not an IPv4 address", a.PublicIP)
		}
		pub = a.PublicIP
	}
	if a.PublicIPv6.IsValid() {
		if !a.PublicIPv6.Is6() || a.PublicIPv6.Is4In6() {
			return nil, fmt.Errorf("marshal lease attrs: PublicIPv6 %s: not an IPv6 address", a.PublicIPv6)
		}
		v6 := a.PublicIPv6
		w.PublicIPv6 = &v6
	}
	var err error
	if w.BackendData, err = a.DataJSON(false); err != nil {
		return nil, fmt.Errorf("marshal lease attrs: BackendData: %w", err)
	}
	if w.BackendV6Data, err = a.DataJSON(true); err != nil {
		return nil, fmt.Errorf("marshal lease attrs: BackendV6Data: %w", err)
	}
	return json.Marshal(w)
}

// DataJSON is the JSON of the backend data of one family (BackendData, or
// with v6 BackendV6Data), or nil when there is none.
func (a LeaseAttrs) DataJSON(v6 bool) (json.RawMessage, error) {
	vx, wg := a.BackendData, a.WireGuard
	if v6 {
		vx, wg = a.BackendV6Data, a.WireGuardV6
	}
	if wg != nil {
		return json.Marshal(wg)
	}
	if !v6 && a.ExtensionData != "" {
		return json.RawMessage(a.ExtensionData), nil
	}
	return encodeVXLANData(vx)
}

// SetDataJSON decodes the backend data of one family for the lease's
// BackendType (vxlan or wireguard; extension's IPv4 data is kept as its
// JSON text; other types' data is dropped).
func (a *LeaseAttrs) SetDataJSON(v6 bool, b json.RawMessage) error {
	switch a.BackendType {
	case BackendTypeVXLAN:
		d, err := decodeVXLANData(b)
		if v6 {
			a.BackendV6Data = d
		} else {
			a.BackendData = d
		}
		return err
	case BackendTypeWireGuard:
		if len(b) == 0 || bytes.Equal(b, []byte("null")) {
			return nil
		}
		var d WireGuardData
		if err := json.Unmarshal(b, &d); err != nil {
			return err
		}
		if v6 {
			a.WireGuardV6 = &d
		} else {
			a.WireGuard = &d
		}
	case BackendTypeExtension:
		if v6 || len(b) == 0 || bytes.Equal(b, []byte("null")) {
			return nil
		}
		if !json.Valid(b) {
			return errors.New("not JSON")
		}
		var c bytes.Buffer
		if err := json.Compact(&c, b); err != nil {
			return err
		}
		a.ExtensionData = c.String()
	}
	return nil
}

func encodeVXLANData(d *VXLANData) (json.RawMessage, error) {
	if d == nil {
		return nil, nil
	}
	return json.Marshal(d)
}

// UnmarshalJSON reads a lease value written by weft or flanneld. Backend
// data is decoded only for the vxlan and wireguard types, and kept as JSON
// for extension; other backends' data is dropped. A PublicIP of "0.0.0.0" (flanneld's IPv6-only lease)
// reads as invalid.
func (a *LeaseAttrs) UnmarshalJSON(b []byte) error {
	var w wireAttrs
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	out := LeaseAttrs{BackendType: w.BackendType}
	if w.PublicIP != nil && !w.PublicIP.IsUnspecified() {
		out.PublicIP = *w.PublicIP
	}
	if w.PublicIPv6 != nil && !w.PublicIPv6.IsUnspecified() {
		out.PublicIPv6 = *w.PublicIPv6
	}
	if out.PublicIP.IsValid() && !out.PublicIP.Is4() {
		return fmt.Errorf("PublicIP %s: not an IPv4 address", out.PublicIP)
	}
	if out.PublicIPv6.IsValid() && (!out.PublicIPv6.Is6() || out.PublicIPv6.Is4In6()) {
		return fmt.Errorf("PublicIPv6 %s: not an IPv6 address", out.PublicIPv6)
	}
	if err := out.SetDataJSON(false, w.BackendData); err != nil {
		return fmt.Errorf("BackendData: %w", err)
	}
	if err := out.SetDataJSON(true, w.BackendV6Data); err != nil {
		return fmt.Errorf("BackendV6Data: %w", err)
	}
	*a = out
	return nil
}

func decodeVXLANData(b json.RawMessage) (*VXLANData, error) {
	if len(b) == 0 || bytes.Equal(b, []byte("null")) {
		return nil, nil
	}
	var d VXLANData
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, err
	}
	return &d, nil
}

// ErrBadKey is returned by ParseKey for a key that is not a lease key.
var ErrBadKey = errors.New("not a subnet lease key")

// MakeKey encodes the lease key Flannel uses. An IPv6-only lease is written
// as Flannel writes it, with an all-zero IPv4 part.
func MakeKey(v4, v6 netip.Prefix) string {
	var b strings.Builder
	if v4.IsValid() {
		b.WriteString(keyPart(v4))
	} else {
		b.WriteString("0.0.0.0-0")
	}
	if v6.IsValid() {
		b.WriteByte('&')
		b.WriteString(keyPart(v6))
	}
	return b.String()
}

func keyPart(p netip.Prefix) string { return p.Addr().String() + "-" + strconv.Itoa(p.Bits()) }

// ParseKey decodes a lease key. The IPv4 part of an IPv6-only key
// ("0.0.0.0-0") yields an invalid v4 prefix.
func ParseKey(key string) (v4, v6 netip.Prefix, err error) {
	p4, p6, dual := strings.Cut(key, "&")
	if v4, err = parseKeyPart(p4, false); err != nil {
		return netip.Prefix{}, netip.Prefix{}, fmt.Errorf("%w: %q: %w", ErrBadKey, key, err)
	}
	if v4 == netip.PrefixFrom(netip.IPv4Unspecified(), 0) {
		v4 = netip.Prefix{}
	}
	if dual {
		if v6, err = parseKeyPart(p6, true); err != nil {
			return netip.Prefix{}, netip.Prefix{}, fmt.Errorf("%w: %q: %w", ErrBadKey, key, err)
		}
	}
	if !v4.IsValid() && !v6.IsValid() {
		return netip.Prefix{}, netip.Prefix{}, fmt.Errorf("%w: %q: no subnet", ErrBadKey, key)
	}
	return v4, v6, nil
}

func parseKeyPart(s string, v6 bool) (netip.Prefix, error) {
	i := strings.LastIndexByte(s, '-')
	if i < 0 {
		return netip.Prefix{}, errors.New("missing '-'")
	}
	p, err := netip.ParsePrefix(s[:i] + "/" + s[i+1:])
	if err != nil {
		return netip.Prefix{}, err
	}
	if p.Addr().Is6() != v6 || p.Addr().Is4In6() || p.Addr().Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("wrong address family in %q", s)
	}
	if p != p.Masked() {
		return netip.Prefix{}, fmt.Errorf("%q has host bits set", s)
	}
	return p, nil
}
