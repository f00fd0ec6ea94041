package kubecluster

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/weft-net/weft/internal/namespace"
)

func (s *State) underlayNS() string { return s.Prefix + "ul" }

// CPNetNS is the name of the control plane's network namespace.
func (s *State) CPNetNS() string { return s.Prefix + "cp" }

// addNS creates a namespace and records it before anything else is done
// in it, so that Down removes it even if Up fails next.
func (s *State) addNS(name string) (*namespace.NS, error) {
	n, err := namespace.CreateNamed(name)
	if err != nil {
		return nil, fmt.Errorf("kubecluster: %w", err)
	}
	s.Namespaces = append(s.Namespaces, name)
	return n, s.save()
}

// buildUnderlay makes the underlay namespace with its bridge (at
// underlayGW, the members' default gateway, which forwards nothing).
func (s *State) buildUnderlay() (*namespace.NS, error) {
	ul, err := s.addNS(s.underlayNS())
	if err != nil {
		return nil, err
	}
	if err := namespace.Bridge(ul, namespace.UnderlayBridge); err != nil {
		return nil, err
	}
	return ul, namespace.AddAddr(ul, namespace.UnderlayBridge, netip.PrefixFrom(underlayGW, underlayNet.Bits()))
}

// attach makes a namespace named name, wires its eth0 to the underlay
// bridge with address ip and a default route through the bridge, and
// enables IPv4 forwarding in it (a node prerequisite, as kubeadm's checks
// demand).
func (s *State) attach(ul *namespace.NS, name string, ip netip.Addr) (*namespace.NS, error) {
	n, err := s.addNS(name)
	if err != nil {
		return nil, err
	}
	port := strings.TrimPrefix(name, s.Prefix)
	if err := namespace.VethPair(ul, port, n, "eth0"); err != nil {
		return nil, err
	}
	if err := namespace.Enslave(ul, port, namespace.UnderlayBridge); err != nil {
		return nil, fmt.Errorf("kubecluster: attach %s: %w", name, err)
	}
	if err := namespace.AddAddr(n, "eth0", netip.PrefixFrom(ip, underlayNet.Bits())); err != nil {
		return nil, err
	}
	gw := &netlink.Route{Gw: net.IP(underlayGW.AsSlice())}
	if err := n.Handle.RouteAdd(gw); err != nil {
		return nil, fmt.Errorf("kubecluster: default route in %s: %w", name, err)
	}
	err = n.Do(func() error {
		return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644)
	})
	if err != nil {
		return nil, fmt.Errorf("kubecluster: ip_forward in %s: %w", name, err)
	}
	return n, nil
}

// routePodCIDR routes a node's podCIDR in the control plane's namespace
// through that node, so that the API server reaches pods (proxy
// subresources, webhooks), as it would on a control-plane node that runs
// weft itself.
func routePodCIDR(cpNS, cidr, via string) error {
	n, err := namespace.OpenNamed(cpNS)
	if err != nil {
		return fmt.Errorf("kubecluster: %w", err)
	}
	defer n.Handle.Close()
	_, dst, err := net.ParseCIDR(cidr)
	if err != nil {
		return fmt.Errorf("kubecluster: podCIDR %q: %w", cidr, err)
	}
	r := &netlink.Route{Dst: dst, Gw: net.ParseIP(via)}
	if err := n.Handle.RouteReplace(r); err != nil {
		return fmt.Errorf("kubecluster: route %s via %s: %w", cidr, via, err)
	}
	return nil
}

func netnsPath(name string) string { return filepath.Join(namespace.RunDir, name) }
