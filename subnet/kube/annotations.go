package kube

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/weft-net/weft/subnet"
)

// DefaultAnnotationPrefix is Flannel's annotation prefix; keeping it lets
// weft and flanneld nodes see each other.
const DefaultAnnotationPrefix = "flannel.alpha.coreos.com"

// annotations holds the full names of the node annotations weft writes
// (the lease) and reads (the operator's public IP choices).
type annotations struct {
	prefix                                  string // what all of them start with: "<domain>/" or "<domain>/<name>-"
	backendType, backendData, backendV6Data string
	publicIP, publicIPv6                    string
	managed                                 string // "true" on nodes that run a kube subnet manager
	publicIPOverwrite, publicIPv6Overwrite  string
	nodePublicIP, nodePublicIPv6            string
}

// newAnnotations names the annotations under prefix as flanneld's
// --kube-annotation-prefix does: a prefix without a '/' is a domain and the
// names follow a '/' ("flannel.alpha.coreos.com" gives
// "flannel.alpha.coreos.com/backend-data"); a prefix with one '/' keeps it
// and its part after the '/' is joined to the names by a '-'
// ("example.com/flannel" gives "example.com/flannel-backend-data"). Every
// name must be a valid Kubernetes annotation key, which the API server
// would otherwise refuse at the first patch.
func newAnnotations(prefix string) (annotations, error) {
	p := prefix
	switch strings.Count(p, "/") {
	case 0:
		p += "/"
	case 1:
	default:
		return annotations{}, fmt.Errorf("annotation prefix %q: at most one '/' (a domain, optionally followed by /name)", prefix)
	}
	if !strings.HasSuffix(p, "/") && !strings.HasSuffix(p, "-") {
		p += "-"
	}
	a := annotations{
		prefix:              p,
		backendType:         p + "backend-type",
		backendData:         p + "backend-data",
		backendV6Data:       p + "backend-v6-data",
		publicIP:            p + "public-ip",
		publicIPv6:          p + "public-ipv6",
		managed:             p + "kube-subnet-manager",
		publicIPOverwrite:   p + "public-ip-overwrite",
		publicIPv6Overwrite: p + "public-ipv6-overwrite",
		nodePublicIP:        p + "node-public-ip",
		nodePublicIPv6:      p + "node-public-ipv6",
	}
	for _, key := range []string{a.backendType, a.backendData, a.backendV6Data, a.publicIP, a.publicIPv6, a.managed,
		a.publicIPOverwrite, a.publicIPv6Overwrite, a.nodePublicIP, a.nodePublicIPv6} {
		if errs := validation.IsQualifiedName(key); len(errs) > 0 {
			return annotations{}, fmt.Errorf("annotation prefix %q: makes the annotation key %q, which Kubernetes refuses: %s",
				prefix, key, strings.Join(errs, "; "))
		}
	}
	return a, nil
}

// podCIDRs returns the node's IPv4 and IPv6 podCIDRs (either may be
// invalid when not assigned).
func podCIDRs(n *corev1.Node) (v4, v6 netip.Prefix, err error) {
	cidrs := n.Spec.PodCIDRs
	if len(cidrs) == 0 && n.Spec.PodCIDR != "" {
		cidrs = []string{n.Spec.PodCIDR}
	}
	for _, s := range cidrs {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, netip.Prefix{}, fmt.Errorf("node %s: podCIDR %q: %w", n.Name, s, err)
		}
		p = p.Masked()
		if p.Addr().Is4() {
			v4 = p
		} else {
			v6 = p
		}
	}
	return v4, v6, nil
}

// effectiveAttrs applies the operator's choice of public IP, from the
// public-ip(v6)-overwrite annotation or else node-public-ip(v6), to attrs.
func (a annotations) effectiveAttrs(n *corev1.Node, attrs subnet.LeaseAttrs) (subnet.LeaseAttrs, error) {
	for _, f := range []struct {
		names []string
		v6    bool
		dst   *netip.Addr
	}{
		{[]string{a.publicIPOverwrite, a.nodePublicIP}, false, &attrs.PublicIP},
		{[]string{a.publicIPv6Overwrite, a.nodePublicIPv6}, true, &attrs.PublicIPv6},
	} {
		for _, name := range f.names {
			s, ok := n.Annotations[name]
			if !ok || s == "" {
				continue
			}
			ip, err := parseIP(s, f.v6)
			if err != nil {
				return subnet.LeaseAttrs{}, fmt.Errorf("node %s: annotation %s: %w", n.Name, name, err)
			}
			*f.dst = ip
			break
		}
	}
	return attrs, nil
}

func parseIP(s string, v6 bool) (netip.Addr, error) {
	ip, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, err
	}
	if v6 && (!ip.Is6() || ip.Is4In6()) {
		return netip.Addr{}, fmt.Errorf("%s is not an IPv6 address", s)
	}
	if !v6 && !ip.Is4() {
		return netip.Addr{}, fmt.Errorf("%s is not an IPv4 address", s)
	}
	return ip, nil
}

