package namespace

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// UnderlayBridge is the name of the switch (a bridge) inside an underlay
// namespace that test hosts and lab nodes are attached to.
const UnderlayBridge = "sw0"

func nsHandle(fd int) netns.NsHandle { return netns.NsHandle(fd) }

// VethPair is Veth without a testing.TB.
func VethPair(a *NS, nameA string, b *NS, nameB string) error {
	fd, err := openNS(b.Path)
	if err != nil {
		return err
	}
	defer fd.Close()
	la := netlink.NewLinkAttrs()
	la.Name = nameA
	veth := &netlink.Veth{LinkAttrs: la, PeerName: nameB, PeerNamespace: netlink.NsFd(int(fd.Fd()))}
	if err := a.Handle.LinkAdd(veth); err != nil {
		return fmt.Errorf("add veth %s/%s in %s: %w", nameA, nameB, a.Name, err)
	}
	if err := SetUp(a, nameA); err != nil {
		return err
	}
	return SetUp(b, nameB)
}

// SetUp sets the named link up.
func SetUp(n *NS, name string) error {
	l, err := n.Handle.LinkByName(name)
	if err != nil {
		return fmt.Errorf("find %s in %s: %w", name, n.Name, err)
	}
	if err := n.Handle.LinkSetUp(l); err != nil {
		return fmt.Errorf("set %s up in %s: %w", name, n.Name, err)
	}
	return nil
}

// AddAddr adds a CIDR address ("10.0.0.1/24") to the named link.
func AddAddr(n *NS, name string, cidr netip.Prefix) error {
	l, err := n.Handle.LinkByName(name)
	if err != nil {
		return fmt.Errorf("find %s in %s: %w", name, n.Name, err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: cidr.Addr().AsSlice(), Mask: net.CIDRMask(cidr.Bits(), cidr.Addr().BitLen())}}
	if cidr.Addr().Is6() {
		addr.Flags = unix.IFA_F_NODAD // usable at once, no duplicate address detection
	}
	if err := n.Handle.AddrAdd(l, addr); err != nil {
		return fmt.Errorf("add %s to %s in %s: %w", cidr, name, n.Name, err)
	}
	return nil
}

// Bridge creates an up bridge named name in n.
func Bridge(n *NS, name string) error {
	la := netlink.NewLinkAttrs()
	la.Name = name
	if err := n.Handle.LinkAdd(&netlink.Bridge{LinkAttrs: la}); err != nil {
		return fmt.Errorf("add bridge %s in %s: %w", name, n.Name, err)
	}
	return SetUp(n, name)
}

// Enslave attaches link to the bridge, both in n.
func Enslave(n *NS, link, bridge string) error {
	l, err := n.Handle.LinkByName(link)
	if err != nil {
		return err
	}
	br, err := n.Handle.LinkByName(bridge)
	if err != nil {
		return err
	}
	return n.Handle.LinkSetMaster(l, br)
}
