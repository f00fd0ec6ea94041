package web

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/weft-net/weft/internal/namespace"
	"github.com/weft-net/weft/internal/ops/inspect"
	"github.com/weft-net/weft/internal/ops/lab"
)

// LabSource reads a lab: the leases through Leases, each node's kernel
// and /metrics inside its namespace, the pods' wiring inside theirs.
type LabSource struct {
	Dir    string // the lab's state directory
	Leases Leases
	Source string // what Leases reads, e.g. "etcd"

	mu   sync.Mutex
	pods map[string]inspect.PodLink // pod namespace → its wiring, read once
}

var _ Source = (*LabSource)(nil)

// Snapshot reads the leases and every lab node.
func (s *LabSource) Snapshot(ctx context.Context) (*Snapshot, error) {
	st, err := lab.LoadState(s.Dir)
	if err != nil {
		return nil, err
	}
	ls, cfg, err := s.Leases(ctx)
	if err != nil {
		return nil, err
	}
	obs := make([]Observation, len(st.Nodes))
	var wg sync.WaitGroup
	for i, n := range st.Nodes {
		wg.Go(func() { obs[i] = s.observe(ctx, st, n) })
	}
	wg.Wait()
	return Build(time.Now(), s.Source, cfg, ls, obs), nil
}

// observe reads one lab node.
func (s *LabSource) observe(ctx context.Context, st *lab.State, n lab.NodeState) Observation {
	o := Observation{Name: n.Name, Underlay: n.Addr, Pods: []Pod{}}
	ns, err := lab.OpenNS(n.NS)
	if err != nil {
		o.Err = err
		return o
	}
	defer ns.Handle.Close()
	o.Kernel, o.Counters, o.Err = readNode(ctx, ns.Handle, func(ctx context.Context) (int, string, error) {
		return lab.Get(ctx, ns, "http://"+lab.HealthAddr+"/metrics")
	})
	for _, p := range st.Pods {
		if p.Node != n.Name {
			continue
		}
		pod := Pod{Name: p.Name, IP: p.IP.String()}
		if pl, err := s.podLink(p, ns.Handle); err == nil {
			pod.Veth, o.Bridge = pl.HostVeth, pl.Bridge
		}
		o.Pods = append(o.Pods, pod)
	}
	return o
}

// readNode reads a node's overlay device and its weftd's counters.
func readNode(ctx context.Context, h *netlink.Handle, get func(context.Context) (int, string, error)) (*inspect.Kernel, *Counters, error) {
	k, kerr := inspect.ReadKernel(h, "")
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	code, body, err := get(ctx)
	if err == nil && code != 200 {
		err = fmt.Errorf("status %d", code)
	}
	if err != nil {
		return k, nil, fmt.Errorf("weftd /metrics: %w", err)
	}
	c, err := ParseCounters(body)
	if err != nil {
		return k, nil, err
	}
	if kerr != nil {
		return nil, c, kerr
	}
	if l, err := h.LinkByIndex(k.Device.Index); err == nil && l.Attrs().Statistics != nil {
		// The fast path's frames pass the TAP by: its counters see only
		// the userspace path's.
		c.TxBytes, c.RxBytes = l.Attrs().Statistics.TxBytes+c.fastTx, l.Attrs().Statistics.RxBytes+c.fastRx
	}
	return k, c, nil
}

// podLink reads (once) how a lab pod is wired into its node.
func (s *LabSource) podLink(p lab.PodState, node *netlink.Handle) (inspect.PodLink, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if pl, ok := s.pods[p.NS]; ok {
		return pl, nil
	}
	ns, err := namespace.OpenNamed(p.NS)
	if err != nil {
		return inspect.PodLink{}, err
	}
	defer ns.Handle.Close()
	pl, err := inspect.ReadPodLink(ns.Handle, node, p.IP)
	if err != nil {
		return pl, fmt.Errorf("pod %s: %w", p.Name, err)
	}
	if s.pods == nil {
		s.pods = map[string]inspect.PodLink{}
	}
	s.pods[p.NS] = pl
	return pl, nil
}

// Path explains src → dst on the source's node, as `weftctl explain
// --lab` does, with the lab pods' ends around it.
func (s *LabSource) Path(ctx context.Context, src, dst netip.Addr) (*PathView, error) {
	st, err := lab.LoadState(s.Dir)
	if err != nil {
		return nil, err
	}
	ls, cfg, err := s.Leases(ctx)
	if err != nil {
		return nil, err
	}
	l, ok := inspect.LeaseFor(ls, src)
	if !ok {
		return nil, fmt.Errorf("%s is in no lease, so no lab node is its source", src)
	}
	var node *lab.NodeState
	for i := range st.Nodes {
		if st.Nodes[i].Addr == l.Attrs.PublicIP {
			node = &st.Nodes[i]
		}
	}
	if node == nil {
		return nil, fmt.Errorf("no lab node has address %s (lease %s)", l.Attrs.PublicIP, l.Subnet)
	}
	ns, err := lab.OpenNS(node.NS)
	if err != nil {
		return nil, err
	}
	defer ns.Handle.Close()
	p, err := inspect.Explain(ns.Handle, ns.Do, ls, cfg, src, dst)
	if err != nil {
		return nil, err
	}
	return Compose(p, node.Name, s.podEnd(st, src), s.podEnd(st, dst)), nil
}

// podEnd returns the lab pod holding ip with its wiring, or nil.
func (s *LabSource) podEnd(st *lab.State, ip netip.Addr) *PodEnd {
	for _, p := range st.Pods {
		if p.IP != ip {
			continue
		}
		n, ok := st.Node(p.Node)
		if !ok {
			return nil
		}
		ns, err := lab.OpenNS(n.NS)
		if err != nil {
			return nil
		}
		defer ns.Handle.Close()
		pl, err := s.podLink(p, ns.Handle)
		if err != nil {
			return nil
		}
		return &PodEnd{Pod: p.Name, Node: p.Node, Link: pl}
	}
	return nil
}
