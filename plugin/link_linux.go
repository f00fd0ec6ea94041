package plugin

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// bridgeAlias marks a bridge the plugin created (its ifalias): on such a
// bridge every other global address of a family is the plugin's to replace.
const bridgeAlias = "weft: pod bridge"

// ensureBridge returns the node bridge, creating it if needed, up, holding
// the plan's gateway addresses in each family: an address left from an older
// node subnet is replaced rather than refused. On a bridge the plugin did not
// create, addresses outside the cluster Network are the host's and stay.
func ensureBridge(h *netlink.Handle, name string, p plan) (netlink.Link, error) {
	l, err := h.LinkByName(name)
	if _, missing := err.(netlink.LinkNotFoundError); missing {
		la := netlink.NewLinkAttrs()
		la.Name, la.MTU, la.HardwareAddr, la.Flags = name, p.mtu, bridgeMAC(p.gateways), net.FlagUp
		aerr := h.LinkAdd(&netlink.Bridge{LinkAttrs: la})
		if aerr != nil && !errors.Is(aerr, unix.EEXIST) {
			return nil, fmt.Errorf("create bridge %s: %w", name, aerr)
		}
		l, err = h.LinkByName(name)
		if err == nil && aerr == nil {
			if err := h.LinkSetAlias(l, bridgeAlias); err != nil {
				return nil, fmt.Errorf("mark bridge %s as weft's: %w", name, err)
			}
			l, err = h.LinkByName(name)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("find bridge %s: %w", name, err)
	}
	if _, ok := l.(*netlink.Bridge); !ok {
		return nil, types.NewError(types.ErrInvalidNetworkConfig,
			fmt.Sprintf("%s exists and is a %s, not a bridge", name, l.Type()), "set \"bridge\" to another name or delete the device")
	}
	if l.Attrs().Flags&net.FlagUp == 0 {
		if err := h.LinkSetUp(l); err != nil {
			return nil, fmt.Errorf("set bridge %s up: %w", name, err)
		}
	}
	if p.promisc && l.Attrs().Promisc == 0 {
		if err := h.SetPromiscOn(l); err != nil {
			return nil, fmt.Errorf("set bridge %s promiscuous (promiscMode): %w", name, err)
		}
	}
	owned := l.Attrs().Alias == bridgeAlias
	for i, gw := range p.gateways {
		if err := setGateway(h, l, gw, p.networks[i], owned, p.force); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// setGateway adds gw to the bridge and removes the other global addresses of
// its family that are the plugin's to remove: those inside the cluster
// network (an older node subnet, whose pods are gone with it), and on a
// bridge the plugin created (owned) any. A host's own address on a bridge
// it shares with pods is never touched. force is the delegate's
// forceAddress, which means what it means to the bridge plugin: true
// replaces every other IPv4 address and every overlapping IPv6 one; false
// refuses to replace any of them.
func setGateway(h *netlink.Handle, l netlink.Link, gw, network netip.Prefix, owned bool, force *bool) error {
	fam := netlink.FAMILY_V4
	if gw.Addr().Is6() {
		fam = netlink.FAMILY_V6
	}
	addrs, err := h.AddrList(l, fam)
	if err != nil {
		return fmt.Errorf("list addresses of %s: %w", l.Attrs().Name, err)
	}
	have := false
	for _, a := range addrs {
		p, ok := netPrefix(*a.IPNet)
		switch {
		case !ok || p.Addr().IsLinkLocalUnicast():
		case p == gw:
			have = true
		case force != nil && (gw.Addr().Is4() || p.Overlaps(gw)):
			if !*force {
				return fmt.Errorf("%s already has the address %s, not %s, and forceAddress is false: remove it or set forceAddress true", l.Attrs().Name, p, gw)
			}
			if err := h.AddrDel(l, &a); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
				return fmt.Errorf("remove address %s from %s (forceAddress): %w", p, l.Attrs().Name, err)
			}
		case force != nil, !owned && !network.Contains(p.Addr()): // the host's: not ours
		default: // from an older node subnet: pods there are gone with it
			if err := h.AddrDel(l, &a); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
				return fmt.Errorf("remove old address %s from %s: %w", p, l.Attrs().Name, err)
			}
		}
	}
	if have {
		return nil
	}
	if err := h.AddrAdd(l, nlAddr(gw)); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("add gateway %s to %s: %w", gw, l.Attrs().Name, err)
	}
	return nil
}

