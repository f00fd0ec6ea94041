package plugin

import (
	"errors"
	"fmt"
	"net/netip"

	cnins "github.com/containernetworking/cni/pkg/ns"
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/plugins/ipam/host-local/backend/disk"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func cmdAdd(args *skel.CmdArgs) error {
	conf, err := ParseConfig(args.StdinData)
	if err != nil {
		return err
	}
	file, err := readSubnetFile(conf.SubnetFile)
	if err != nil {
		return err
	}
	netns, err := openNetNS(args.Netns, types.ErrInvalidEnvironmentVariables)
	if err != nil {
		return err
	}
	defer netns.Close()
	// skel makes this check only after ADD has run; make it before.
	if same, terr := cnins.CheckNetNS(args.Netns); terr != nil {
		return terr
	} else if same {
		return types.NewError(types.ErrInvalidNetNS, fmt.Sprintf("CNI_NETNS %s is the plugin's own (node) namespace", args.Netns),
			"CNI_NETNS must be the pod's namespace")
	}
	req, err := conf.parseRequest(args.Args)
	if err != nil {
		return types.NewError(types.ErrInvalidNetworkConfig, err.Error(), "")
	}
	dns := conf.dns()
	if conf.IPAM.ResolvConf != "" && dns.Nameservers == nil && dns.Search == nil && dns.Options == nil && dns.Domain == "" {
		if dns, err = readResolvConf(conf.IPAM.ResolvConf); err != nil {
			return types.NewError(types.ErrInvalidNetworkConfig, err.Error(), "ipam.resolvConf names a resolv.conf file to copy into the result")
		}
	}
	att := Attachment{ContainerID: args.ContainerID, IfName: args.IfName}
	// Flannel's state file first, as Flannel writes it before its
	// delegate runs: a DEL after a failed or cut ADD still finds it.
	if dir := conf.stateDir(); dir != "" {
		st, err := flannelState(args.StdinData, file)
		if err == nil {
			err = writeState(dir, att.ContainerID, st)
		}
		if err != nil {
			return err
		}
	}
	res, err := add(conf, newPlan(file, conf), att, req, netns)
	if err != nil {
		removeState(conf.stateDir(), att.ContainerID)
		return err
	}
	res.DNS = dns
	return types.PrintResult(res, conf.CNIVersion)
}

// openNetNS opens CNI_NETNS; failures carry code.
func openNetNS(path string, code uint) (ns.NetNS, error) {
	n, err := ns.GetNS(path)
	if err != nil {
		return nil, types.NewError(code, fmt.Sprintf("open CNI_NETNS %q: %v", path, err),
			"CNI_NETNS must be the path of the pod's network namespace, such as /var/run/netns/<name>")
	}
	return n, nil
}

// add wires one pod; on failure it removes what it made (veth, addresses)
// before returning. The bridge is node state and stays.
func add(conf *Config, p plan, att Attachment, req request, netns ns.NetNS) (_ *current.Result, err error) {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink: %w", err)
	}
	defer h.Close()
	br, err := ensureBridge(h, conf.Bridge, p)
	if err != nil {
		return nil, err
	}
	store, err := openStore(conf)
	if err != nil {
		return nil, err
	}
	defer store.Close()
	addrs, err := allocate(store, att, p.ranges, req.ips)
	if errors.Is(err, ErrRequested) {
		return nil, types.NewError(types.ErrInvalidNetworkConfig, err.Error(), "request an address of the node subnet that no pod holds, or none")
	}
	if errors.Is(err, ErrExhausted) {
		return nil, types.NewError(types.ErrTryAgainLater, err.Error(), "every address of the node subnet is taken: delete pods or give nodes larger subnets (SubnetLen)")
	}
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			release(store, att)
		}
	}()
	host, err := addVeth(h, br, att, p.mtu, int(netns.Fd()), conf.hairpin(), req.mac)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			h.LinkDel(host)
		}
	}()
	pod, err := configurePod(netns, att, addrs, p)
	if err != nil {
		return nil, err
	}
	// Under the store lock: a DEL removing the network's last pod drops its
	// masquerade chain under the same lock (dropMasqIfUnused).
	if err := locked(store, func() error { return ensureMasq(conf.Name, p.masq) }); err != nil {
		return nil, err
	}
	if len(p.gateways) > 0 { // the bridge plugin forwards only as a gateway
		if err := enableForwarding(p.ranges); err != nil {
			return nil, err
		}
	}
	hostMAC, _ := vethMACs(att)
	return buildResult(conf.dns(), p,
		ifaceInfo{name: conf.Bridge, mac: br.Attrs().HardwareAddr},
		ifaceInfo{name: host.Attrs().Name, mac: hostMAC},
		pod, addrs), nil
}

