package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/netip"

	"github.com/vishvananda/netlink"

	"github.com/weft-net/weft/internal/ops/inspect"
)

func runExplain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("weftctl explain", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: weftctl explain [flags] <src-ip> <dst-ip>\n\nReads the kernel of the namespace it runs in (run it on the source's node), or with --lab the source's lab node.")
		fs.PrintDefaults()
	}
	var s store
	s.register(fs)
	pos, err := parseArgs(fs, args, 2)
	if err != nil {
		return err
	}
	src, err := netip.ParseAddr(pos[0])
	if err != nil {
		return fmt.Errorf("source: %w", err)
	}
	dst, err := netip.ParseAddr(pos[1])
	if err != nil {
		return fmt.Errorf("destination: %w", err)
	}
	st, err := s.labState()
	if err != nil {
		return err
	}
	ls, cfg, _, err := s.leases(ctx, logger(stderr))
	if err != nil {
		return err
	}
	explain := func(h *netlink.Handle, do func(func() error) error) error {
		p, err := inspect.Explain(h, do, ls, cfg, src, dst)
		if err != nil {
			return err
		}
		if err := p.Render(stdout); err != nil {
			return err
		}
		if n := len(p.Problems()); n > 0 {
			return fmt.Errorf("explain %s → %s: %d problem(s): %w", src, dst, n, errMismatch)
		}
		return nil
	}
	if st == nil {
		h, err := netlink.NewHandle()
		if err != nil {
			return fmt.Errorf("netlink: %w", err)
		}
		defer h.Close()
		return explain(h, nil)
	}
	l, ok := inspect.LeaseFor(ls, src)
	if !ok {
		return fmt.Errorf("--lab: %s is in no lease, so no lab node is its source", src)
	}
	for _, n := range st.Nodes {
		if n.Addr == l.Attrs.PublicIP {
			fmt.Fprintf(stdout, "(read on %s)\n", n.Name)
			return withLabNSDo(n.NS, explain)
		}
	}
	return fmt.Errorf("--lab: no lab node has address %s (lease %s)", l.Attrs.PublicIP, l.Subnet)
}
