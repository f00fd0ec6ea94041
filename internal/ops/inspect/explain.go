package inspect

import (
	"fmt"
	"io"
	"net/netip"

	"github.com/weft-net/weft/subnet"
)

// Hop is one step of a packet's path, with what the live state says about
// it; Problem is set when the state is not what the leases call for.
type Hop struct {
	Step    string
	Detail  string
	Problem string
}

// Path is the explained way from Src to Dst.
type Path struct {
	Src, Dst           netip.Addr
	SrcLease, DstLease *subnet.Lease
	// Resolved by the kernel of the node the explanation was read on.
	OverlayDev   string
	Gateway      netip.Addr
	VTEPMAC      subnet.MAC
	UnderlayDst  netip.Addr
	UnderlayDev  string
	UnderlaySrc  netip.Addr
	InnerMTU     int
	UnderlayMTU  int
	Encapsulated bool
	// Encapsulator is who wraps the frame: EncapKernel, EncapFastPath or
	// EncapUserspace; "" when it is not encapsulated.
	Encapsulator string
	Outside      bool // the destination is outside the cluster network
	Hops         []Hop
	replyBridge  string // the bridge whose fast-path program hands the replies to pods of the node read
}

// Who encapsulates (Path.Encapsulator).
const (
	EncapKernel    = "kernel"    // a kernel VXLAN device
	EncapFastPath  = "fast path" // uvxlan's tc program on the TAP's egress, in the kernel
	EncapUserspace = "userspace" // weftd reads the frame from the TAP
)

// Problems returns the hops that found something wrong.
func (p *Path) Problems() []Hop {
	var out []Hop
	for _, h := range p.Hops {
		if h.Problem != "" {
			out = append(out, h)
		}
	}
	return out
}

func (p *Path) add(step, format string, args ...any) *Hop {
	p.Hops = append(p.Hops, Hop{Step: step, Detail: fmt.Sprintf(format, args...)})
	return &p.Hops[len(p.Hops)-1]
}

// Render prints the path as numbered hops, problems marked with "!!".
func (p *Path) Render(w io.Writer) error {
	if _, err := fmt.Fprintf(w, "%s → %s\n", p.Src, p.Dst); err != nil {
		return err
	}
	for i, h := range p.Hops {
		fmt.Fprintf(w, "%2d. %-13s %s\n", i+1, h.Step, h.Detail)
		if h.Problem != "" {
			fmt.Fprintf(w, "    !! %s\n", h.Problem)
		}
	}
	if n := len(p.Problems()); n > 0 {
		_, err := fmt.Fprintf(w, "%d problem(s) found\n", n)
		return err
	}
	return nil
}

func leaseLine(l subnet.Lease) string {
	mac := "-"
	if l.Attrs.BackendData != nil {
		mac = l.Attrs.BackendData.VtepMAC.String()
	}
	return fmt.Sprintf("subnet %s of node %s (VTEP MAC %s)", l.Subnet, addrOrDash(l.Attrs.PublicIP), mac)
}

// locate fills the first hops: which node owns each address. A
// destination outside the cluster network is no problem: it leaves
// through the node's own routes (see explainOut).
func (p *Path) locate(leases []subnet.Lease, cfg *subnet.Config) {
	if l, ok := LeaseFor(leases, p.Src); ok {
		p.SrcLease = &l
		p.add("source", "%s is in %s", p.Src, leaseLine(l))
	} else {
		p.add("source", "%s is in no lease (a node or outside address)", p.Src)
	}
	if l, ok := LeaseFor(leases, p.Dst); ok {
		p.DstLease = &l
		p.add("destination", "%s is in %s", p.Dst, leaseLine(l))
	} else if p.Outside = cfg != nil && !inNetwork(cfg, p.Dst); p.Outside {
		p.add("destination", "%s is outside the cluster network: it leaves the overlay at the source's node", p.Dst)
	} else {
		h := p.add("destination", "%s is in no lease", p.Dst)
		h.Problem = "no node owns the destination's subnet: it is not a pod address of this cluster (or its node's lease expired)"
	}
}

func inNetwork(cfg *subnet.Config, a netip.Addr) bool {
	return cfg.Network.IsValid() && cfg.Network.Contains(a) || cfg.IPv6Network.IsValid() && cfg.IPv6Network.Contains(a)
}
