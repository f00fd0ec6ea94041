package lab

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"errors"
	"net/netip"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/weft-net/weft/internal/namespace"
	"github.com/weft-net/weft/internal/ops/connectivity"
	"github.com/weft-net/weft/internal/ops/inspect"
	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/vtep"
)

// Leases lists the leases in the lab's etcd.
func Leases(ctx context.Context, cli *clientv3.Client, st *State) ([]subnet.Lease, error) {
	ls, err := listed(ctx, cli, st)
	return inspect.Leases(ls), err
}

// listed is Leases with the TTL each etcd lease was granted for.
func listed(ctx context.Context, cli *clientv3.Client, st *State) ([]inspect.Listed, error) {
	ls, bad, err := inspect.EtcdLeases(ctx, cli, st.EtcdPfx)
	if err == nil && len(bad) > 0 {
		err = fmt.Errorf("unreadable leases: %v", bad)
	}
	return ls, err
}

// Config reads the lab's network config from its etcd.
func Config(ctx context.Context, cli *clientv3.Client, st *State) (*subnet.Config, error) {
	return inspect.EtcdConfig(ctx, cli, st.EtcdPfx)
}

// NodePeers reads node n's overlay device and compares it with the leases
// that pass weftd's checks against cfg; it returns the others as rejected.
func NodePeers(n *namespace.NS, leases []subnet.Lease, cfg *subnet.Config) (*inspect.Kernel, []inspect.Peer, []inspect.Rejected, error) {
	k, err := inspect.ReadKernel(n.Handle, "")
	if err != nil {
		return nil, nil, nil, fmt.Errorf("%s: %w", n.Name, err)
	}
	self, ok := inspect.SelfLease(inspect.SelfCandidates(cfg, leases), k)
	if !ok {
		return k, nil, nil, fmt.Errorf("%s: no lease matches device %s", n.Name, k.Device.Name)
	}
	leases, rejected := inspect.CheckLeases(cfg, self, leases)
	return k, inspect.Compare(k, vtep.FromLeases(leases, self)), rejected, nil
}

// waitConverged waits until etcd holds one lease per node and every node
// has programmed every other node's subnet exactly as the leases say.
func (l *Lab) waitConverged(ctx context.Context) error {
	var last error
	for {
		if last = l.converged(ctx); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %w", last, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (l *Lab) converged(ctx context.Context) error {
	ls, err := Leases(ctx, l.cli, l.State)
	if err != nil {
		return err
	}
	cfg, err := Config(ctx, l.cli, l.State)
	if err != nil {
		return err
	}
	for _, n := range l.nodes {
		_, peers, rejected, err := NodePeers(n.ns, ls, cfg)
		if err != nil {
			return err
		}
		if accepted := len(ls) - len(rejected); accepted != len(l.nodes) {
			return fmt.Errorf("%w: %d leases (%d rejected) for %d nodes", errNotConverged, accepted, len(rejected), len(l.nodes))
		}
		if len(peers) != len(l.nodes)-1 || inspect.Mismatches(peers) > 0 {
			return fmt.Errorf("%w: %s has %d peers, %d not as leased", errNotConverged, n.state.Name, len(peers), inspect.Mismatches(peers))
		}
	}
	return nil
}

// PingMatrix pings every pod from every other pod once and makes one
// short TCP exchange per pair (sources in parallel, destinations in turn),
// all from sockets opened inside the pod namespaces. Each pod runs a TCP
// echo server on an ephemeral port for the duration.
func PingMatrix(pods []PodState, nss map[string]*namespace.NS, timeout time.Duration) (*Matrix, error) {
	names := make([]string, len(pods))
	servers := make([]*connectivity.TCPServer, len(pods))
	defer func() {
		for _, s := range servers {
			if s != nil {
				s.Close()
			}
		}
	}()
	for i, p := range pods {
		names[i] = p.Name
		s, err := connectivity.ListenTCP(nss[p.NS].Do, netip.AddrPortFrom(netip.IPv4Unspecified(), 0))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p.Name, err)
		}
		servers[i] = s
	}
	m := NewMatrix(names)
	var wg sync.WaitGroup
	errs := make([]error, len(pods))
	for i, src := range pods {
		wg.Go(func() {
			do := connectivity.Do(nss[src.NS].Do)
			pg, err := connectivity.NewPinger(do)
			if err != nil {
				errs[i] = fmt.Errorf("%s: %w", src.Name, err)
				return
			}
			defer pg.Close()
			for j, dst := range pods {
				if i == j {
					continue
				}
				_, err := pg.Ping(dst.IP, 84, false, timeout)
				m.OK[i][j] = err == nil
				_, err = connectivity.TCPExchange(context.Background(), do, netip.AddrPortFrom(dst.IP, servers[j].Addr().Port()), timeout)
				m.TCP[i][j] = err == nil
			}
		})
	}
	wg.Wait()
	return m, errors.Join(errs...)
}

// Matrix pings every pair of the lab's pods.
func (l *Lab) Matrix() (*Matrix, error) {
	return PingMatrix(l.State.Pods, l.ns, time.Second)
}

// Report prints the leases, each node's VTEP table and the pod matrix.
func (l *Lab) Report(ctx context.Context, w io.Writer) (*Matrix, error) {
	all, err := listed(ctx, l.cli, l.State)
	if err != nil {
		return nil, err
	}
	ls := inspect.Leases(all)
	cfg, err := Config(ctx, l.cli, l.State)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(w, "Leases in etcd (%s/subnets/):\n", l.State.EtcdPfx)
	inspect.RenderLeases(w, all, inspect.DefaultRenewMargin, time.Now())
	for _, n := range l.nodes {
		fmt.Fprintf(w, "\n%s (%s, %s, weftd pid %d):\n", n.state.Name, n.state.Addr, n.state.Backend, n.state.Weftd.PID)
		k, peers, rejected, err := NodePeers(n.ns, ls, cfg)
		if err != nil {
			return nil, err
		}
		inspect.RenderRejected(w, rejected)
		inspect.RenderPeers(w, k, peers)
	}
	fmt.Fprintln(w, "\nPods:")
	for _, p := range l.State.Pods {
		fmt.Fprintf(w, "  %-14s %-15s on %s\n", p.Name, p.IP, p.Node)
	}
	m, err := l.Matrix()
	if err != nil {
		return nil, err
	}
	fmt.Fprintln(w, "\nPod-to-pod connectivity (one ping and one TCP exchange per pair):")
	return m, m.Render(w)
}