// cmdDel deletes the pod's veth pair, frees its addresses and drops
// the network's masquerade chains with its last pod. Nothing of it is left
// for later: an ADD of the same attachment right after it starts clean.
func cmdDel(args *skel.CmdArgs) error {
	conf, err := ParseConfigForDel(args.StdinData)
	if err != nil {
		return err
	}
	att := Attachment{ContainerID: args.ContainerID, IfName: args.IfName}
	if err := deleteLinks(conf, att, args.Netns); err != nil {
		return err
	}
	store, err := openStore(conf)
	if err != nil {
		return err
	}
	defer store.Close()
	if err := release(store, att); err != nil {
		return err
	}
	if err := removeState(conf.stateDir(), att.ContainerID); err != nil {
		return err
	}
	return dropMasqIfUnused(store, conf)
}

// deleteLinks deletes the attachment's veth pair: the pod's interface in
// netnsPath if its host end is on the bridge (whoever wired it), else weft's
// host end by its derived name (the pod's namespace is gone, or its
// interface renamed).
func deleteLinks(conf *Config, att Attachment, netnsPath string) error {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("netlink: %w", err)
	}
	defer h.Close()
	if err := deletePodLink(h, conf.Bridge, netnsPath, att.IfName); err != nil {
		return err
	}
	return deleteVeth(h, att)
}

// dropMasqIfUnused removes the network's masquerade chains once no pod of
// it holds an address. It runs under the store lock, as ADD's ensureMasq
// does, so an ADD racing with it either holds an address already (the chain
// stays) or writes the chain again afterwards.
func dropMasqIfUnused(s *disk.Store, conf *Config) error {
	return locked(s, func() error {
		held, err := holdersIn(conf.storeDir())
		if err != nil || len(held) > 0 {
			return err
		}
		return removeMasq(conf.Name)
	})
}

func cmdGC(args *skel.CmdArgs) error {
	conf, err := ParseConfigForDel(args.StdinData) // GC reads what DEL reads
	if err != nil {
		return err
	}
	store, err := openStore(conf)
	if err != nil {
		return err
	}
	defer store.Close()
	gone, err := gc(store, conf.storeDir(), conf.ValidAttachments)
	var errs []error
	for _, a := range gone {
		errs = append(errs, deleteLinks(conf, a, ""), removeState(conf.stateDir(), a.ContainerID))
	}
	if err == nil {
		err = dropMasqIfUnused(store, conf)
	}
	return errors.Join(append(errs, err)...)
}

func cmdStatus(args *skel.CmdArgs) error {
	conf, err := ParseConfig(args.StdinData)
	if err != nil {
		return err
	}
	if _, err := readSubnetFile(conf.SubnetFile); err != nil {
		msg := err.Error()
		if e, ok := err.(*types.Error); ok {
			msg = e.Msg
		}
		return types.NewError(types.ErrPluginNotAvailable, "not ready: "+msg,
			"weft can add pods once weftd (or flanneld) has written a readable subnet file")
	}
	return nil
}

// addrsOf converts a result's IPs on interface idx to prefixes.
func addrsOf(r *current.Result, idx int) []netip.Prefix {
	var out []netip.Prefix
	for _, ip := range r.IPs {
		if ip.Interface != nil && *ip.Interface == idx {
			if p, ok := netPrefix(ip.Address); ok {
				out = append(out, p)
			}
		}
	}
	return out
}
