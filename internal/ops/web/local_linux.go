package web

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/weft-net/weft/internal/ops/inspect"
)

// NodeSource reads a real cluster from one node: every lease through
// Leases, and this node's kernel (the namespace weftctl runs in) and its
// weftd's /metrics at HealthAddr. The other nodes are drawn from their
// leases only, and a path is read on this node, as `weftctl explain` reads
// it (run it on the source's node for a path that starts there).
type NodeSource struct {
	Leases     Leases
	Source     string // what Leases reads, e.g. "etcd"
	HealthAddr string // weftd's health address, e.g. 127.0.0.1:9470
	Name       string // this node's name (default: the host name)
}

var _ Source = (*NodeSource)(nil)

// Snapshot reads the leases and this node.
func (s *NodeSource) Snapshot(ctx context.Context) (*Snapshot, error) {
	ls, cfg, err := s.Leases(ctx)
	if err != nil {
		return nil, err
	}
	h, err := netlink.NewHandle()
	if err != nil {
		return nil, fmt.Errorf("netlink: %w", err)
	}
	defer h.Close()
	o := Observation{Name: s.name(), Pods: []Pod{}}
	o.Kernel, o.Counters, o.Err = readNode(ctx, h, s.metrics)
	if o.Kernel != nil {
		if self, ok := inspect.SelfLease(inspect.SelfCandidates(cfg, ls), o.Kernel); ok {
			o.Underlay = self.Attrs.PublicIP
		}
	}
	return Build(time.Now(), s.Source, cfg, ls, []Observation{o}), nil
}

func (s *NodeSource) name() string {
	if s.Name != "" {
		return s.Name
	}
	if h, err := os.Hostname(); err == nil {
		return h
	}
	return "this node"
}

func (s *NodeSource) metrics(ctx context.Context) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.HealthAddr+"/metrics", nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b), err
}

// Path explains src → dst on this node.
func (s *NodeSource) Path(ctx context.Context, src, dst netip.Addr) (*PathView, error) {
	ls, cfg, err := s.Leases(ctx)
	if err != nil {
		return nil, err
	}
	h, err := netlink.NewHandle()
	if err != nil {
		return nil, fmt.Errorf("netlink: %w", err)
	}
	defer h.Close()
	p, err := inspect.Explain(h, nil, ls, cfg, src, dst)
	if err != nil {
		return nil, err
	}
	return Compose(p, s.name(), nil, nil), nil
}
