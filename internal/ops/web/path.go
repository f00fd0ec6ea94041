package web

import (
	"fmt"
	"strings"

	"github.com/weft-net/weft/internal/ops/inspect"
)

// PathView is a packet's path as the page shows it: explain's hops, read
// on the source's node, between the hops of the pod ends when the
// addresses are pods whose namespaces could be read.
type PathView struct {
	Src      string    `json:"src"`
	Dst      string    `json:"dst"`
	ReadOn   string    `json:"readOn"`
	Hops     []HopView `json:"hops"`
	Problems int       `json:"problems"`
	// Explain is explain's own text (inspect.Path.Render), as `weftctl
	// explain` prints it.
	Explain string `json:"explain"`
}

// HopView is one hop and the kernel object (or lease) that decides it.
type HopView struct {
	Step    string `json:"step"`
	Object  string `json:"object"`
	Detail  string `json:"detail"`
	Problem string `json:"problem"`
	Explain bool   `json:"explain"` // one of explain's hops (else a pod end's)
}

// PodEnd is a pod at one end of the path.
type PodEnd struct {
	Pod, Node string
	Link      inspect.PodLink
}

// Compose builds the view of p, read on the node readOn, with the pod ends
// src and dst (nil when the address is no pod the source could read).
func Compose(p *inspect.Path, readOn string, src, dst *PodEnd) *PathView {
	v := &PathView{Src: p.Src.String(), Dst: p.Dst.String(), ReadOn: readOn}
	var b strings.Builder
	p.Render(&b)
	v.Explain = b.String()
	if src != nil {
		v.Hops = append(v.Hops, leaving(*src)...)
	}
	var back []HopView // the way back (explain's "return"), drawn after the destination
	for _, h := range p.Hops {
		hv := HopView{Step: h.Step, Object: object(h.Step, p, readOn), Detail: h.Detail, Problem: h.Problem, Explain: true}
		if h.Step == "return" {
			back = append(back, hv)
			continue
		}
		v.Hops = append(v.Hops, hv)
	}
	if dst != nil && !p.Outside {
		v.Hops = append(v.Hops, arriving(*dst)...)
	}
	v.Hops = append(v.Hops, back...)
	v.Problems = len(p.Problems())
	return v
}

func leaving(e PodEnd) []HopView {
	gw := "no default route"
	if e.Link.Gateway.IsValid() {
		gw = "default via " + e.Link.Gateway.String()
	}
	return []HopView{
		{Step: "pod " + e.Link.Iface, Object: fmt.Sprintf("interface %s in pod %s", e.Link.Iface, e.Pod),
			Detail: fmt.Sprintf("%s leaves %s by %s (%s), %s", e.Link.Addr.Addr(), e.Pod, e.Link.Iface, e.Link.Addr, gw)},
		{Step: "veth", Object: fmt.Sprintf("veth pair %s ↔ %s on %s", e.Link.Iface, e.Link.HostVeth, e.Node),
			Detail: fmt.Sprintf("the frame comes out of %s's end %s on %s", e.Pod, e.Link.HostVeth, e.Node)},
		{Step: "bridge", Object: fmt.Sprintf("bridge %s on %s", dash(e.Link.Bridge), e.Node),
			Detail: fmt.Sprintf("%s is a port of %s, the gateway's bridge: %s routes the packet", e.Link.HostVeth, dash(e.Link.Bridge), e.Node)},
	}
}

func arriving(e PodEnd) []HopView {
	return []HopView{
		{Step: "bridge", Object: fmt.Sprintf("bridge %s on %s", dash(e.Link.Bridge), e.Node),
			Detail: fmt.Sprintf("%s routes its own subnet to %s, which forwards the frame to port %s", e.Node, dash(e.Link.Bridge), e.Link.HostVeth)},
		{Step: "veth", Object: fmt.Sprintf("veth pair %s ↔ %s on %s", e.Link.HostVeth, e.Link.Iface, e.Node),
			Detail: fmt.Sprintf("%s carries the frame into pod %s", e.Link.HostVeth, e.Pod)},
		{Step: "pod " + e.Link.Iface, Object: fmt.Sprintf("interface %s in pod %s", e.Link.Iface, e.Pod),
			Detail: fmt.Sprintf("%s receives it on %s (%s)", e.Link.Addr.Addr(), e.Link.Iface, e.Link.Addr)},
	}
}

// object names what decides an explain hop.
func object(step string, p *inspect.Path, on string) string {
	dev := dash(p.OverlayDev)
	switch step {
	case "source", "destination":
		return "lease in the datastore"
	case "local":
		return "the node's bridge"
	case "route":
		if p.Outside || p.OverlayDev == "" {
			return "route in " + on + "'s main table"
		}
		return fmt.Sprintf("route on %s in %s's main table", dev, on)
	case "neighbour":
		return fmt.Sprintf("neighbour entry on %s", dev)
	case "fdb":
		return fmt.Sprintf("FDB entry on VXLAN device %s", dev)
	case "vtep table":
		return fmt.Sprintf("weftd's VTEP table for TAP %s", dev)
	case "underlay":
		return fmt.Sprintf("route to %s on %s", addr(p.UnderlayDst), dash(p.UnderlayDev))
	case "encapsulate":
		return fmt.Sprintf("UDP to the peer's address %s", addr(p.UnderlayDst))
	case "mtu":
		return fmt.Sprintf("MTU of %s and %s", dev, dash(p.UnderlayDev))
	case "deliver":
		return fmt.Sprintf("decapsulation on %s", addr(p.UnderlayDst))
	case "masquerade":
		return "nftables table ip weft-ipv4"
	case "return":
		return fmt.Sprintf("uvxlan's fast-path programs on %s", on)
	}
	return step
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
