package plugin

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

func cmdCheck(args *skel.CmdArgs) error {
	conf, err := ParseConfig(args.StdinData)
	if err != nil {
		return err
	}
	prev, err := prevResult(conf)
	if err != nil {
		return err
	}
	att := Attachment{ContainerID: args.ContainerID, IfName: args.IfName}
	idx := slices.IndexFunc(prev.Interfaces, func(i *current.Interface) bool { return i.Name == att.IfName && i.Sandbox != "" })
	if idx < 0 {
		return types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf("prevResult has no interface %s in a sandbox", att.IfName), "")
	}
	podNS, err := openNetNS(args.Netns, types.ErrUnknownContainer)
	if err != nil {
		return err
	}
	defer podNS.Close()
	ch, err := netlink.NewHandleAt(netns.NsHandle(podNS.Fd()), unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("netlink in %s: %w", args.Netns, err)
	}
	defer ch.Close()
	l, err := ch.LinkByName(att.IfName)
	if err != nil {
		return types.NewError(types.ErrUnknownContainer, fmt.Sprintf("interface %s not found in %s: %v", att.IfName, args.Netns, err), "")
	}
	want := addrsOf(prev, idx)
	if err := checkAddrs(ch, l, want); err != nil {
		return err
	}
	if err := checkRoutes(ch, prev.Routes); err != nil {
		return err
	}
	return checkHost(conf, att, want)
}

func prevResult(conf *Config) (*current.Result, error) {
	if err := version.ParsePrevResult(&conf.PluginConf); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "decode prevResult: "+err.Error(), "")
	}
	if conf.PrevResult == nil {
		return nil, types.NewError(types.ErrInvalidNetworkConfig, "CHECK needs prevResult", "the runtime must pass the result of ADD")
	}
	r, err := current.NewResultFromResult(conf.PrevResult)
	if err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "convert prevResult: "+err.Error(), "")
	}
	return r, nil
}

func drift(format string, a ...any) error {
	return types.NewError(CodeDrift, fmt.Sprintf(format, a...), "DEL and ADD the pod again to repair it")
}

func checkAddrs(ch *netlink.Handle, l netlink.Link, want []netip.Prefix) error {
	addrs, err := ch.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		return fmt.Errorf("list addresses of %s: %w", l.Attrs().Name, err)
	}
	for _, w := range want {
		if !slices.ContainsFunc(addrs, func(a netlink.Addr) bool { p, _ := netPrefix(*a.IPNet); return p == w }) {
			return drift("address %s missing on %s", w, l.Attrs().Name)
		}
	}
	return nil
}

func checkRoutes(ch *netlink.Handle, want []*types.Route) error {
	routes, err := ch.RouteList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return fmt.Errorf("list routes in pod: %w", err)
	}
	for _, w := range want {
		wd, _ := netPrefix(w.Dst)
		found := slices.ContainsFunc(routes, func(r netlink.Route) bool {
			d := netip.PrefixFrom(netip.IPv4Unspecified(), 0)
			if wd.Addr().Is6() {
				d = netip.PrefixFrom(netip.IPv6Unspecified(), 0)
			}
			if r.Dst != nil {
				d, _ = netPrefix(*r.Dst)
			}
			return d == wd && (w.GW == nil || w.GW.Equal(r.Gw))
		})
		if !found {
			return drift("route %s via %s missing in pod", wd, w.GW)
		}
	}
	return nil
}

// checkHost verifies the host end is on the bridge and the store still
// holds the pod's addresses.
func checkHost(conf *Config, att Attachment, want []netip.Prefix) error {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("netlink: %w", err)
	}
	defer h.Close()
	hl, err := h.LinkByName(hostVethName(att))
	if err != nil {
		return drift("host veth %s missing: %v", hostVethName(att), err)
	}
	br, err := h.LinkByName(conf.Bridge)
	if err != nil || hl.Attrs().MasterIndex != br.Attrs().Index {
		return drift("host veth %s is not attached to bridge %s", hl.Attrs().Name, conf.Bridge)
	}
	store, err := openStore(conf)
	if err != nil {
		return err
	}
	defer store.Close()
	held, err := lookup(store, att)
	if err != nil {
		return err
	}
	for _, w := range want {
		if !slices.Contains(held, w.Addr()) {
			return drift("address %s is not allocated to %s/%s", w.Addr(), att.ContainerID, att.IfName)
		}
	}
	return nil
}
