package plugin

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
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
	owned := l.Attrs().Alias == bridgeAlias
	for i, gw := range p.gateways {
		if err := setGateway(h, l, gw, p.networks[i], owned); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// setGateway adds gw to the bridge and removes the other global addresses of
// its family that are the plugin's to remove: those inside the cluster
// network (an older node subnet, whose pods are gone with it), and on a
// bridge the plugin created (owned) any. A host's own address on a bridge
// it shares with pods is never touched.
func setGateway(h *netlink.Handle, l netlink.Link, gw, network netip.Prefix, owned bool) error {
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
		case !owned && !network.Contains(p.Addr()): // the host's: not ours
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
func addVeth(h *netlink.Handle, br netlink.Link, att Attachment, mtu, nsFd int, hairpin bool) (netlink.Link, error) {
	hostMAC, podMAC := vethMACs(att)
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
		nr := &netlink.Route{LinkIndex: l.Attrs().Index, Gw: r.gw.AsSlice()}
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

// retiredPrefix starts the name of a retired veth end, followed by its
// ifindex (unique in its namespace, so names never collide).
const retiredPrefix = "weftrm"

// retireHostVeth takes the attachment's veth pair out of service without
// waiting for the kernel to delete it, which takes ~15 ms per request (an
// rcu_barrier): the host end goes down (the pod end loses its carrier, so
// the pod can send nothing more), leaves the bridge, is renamed
// weftrm<ifindex> and joins RetiredGroup; the pod end in podNS, if that is
// still open, is renamed too, so a new attachment may reuse both names at
// once. It reports whether a retired link awaits deletion by reapRetired.
// A kernel that refuses any step gets the pair deleted right away instead.
func retireHostVeth(att Attachment, podNS string) (retired bool, err error) {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return false, fmt.Errorf("netlink: %w", err)
	}
	defer h.Close()
	name := hostVethName(att)
	l, err := h.LinkByName(name)
	if _, missing := err.(netlink.LinkNotFoundError); missing {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("find veth %s: %w", name, err)
	}
	if err := retire(l); err != nil {
		if err := h.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
			return false, fmt.Errorf("delete veth %s: %w", name, err)
		}
		return false, nil
	}
	renamePodEnd(podNS, att.IfName, l.Attrs().Index)
	return true, nil
}

// retire sets l down, without master, in RetiredGroup and renamed, in one
// RTM_NEWLINK request (the kernel renames before it applies the flags, and
// renames links that are up; an older one answers EBUSY and gets a second
// request once the link is down).
func retire(l netlink.Link) error {
	req := nl.NewNetlinkRequest(unix.RTM_NEWLINK, unix.NLM_F_ACK)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(l.Attrs().Index)
	msg.Change = unix.IFF_UP // flags stay 0: down
	req.AddData(msg)
	req.AddData(nl.NewRtAttr(unix.IFLA_MASTER, nl.Uint32Attr(0)))
	req.AddData(nl.NewRtAttr(unix.IFLA_GROUP, nl.Uint32Attr(RetiredGroup)))
	rename := nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(retiredPrefix+strconv.Itoa(l.Attrs().Index)))
	req.AddData(rename)
	_, err := req.Execute(unix.NETLINK_ROUTE, 0)
	if errors.Is(err, unix.EBUSY) {
		if err := netlink.LinkSetDown(l); err != nil {
			return err
		}
		_, err = req.Execute(unix.NETLINK_ROUTE, 0)
	}
	return err
}

// renamePodEnd frees ifName in the pod's namespace when it is the peer of
// the retired host end hostIdx. Best effort: the namespace may be gone (and
// the pair with it), and a pod end left named only blocks a new ADD into the
// same namespace until the reaper has run.
func renamePodEnd(podNS, ifName string, hostIdx int) {
	if podNS == "" {
		return
	}
	f, err := os.Open(podNS)
	if err != nil {
		return
	}
	defer f.Close()
	ch, err := netlink.NewHandleAt(netns.NsHandle(f.Fd()), unix.NETLINK_ROUTE)
	if err != nil {
		return
	}
	defer ch.Close()
	l, err := ch.LinkByName(ifName)
	if err != nil {
		return
	}
	if _, veth := l.(*netlink.Veth); !veth || l.Attrs().ParentIndex != hostIdx {
		return
	}
	ch.LinkSetName(l, retiredPrefix+strconv.Itoa(l.Attrs().Index))
}

// reapRetired deletes every retired veth of the current namespace in one
// request (one rcu_barrier for all of them); none is fine.
func reapRetired() error {
	req := nl.NewNetlinkRequest(unix.RTM_DELLINK, unix.NLM_F_ACK)
	req.AddData(nl.NewIfInfomsg(unix.AF_UNSPEC))
	req.AddData(nl.NewRtAttr(unix.IFLA_GROUP, nl.Uint32Attr(RetiredGroup)))
	if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("delete retired veths: %w", err)
	}
	return nil
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