func nlAddr(p netip.Prefix) *netlink.Addr {
	n := prefixNet(p)
	a := &netlink.Addr{IPNet: &n}
	if p.Addr().Is6() {
		a.Flags = unix.IFA_F_NODAD // usable at once
	}
	return a
}

// addVeth creates the pair in one request: the host end on the bridge, up,
// and the pod end named att.IfName directly inside the pod's namespace.
// mac, if set, is the pod end's (the runtime's mac request).
func addVeth(h *netlink.Handle, br netlink.Link, att Attachment, mtu, nsFd int, hairpin bool, mac net.HardwareAddr) (netlink.Link, error) {
	hostMAC, podMAC := vethMACs(att)
	if mac != nil {
		podMAC = mac
	}
	la := netlink.NewLinkAttrs()
	la.Name, la.MTU, la.HardwareAddr, la.Flags = hostVethName(att), mtu, hostMAC, net.FlagUp
	la.MasterIndex = br.Attrs().Index
	v := &netlink.Veth{LinkAttrs: la, PeerName: att.IfName, PeerHardwareAddr: podMAC, PeerNamespace: netlink.NsFd(nsFd)}
	if err := h.LinkAdd(v); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("create veth %s/%s: %w (is the pod already attached? DEL it first)", la.Name, att.IfName, err)
		}
		return nil, fmt.Errorf("create veth %s/%s: %w", la.Name, att.IfName, err)
	}
	if hairpin {
		if err := h.LinkSetHairpin(v, true); err != nil {
			h.LinkDel(v)
			return nil, fmt.Errorf("set hairpin on %s: %w", la.Name, err)
		}
	}
	return v, nil
}

// configurePod sets the addresses and routes on the pod end and brings it up.
func configurePod(podNS ns.NetNS, att Attachment, addrs []netip.Prefix, p plan) (ifaceInfo, error) {
	ch, err := netlink.NewHandleAt(netns.NsHandle(podNS.Fd()), unix.NETLINK_ROUTE)
	if err != nil {
		return ifaceInfo{}, fmt.Errorf("netlink in %s: %w", podNS.Path(), err)
	}
	defer ch.Close()
	l, err := ch.LinkByName(att.IfName)
	if err != nil {
		return ifaceInfo{}, fmt.Errorf("find %s in %s: %w", att.IfName, podNS.Path(), err)
	}
	for _, a := range addrs {
		if err := ch.AddrAdd(l, nlAddr(a)); err != nil {
			return ifaceInfo{}, fmt.Errorf("add %s to %s: %w", a, att.IfName, err)
		}
	}
	if err := ch.LinkSetUp(l); err != nil {
		return ifaceInfo{}, fmt.Errorf("set %s up: %w", att.IfName, err)
	}
	for _, r := range p.routes {
		nr := &netlink.Route{LinkIndex: l.Attrs().Index, Priority: r.priority}
		if r.gw.IsValid() {
			nr.Gw = r.gw.AsSlice()
		} else {
			nr.Scope = netlink.SCOPE_LINK
		}
		if r.dst.Bits() > 0 {
			d := prefixNet(r.dst)
			nr.Dst = &d
		}
		if err := ch.RouteAdd(nr); err != nil && !errors.Is(err, unix.EEXIST) {
			return ifaceInfo{}, fmt.Errorf("add route %s via %s in pod: %w", r.dst, r.gw, err)
		}
	}
	return ifaceInfo{name: att.IfName, sandbox: podNS.Path(), mac: l.Attrs().HardwareAddr}, nil
}

// deleteVeth deletes the attachment's veth pair before it returns: the host
// end, found by its derived name, and the pod end with it (the kernel
// deletes both ends of a pair together), wherever the pod end is. A missing
// pair is not an error, and a link of that name that is not a veth is not
// weft's: it stays.
func deleteVeth(h *netlink.Handle, att Attachment) error {
	name := hostVethName(att)
	host, err := h.LinkByName(name)
	if _, missing := err.(netlink.LinkNotFoundError); missing {
		return nil // the pair is gone: both ends go together
	}
	if err != nil {
		return fmt.Errorf("find veth %s: %w", name, err)
	}
	if _, veth := host.(*netlink.Veth); !veth {
		return nil
	}
	if err := h.LinkDel(host); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("delete veth %s: %w", name, err)
	}
	return nil
}

