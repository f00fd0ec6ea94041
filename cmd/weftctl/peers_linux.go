package main

import (
	"context"
	"flag"
	"fmt"
	"io"

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
		return peers(stdout, h, *device, ls, cfg, from)
	}
	var bad int
	for _, n := range st.Nodes {
		if *node != "" && n.Name != *node {
			continue
		}
		fmt.Fprintf(stdout, "== %s (%s, %s)\n", n.Name, n.Addr, n.Backend)
		err := withLabNS(n.NS, func(h *netlink.Handle) error { return peers(stdout, h, *device, ls, cfg, from) })
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
// expected as peers: weftd never programs them.
func peers(w io.Writer, h *netlink.Handle, device string, ls []subnet.Lease, cfg *subnet.Config, from string) error {
	if self, ok := inspect.SelfLeaseByAddr(h, inspect.SelfCandidates(cfg, ls)); ok && device == "" && self.Attrs.BackendType == subnet.BackendTypeHostGW {
		ls, rejected := inspect.CheckLeases(cfg, self, ls)
		inspect.RenderRejected(w, rejected)
		return hostGWPeers(w, h, self, ls, from)
	}
	k, err := inspect.ReadKernel(h, device)
	if err != nil {
		return err
	}
	self, ok := inspect.SelfLease(inspect.SelfCandidates(cfg, ls), k)
	if !ok {
		return fmt.Errorf("none of the %d leases in %s belongs to this node (device %s, addresses %v): %w", len(ls), from, k.Device.Name, k.Device.Addrs, errMismatch)
	}
	fmt.Fprintf(w, "this node: subnet %s, public IP %s; leases from %s\n", self.Subnet, self.Attrs.PublicIP, from)
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