// leaseAnnotations returns the annotations that publish attrs for the
// enabled families.
func (a annotations) leaseAnnotations(cfg *subnet.Config, attrs subnet.LeaseAttrs) (map[string]string, error) {
	out := map[string]string{a.backendType: attrs.BackendType, a.managed: "true"}
	if cfg.EnableIPv4 {
		if !attrs.PublicIP.IsValid() {
			return nil, errors.New("IPv4 is enabled but the node has no IPv4 public IP")
		}
		bd, err := dataAnnotation(attrs, false)
		if err != nil {
			return nil, fmt.Errorf("encode backend data: %w", err)
		}
		out[a.backendData] = bd
		out[a.publicIP] = attrs.PublicIP.String()
	}
	if cfg.EnableIPv6 {
		if !attrs.PublicIPv6.IsValid() {
			return nil, errors.New("IPv6 is enabled but the node has no IPv6 public IP")
		}
		bd, err := dataAnnotation(attrs, true)
		if err != nil {
			return nil, fmt.Errorf("encode backend v6 data: %w", err)
		}
		out[a.backendV6Data] = bd
		out[a.publicIPv6] = attrs.PublicIPv6.String()
	}
	return out, nil
}

// needsPatch reports whether the node lacks any of want.
func needsPatch(n *corev1.Node, want map[string]string) bool {
	for k, v := range want {
		if got, ok := n.Annotations[k]; !ok || got != v {
			return true
		}
	}
	return false
}

// errNotLease marks a node that carries no complete lease (no marker, no
// podCIDR, or a missing annotation): it is not a peer.
var errNotLease = errors.New("not a lease")

// nodeLease reads the lease a node publishes, for the families cfg enables.
// It returns an error wrapping errNotLease when the node publishes none, and
// another error when an annotation does not parse.
func (a annotations) nodeLease(cfg *subnet.Config, n *corev1.Node) (subnet.Lease, error) {
	if n.Annotations[a.managed] != "true" {
		return subnet.Lease{}, fmt.Errorf("node %s: no %s=true: %w", n.Name, a.managed, errNotLease)
	}
	v4, v6, err := podCIDRs(n)
	if err != nil {
		return subnet.Lease{}, err
	}
	typ := n.Annotations[a.backendType]
	if typ == "" {
		return subnet.Lease{}, fmt.Errorf("node %s: no %s: %w", n.Name, a.backendType, errNotLease)
	}
	l := subnet.Lease{Attrs: subnet.LeaseAttrs{BackendType: typ}}
	fams := []struct {
		on               bool
		cidr             netip.Prefix
		ipName, dataName string
		v6               bool
		dstSubnet        *netip.Prefix
		dstIP            *netip.Addr
		dstData          **subnet.VXLANData
	}{
		{cfg.EnableIPv4, v4, a.publicIP, a.backendData, false, &l.Subnet, &l.Attrs.PublicIP, &l.Attrs.BackendData},
		{cfg.EnableIPv6, v6, a.publicIPv6, a.backendV6Data, true, &l.IPv6Subnet, &l.Attrs.PublicIPv6, &l.Attrs.BackendV6Data},
	}
	for _, f := range fams {
		if !f.on {
			continue
		}
		if !f.cidr.IsValid() {
			return subnet.Lease{}, fmt.Errorf("node %s: no podCIDR of this family: %w", n.Name, errNotLease)
		}
		s, ok := n.Annotations[f.ipName]
		if !ok {
			return subnet.Lease{}, fmt.Errorf("node %s: no %s: %w", n.Name, f.ipName, errNotLease)
		}
		ip, err := parseIP(s, f.v6)
		if err != nil {
			return subnet.Lease{}, fmt.Errorf("node %s: annotation %s: %w", n.Name, f.ipName, err)
		}
		*f.dstSubnet, *f.dstIP = f.cidr, ip
		if typ == subnet.BackendTypeWireGuard || typ == subnet.BackendTypeExtension {
			l.Attrs.BackendType = typ
			if err := l.Attrs.SetDataJSON(f.v6, json.RawMessage(n.Annotations[f.dataName])); err != nil {
				return subnet.Lease{}, fmt.Errorf("node %s: annotation %s: %w", n.Name, f.dataName, err)
			}
			continue
		}
		if typ != subnet.BackendTypeVXLAN {
			continue // other backends' data is not ours to read
		}
		raw, ok := n.Annotations[f.dataName]
		if !ok {
			return subnet.Lease{}, fmt.Errorf("node %s: no %s: %w", n.Name, f.dataName, errNotLease)
		}
		var d *subnet.VXLANData
		if err := json.Unmarshal([]byte(raw), &d); err != nil {
			return subnet.Lease{}, fmt.Errorf("node %s: annotation %s: %w", n.Name, f.dataName, err)
		}
		*f.dstData = d
	}
	return l, nil
}

// sameLease reports whether two leases carry the same subnets and values.
func sameLease(a, b subnet.Lease) bool {
	return a.Subnet == b.Subnet && a.IPv6Subnet == b.IPv6Subnet &&
		a.Attrs.PublicIP == b.Attrs.PublicIP && a.Attrs.PublicIPv6 == b.Attrs.PublicIPv6 &&
		a.Attrs.BackendType == b.Attrs.BackendType &&
		sameData(a.Attrs.BackendData, b.Attrs.BackendData) && sameData(a.Attrs.BackendV6Data, b.Attrs.BackendV6Data) &&
		sameWG(a.Attrs.WireGuard, b.Attrs.WireGuard) && sameWG(a.Attrs.WireGuardV6, b.Attrs.WireGuardV6) &&
		a.Attrs.ExtensionData == b.Attrs.ExtensionData
}

// dataAnnotation is the backend-data annotation of one family: the JSON of
// its data, "null" when there is none (as flanneld writes it).
func dataAnnotation(attrs subnet.LeaseAttrs, v6 bool) (string, error) {
	b, err := attrs.DataJSON(v6)
	if err != nil || b == nil {
		return "null", err
	}
	return string(b), nil
}

func sameData(a, b *subnet.VXLANData) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

func sameWG(a, b *subnet.WireGuardData) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}