// deletePodLink deletes the pod's interface ifName in the namespace at
// netnsPath, as the bridge plugin's DEL does, and with it its host end,
// whatever that is called: so a pod that Flannel's chain (or any bridge
// plugin of this network) wired goes as weft's own do. It deletes only a
// veth whose other end is a port of bridge in h's (the node's) namespace.
// No namespace, no such interface, or a link of another owner is not an
// error and stays.
func deletePodLink(h *netlink.Handle, bridge, netnsPath, ifName string) error {
	if netnsPath == "" {
		return nil
	}
	podNS, err := ns.GetNS(netnsPath)
	if err != nil {
		var gone ns.NSPathNotExistErr
		var notNS ns.NSPathNotNSErr
		if errors.As(err, &gone) || errors.As(err, &notNS) {
			return nil // no namespace there: nothing of the pod's
		}
		return fmt.Errorf("open CNI_NETNS %s: %w", netnsPath, err)
	}
	defer podNS.Close()
	ph, err := netlink.NewHandleAt(netns.NsHandle(podNS.Fd()), unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("netlink in %s: %w", netnsPath, err)
	}
	defer ph.Close()
	pod, err := ph.LinkByName(ifName)
	if _, missing := err.(netlink.LinkNotFoundError); missing {
		return nil
	}
	if err != nil {
		return fmt.Errorf("find %s in %s: %w", ifName, netnsPath, err)
	}
	if _, veth := pod.(*netlink.Veth); !veth {
		return nil
	}
	if ok, err := pairedWithPort(h, ph, int(podNS.Fd()), pod, bridge); err != nil || !ok {
		return err
	}
	if err := ph.LinkDel(pod); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("delete %s in %s: %w", ifName, netnsPath, err)
	}
	return nil
}

// pairedWithPort reports whether pod, a veth in the namespace of ph (whose
// file descriptor is podFd), is paired with a port of bridge in the namespace
// of h, as each end tells: the pod end names h's namespace and the host
// end's index, and the host end, a veth on bridge, names the pod's namespace
// and the pod end's index. An index alone is per namespace, so both
// namespaces are checked by their ids.
func pairedWithPort(h, ph *netlink.Handle, podFd int, pod netlink.Link, bridge string) (bool, error) {
	pa := pod.Attrs()
	if pa.NetNsID < 0 {
		return false, nil // its peer is in the pod's own namespace
	}
	host, err := h.LinkByIndex(pa.ParentIndex)
	if _, missing := err.(netlink.LinkNotFoundError); missing {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("find the peer of %s: %w", pa.Name, err)
	}
	br, err := h.LinkByName(bridge)
	if _, missing := err.(netlink.LinkNotFoundError); missing {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("find bridge %s: %w", bridge, err)
	}
	ha := host.Attrs()
	if _, veth := host.(*netlink.Veth); !veth || ha.MasterIndex != br.Attrs().Index || ha.ParentIndex != pa.Index || ha.NetNsID < 0 {
		return false, nil
	}
	node, err := netns.Get()
	if err != nil {
		return false, fmt.Errorf("open the node namespace: %w", err)
	}
	defer node.Close()
	// Both links were just reported, which gave each namespace an id for
	// the other.
	nodeID, err := ph.GetNetNsIdByFd(int(node))
	if err != nil {
		return false, fmt.Errorf("id of the node namespace in the pod's: %w", err)
	}
	podID, err := h.GetNetNsIdByFd(podFd)
	if err != nil {
		return false, fmt.Errorf("id of the pod namespace in the node's: %w", err)
	}
	return pa.NetNsID == nodeID && ha.NetNsID == podID, nil
}

// enableForwarding turns on forwarding in the plugin's (node) namespace for
// the families in use, writing only when it is off.
func enableForwarding(ranges []Range) error {
	for _, r := range ranges {
		path := "/proc/sys/net/ipv4/ip_forward"
		if r.Subnet.Addr().Is6() {
			path = "/proc/sys/net/ipv6/conf/all/forwarding"
		}
		b, err := os.ReadFile(path)
		if err == nil && strings.TrimSpace(string(b)) == "1" {
			continue
		}
		if err := os.WriteFile(path, []byte("1"), 0o644); err != nil {
			return fmt.Errorf("enable forwarding: %w", err)
		}
	}
	return nil
}
