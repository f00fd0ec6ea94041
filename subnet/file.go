package subnet

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// DefaultSubnetFile is where flanneld writes its subnet file; weft uses the
// same path so that either CNI plugin can read either daemon's file.
const DefaultSubnetFile = "/run/flannel/subnet.env"

// File is the content of the subnet file (Flannel's subnet.env).
type File struct {
	Network     netip.Prefix // FLANNEL_NETWORK
	Subnet      netip.Prefix // FLANNEL_SUBNET: first host address of the node subnet, with its length
	IPv6Network netip.Prefix // FLANNEL_IPV6_NETWORK
	IPv6Subnet  netip.Prefix // FLANNEL_IPV6_SUBNET
	MTU         int          // FLANNEL_MTU
	IPMasq      bool         // FLANNEL_IPMASQ: the daemon masquerades, so the plugin must not
}

// GatewayPrefix returns the first host address of a node subnet with the
// subnet's length (10.244.59.0/24 → 10.244.59.1/24), as FLANNEL_SUBNET holds it.
func GatewayPrefix(subnet netip.Prefix) netip.Prefix {
	if !subnet.IsValid() {
		return netip.Prefix{}
	}
	return netip.PrefixFrom(subnet.Masked().Addr().Next(), subnet.Bits())
}

// Marshal renders the file in flanneld's variable order.
func (f File) Marshal() []byte {
	var b bytes.Buffer
	if f.Network.IsValid() {
		fmt.Fprintf(&b, "FLANNEL_NETWORK=%s\n", f.Network)
	}
	if f.Subnet.IsValid() {
		fmt.Fprintf(&b, "FLANNEL_SUBNET=%s\n", f.Subnet)
	}
	if f.IPv6Network.IsValid() {
		fmt.Fprintf(&b, "FLANNEL_IPV6_NETWORK=%s\n", f.IPv6Network)
	}
	if f.IPv6Subnet.IsValid() {
		fmt.Fprintf(&b, "FLANNEL_IPV6_SUBNET=%s\n", f.IPv6Subnet)
	}
	fmt.Fprintf(&b, "FLANNEL_MTU=%d\n", f.MTU)
	fmt.Fprintf(&b, "FLANNEL_IPMASQ=%t\n", f.IPMasq)
	return b.Bytes()
}

// WriteFile writes f to path atomically: a temporary file in the same
// directory, fsynced, renamed over path, mode 0644. The directory is created.
func WriteFile(path string, f File) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("write subnet file: %w", err)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("write subnet file: %w", err)
	}
	defer os.Remove(tmp.Name()) // no-op after a successful rename
	_, err = tmp.Write(f.Marshal())
	if err == nil {
		err = tmp.Chmod(0o644)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("write subnet file %s: %w", path, err)
	}
	return nil
}

// ErrIncompleteFile is returned by ReadFile for a file that lacks a variable
// the CNI plugin needs.
var ErrIncompleteFile = errors.New("incomplete subnet file")

// ReadFile reads a subnet file written by weftd or flanneld. Unknown
// variables are ignored; a file without a network and subnet of at least one
// family, or without FLANNEL_MTU or FLANNEL_IPMASQ, is ErrIncompleteFile.
func ReadFile(path string) (File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return File{}, fmt.Errorf("read subnet file: %w", err)
	}
	f, err := ParseFile(data)
	if err != nil {
		return File{}, fmt.Errorf("read subnet file %s: %w", path, err)
	}
	return f, nil
}

// ParseFile parses the content of a subnet file; see ReadFile.
func ParseFile(data []byte) (File, error) {
	var f File
	var haveMTU, haveMasq bool
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return File{}, fmt.Errorf("line %d: %q is not KEY=VALUE", n, line)
		}
		v = strings.Trim(strings.TrimSpace(v), `"'`)
		var err error
		switch strings.TrimSpace(k) {
		case "FLANNEL_NETWORK":
			f.Network, err = parseFilePrefix(v, false)
		case "FLANNEL_SUBNET":
			f.Subnet, err = parseFilePrefix(v, false)
		case "FLANNEL_IPV6_NETWORK":
			f.IPv6Network, err = parseFilePrefix(v, true)
		case "FLANNEL_IPV6_SUBNET":
			f.IPv6Subnet, err = parseFilePrefix(v, true)
		case "FLANNEL_MTU":
			f.MTU, err = strconv.Atoi(v)
			if err == nil && (f.MTU < 68 || f.MTU > 65535) {
				err = fmt.Errorf("%d is not a usable MTU", f.MTU)
			}
			haveMTU = true
		case "FLANNEL_IPMASQ":
			f.IPMasq, err = strconv.ParseBool(v)
			haveMasq = true
		}
		if err != nil {
			return File{}, fmt.Errorf("line %d: %s: %w", n, k, err)
		}
	}
	if err := sc.Err(); err != nil {
		return File{}, err
	}
	v4 := f.Network.IsValid() && f.Subnet.IsValid()
	v6 := f.IPv6Network.IsValid() && f.IPv6Subnet.IsValid()
	switch {
	case !v4 && !v6:
		return File{}, fmt.Errorf("%w: FLANNEL_NETWORK and FLANNEL_SUBNET (or the IPV6 pair) are required", ErrIncompleteFile)
	case !haveMTU:
		return File{}, fmt.Errorf("%w: FLANNEL_MTU is required", ErrIncompleteFile)
	case !haveMasq:
		return File{}, fmt.Errorf("%w: FLANNEL_IPMASQ is required", ErrIncompleteFile)
	}
	return f, nil
}

func parseFilePrefix(s string, v6 bool) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	if p.Addr().Is6() != v6 {
		return netip.Prefix{}, fmt.Errorf("%s: wrong address family", s)
	}
	return p, nil
}
