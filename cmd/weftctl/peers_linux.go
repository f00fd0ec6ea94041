package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/netip"

	"github.com/vishvananda/netlink"

	"github.com/weft-net/weft/internal/ops/inspect"
	"github.com/weft-net/weft/internal/ops/lab"
	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/vtep"
)

func runPeers(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("weftctl peers", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var s store
	s.register(fs)
	device := fs.String("device", "", "overlay device (default: weft.<VNI>, weft-u.<VNI> or flannel.<VNI>, found)")
	node := fs.String("node", "", "with --lab: the lab node to read (default: every node)")
	if err := parse(fs, args, 0); err != nil {
		return err
	}
	st, err := s.labState()
	if err != nil {
		return err
	}
	ls, cfg, from, err := s.leases(ctx, logger(stderr))
	if err != nil {
		return err
	}
	if st == nil {
		h, err := netlink.NewHandle()
		if err != nil {
			return fmt.Errorf("netlink: %w", err)
		}
		defer h.Close()
		return peers(stdout, h, nil, *device, ls, cfg, from)
	}
	var bad int
	for _, n := range st.Nodes {
		if *node != "" && n.Name != *node {
			continue
		}
		fmt.Fprintf(stdout, "== %s (%s, %s)\n", n.Name, n.Addr, n.Backend)
		err := withLabNSDo(n.NS, func(h *netlink.Handle, do func(func() error) error) error {
			return peers(stdout, h, do, *device, ls, cfg, from)
		})
		if err != nil {
			fmt.Fprintln(stdout, err)
			bad++
		}
	}
	if bad > 0 {
		return fmt.Errorf("%d node(s): %w", bad, errMismatch)
	}
	return nil
}

// peers prints the overlay state in h's namespace against the leases and
// fails with errMismatch when they differ. Leases that fail weftd's checks
// against cfg (subnet.Config.CheckLease) are listed as rejected, not
// expected as peers: weftd never programs them. On a TAP it says which path
// carries the peers (do enters h's namespace; nil: the caller's own).
func peers(w io.Writer, h *netlink.Handle, do func(func() error) error, device string, ls []subnet.Lease, cfg *subnet.Config, from string) error {
	if self, ok := inspect.SelfLeaseByAddr(h, inspect.SelfCandidates(cfg, ls)); ok && device == "" && self.Attrs.BackendType == subnet.BackendTypeHostGW {
		ls, rejected := inspect.CheckLeases(cfg, self, ls)
		inspect.RenderRejected(w, rejected)
		return hostGWPeers(w, h, self, ls, from)
	}
	k, err := inspect.ReadKernel(h, device)
	if err != nil {
		return err
	}
	if k.Device.Kind == inspect.KindWireGuard {
		return fmt.Errorf("%s is a WireGuard device: peers compares the routes and neighbours a VXLAN device has per peer, which WireGuard does not use (weftd logs each peer it sets)", k.Device.Name)
	}
	self, ok := inspect.SelfLease(inspect.SelfCandidates(cfg, ls), k)
	if !ok {
		return fmt.Errorf("none of the %d leases in %s belongs to this node (device %s, addresses %v): %w", len(ls), from, k.Device.Name, k.Device.Addrs, errMismatch)
	}
	fmt.Fprintf(w, "this node: subnet %s, public IP %s; leases from %s\n", self.Subnet, self.Attrs.PublicIP, from)
	if k.Device.Kind == inspect.KindTAP {
		fmt.Fprintln(w, tapDataplane(h, do, k, cfg, self.Attrs.PublicIP))
	}
	ls, rejected := inspect.CheckLeases(cfg, self, ls)
	inspect.RenderRejected(w, rejected)
	ps := inspect.Compare(k, vtep.FromLeases(ls, self))
	if err := inspect.RenderPeers(w, k, ps); err != nil {
		return err
	}
	if n := inspect.Mismatches(ps); n > 0 {
		return fmt.Errorf("%d of %d peers: %w", n, len(ps), errMismatch)
	}
	fmt.Fprintf(w, "all %d peers programmed as leased\n", len(ps))
	return nil
}

// tapDataplane describes a uvxlan node's dataplane: whether it runs in
// place of the configured vxlan, and whether the fast path carries its
// IPv4 peers. local is the node's underlay address.
func tapDataplane(h *netlink.Handle, do func(func() error) error, k *inspect.Kernel, cfg *subnet.Config, local netip.Addr) string {
	line := "dataplane: uvxlan (" + k.Device.Name + ")"
	if cfg != nil && cfg.Backend.Type == subnet.BackendTypeVXLAN {
		line += " while the network config asks for vxlan: weftd fell back to it because the kernel has no VXLAN driver " +
			"(weft_backend_fallback in /metrics, weftctl doctor says how to install it), or runs --backend uvxlan"
	}
	u := linkHolding(h, local)
	fp, err := inspect.ReadFastPath(do, k.Device.Index, u)
	if u == 0 { // an advertised address the node does not hold (NAT): judge by the TAP's program
		fp.Ingress = fp.Egress
	}
	switch {
	case err != nil:
		return line + "; fast path: unknown (" + err.Error() + ")"
	case fp.Attached() && fp.Bridge != "":
		return line + "; fast path attached: IPv4 peers routed through the underlay device go through tc programs in the kernel, the others through weftd; " +
			"on " + fp.Bridge + "'s egress, peers' TCP super-packets go to the pods' ports whole"
	case fp.Attached():
		return line + "; fast path attached: IPv4 peers routed through the underlay device go through tc programs in the kernel, the others through weftd"
	case fp.Egress || fp.Ingress:
		return line + "; fast path half attached (weftd attaches both again at its next sync): the userspace path carries the rest"
	}
	return line + "; no fast path: weftd carries every peer (userspace path)"
}

// linkHolding returns the index of the link holding addr, 0 when none.
func linkHolding(h *netlink.Handle, addr netip.Addr) int {
	addrs, err := h.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return 0
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() == addr {
			return a.LinkIndex
		}
	}
	return 0
}

// withLabNSDo runs f with a netlink handle bound to a lab namespace and a
// function that runs code inside it.
func withLabNSDo(name string, f func(*netlink.Handle, func(func() error) error) error) error {
	n, err := lab.OpenNS(name)
	if err != nil {
		return err
	}
	defer n.Handle.Close()
	return f(n.Handle, n.Do)
}

// withLabNS runs f with a netlink handle bound to a lab namespace.
func withLabNS(name string, f func(*netlink.Handle) error) error {
	n, err := lab.OpenNS(name)
	if err != nil {
		return err
	}
	defer n.Handle.Close()
	return f(n.Handle)
}

// hostGWPeers prints a host-gw node's routes against the leases and fails
// with errMismatch when a peer is not routed as leased or not on-link.
func hostGWPeers(w io.Writer, h *netlink.Handle, self subnet.Lease, ls []subnet.Lease, from string) error {
	fmt.Fprintf(w, "this node: subnet %s, public IP %s; leases from %s\n", self.Subnet, self.Attrs.PublicIP, from)
	routes, err := inspect.WeftRoutes(h)
	if err != nil {
		return err
	}
	ps := inspect.CompareHostGW(routes, vtep.FromLeasesOf(subnet.BackendTypeHostGW, ls, self), inspect.OnLinkFunc(h))
	if err := inspect.RenderHostGWPeers(w, ps); err != nil {
		return err
	}
	if n := inspect.HostGWMismatches(ps); n > 0 {
		return fmt.Errorf("%d of %d peers: %w", n, len(ps), errMismatch)
	}
	fmt.Fprintf(w, "all %d peers routed as leased\n", len(ps))
	return nil
}
