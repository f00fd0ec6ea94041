package inspect

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
)

// The names of the uvxlan fast path's tc programs (backend/uvxlan).
const (
	FastEgressProgram  = "weft_fp_egress"  // on the TAP's egress: encapsulates and sends through the underlay
	FastIngressProgram = "weft_fp_ingress" // on the underlay's ingress: decapsulates peers' datagrams
	FastBridgeProgram  = "weft_fp_bridge"  // on the pod bridge's egress: hands peers' super-packets to the pod's port
)

// FastPath says which of the uvxlan fast path's programs a node has
// attached. Both bypass netfilter for what they take: datagrams to and
// from the peers in their maps never meet the input, output or
// postrouting hooks of the underlay. The bridge program passes the
// super-packets that came in from peers straight to the pod's port,
// skipping the bridge family's output and postrouting hooks.
type FastPath struct {
	Egress  bool   // FastEgressProgram on the TAP's tcx egress
	Ingress bool   // FastIngressProgram on the underlay's tcx ingress
	Bridge  string // the bridge with FastBridgeProgram on its tcx egress; "" none
}

// Attached reports whether both programs are attached.
func (f FastPath) Attached() bool { return f.Egress && f.Ingress }

// ReadFastPath reads the tcx programs attached to the TAP's egress, the
// underlay's ingress (link indexes; 0 skips one) and the egress of the
// node's bridges (when tap is not 0). do enters the node's
// namespace (nil: the caller's own); BPF queries name links by index in the
// calling thread's namespace.
func ReadFastPath(do func(func() error) error, tap, underlay int) (FastPath, error) {
	if do == nil {
		do = func(f func() error) error { return f() }
	}
	var fp FastPath
	err := do(func() error {
		var err error
		if tap != 0 {
			if fp.Egress, err = hasProgram(tap, ebpf.AttachTCXEgress, FastEgressProgram); err != nil {
				return err
			}
			if fp.Bridge, err = bridgeProgram(); err != nil {
				return err
			}
		}
		if underlay != 0 {
			fp.Ingress, err = hasProgram(underlay, ebpf.AttachTCXIngress, FastIngressProgram)
		}
		return err
	})
	return fp, err
}

// bridgeProgram is the name of the bridge with FastBridgeProgram on its
// egress, "" when none has it.
func bridgeProgram() (string, error) {
	links, err := retry(netlink.LinkList)
	if err != nil {
		return "", fmt.Errorf("list links: %w", err)
	}
	for _, l := range links {
		if l.Type() != "bridge" {
			continue
		}
		if ok, err := hasProgram(l.Attrs().Index, ebpf.AttachTCXEgress, FastBridgeProgram); err != nil || ok {
			return l.Attrs().Name, err
		}
	}
	return "", nil
}

func hasProgram(index int, attach ebpf.AttachType, name string) (bool, error) {
	res, err := link.QueryPrograms(link.QueryOptions{Target: index, Attach: attach})
	if errors.Is(err, ebpf.ErrNotSupported) {
		return false, nil // no tcx: nothing can be attached there
	}
	if err != nil {
		return false, fmt.Errorf("query tc programs of link %d: %w", index, err)
	}
	for _, p := range res.Programs {
		prog, err := ebpf.NewProgramFromID(p.ID)
		if err != nil {
			continue // detached meanwhile
		}
		info, err := prog.Info()
		prog.Close()
		if err == nil && info.Name == name {
			return true, nil
		}
	}
	return false, nil
}
