package daemon

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/weft-net/weft/backend"
	"github.com/weft-net/weft/subnet"
)

// networkAvailabler is implemented by registries that mark the node's
// network as available once the dataplane is programmed (Kubernetes).
// note, when not empty, is added to the condition's message.
type networkAvailabler interface {
	SetNetworkAvailable(ctx context.Context, note string) error
}

// session runs the dataplane, the watch and the renewals for one lease. It
// returns errLeaseLost when the lease is gone, or ctx's error.
func (d *Daemon) session(ctx context.Context, cfg *subnet.Config, typ string, lease subnet.Lease) error {
	mtu := d.overlayMTU(cfg, typ)
	dp, err := d.cfg.Factories.Dataplane(typ, cfg, lease, mtu)
	if err != nil {
		return fmt.Errorf("daemon: %s dataplane: %w", typ, err)
	}
	if dp.Close != nil {
		defer dp.Close()
	}
	note := ""
	if fb := dp.Fallback; fb != nil {
		note = fmt.Sprintf("%s in place of %s: %s", fb.Type, typ, fb.Reason)
		d.cfg.Metrics.setFallback(typ, fb)
	}
	if dp.Cleanup != nil {
		if err := dp.Cleanup(); err != nil {
			d.log.Warn("cannot remove the other backend's state", "err", err)
		}
	}
	d.lease.Store(&lease)

	g, gctx := errgroup.WithContext(ctx)
	if d.cfg.IPMasq && d.cfg.Factories.Masquerade != nil {
		masq, err := d.cfg.Factories.Masquerade(cfg, lease)
		if err != nil {
			return fmt.Errorf("daemon: masquerade: %w", err)
		}
		g.Go(func() error { return masq.Run(gctx) })
	}
	written, err := d.subnetFile(gctx, g, cfg, typ, lease, mtu)
	if err != nil {
		return err
	}
	g.Go(func() error { return dp.Backend.Run(gctx) })
	for _, r := range dp.Runners {
		g.Go(func() error { return r.Run(gctx) })
	}
	g.Go(func() error { return d.watch(gctx, cfg, lease, dp.Backend) })
	g.Go(func() error { return d.renew(gctx, lease) })
	g.Go(func() error { return d.watchPresence(gctx) })
	g.Go(func() error { return d.awaitReady(gctx, dp.Backend, written, note) })
	return g.Wait()
}

// subnetFile writes the subnet file for lease and returns a channel closed
// once it is written: at once, or with network policy on, by a goroutine
// of g once the first policy table committed (it starts the policy
// controller in g too).
func (d *Daemon) subnetFile(gctx context.Context, g *errgroup.Group, cfg *subnet.Config, typ string, lease subnet.Lease, mtu int) (<-chan struct{}, error) {
	written := make(chan struct{})
	if d.cfg.Factories.Policy != nil {
		// The CNI plugin wires no pod before the subnet file exists: with
		// policy on it is written once the first table committed, so no
		// pod starts (and opens connections that conntrack then keeps)
		// before the node enforces its policies. The controller does not
		// need the file.
		// An earlier run's (or session's) file would let the plugin wire
		// pods meanwhile: it goes until then.
		if err := os.Remove(d.cfg.SubnetFile); err == nil {
			d.log.Info("removed the subnet file until the network policy table commits", "path", d.cfg.SubnetFile)
		} else if !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("daemon: remove the subnet file until the policy table commits: %w", err)
		}
		ps := d.newPolicySession()
		pol, err := d.cfg.Factories.Policy(cfg, lease, ps)
		if err != nil {
			return nil, fmt.Errorf("daemon: network policy: %w", err)
		}
		g.Go(func() error { return pol.Run(gctx) })
		g.Go(func() error {
			if d.awaitPolicy(gctx, ps) != nil {
				return nil
			}
			if err := d.writeSubnetFile(cfg, lease, d.podMTU(typ, lease, mtu)); err != nil {
				return err
			}
			close(written)
			return nil
		})
		return written, nil
	}
	if err := d.writeSubnetFile(cfg, lease, d.podMTU(typ, lease, mtu)); err != nil {
		return nil, err
	}
	close(written)
	return written, nil
}

// writeSubnetFile writes the subnet file of lease, which tells the CNI
// plugin the node's subnets and MTU.
func (d *Daemon) writeSubnetFile(cfg *subnet.Config, lease subnet.Lease, mtu int) error {
	file := subnet.File{MTU: mtu, IPMasq: d.cfg.IPMasq}
	if lease.Subnet.IsValid() {
		file.Network, file.Subnet = cfg.Network, subnet.GatewayPrefix(lease.Subnet)
	}
	if lease.IPv6Subnet.IsValid() {
		file.IPv6Network, file.IPv6Subnet = cfg.IPv6Network, subnet.GatewayPrefix(lease.IPv6Subnet)
	}
	if err := subnet.WriteFile(d.cfg.SubnetFile, file); err != nil {
		return fmt.Errorf("daemon: %w", err)
	}
	d.log.Info("wrote subnet file", "path", d.cfg.SubnetFile, "subnet", file.Subnet, "ipv6Subnet", file.IPv6Subnet, "mtu", mtu)
	return nil
}

func (d *Daemon) awaitReady(ctx context.Context, b backend.Backend, written <-chan struct{}, note string) error {
	for _, ch := range []<-chan struct{}{b.Ready(), written} {
		select {
		case <-ctx.Done():
			return nil
		case <-ch:
		}
	}
	if na, ok := d.cfg.Registry.(networkAvailabler); ok {
		for {
			err := na.SetNetworkAvailable(ctx, note)
			if err == nil {
				break
			}
			d.log.Warn("cannot mark the node's network available, retrying", "err", err)
			if sleep(ctx, d.retryDelay()) != nil {
				return nil
			}
		}
	}
	d.ready.Store(true)
	d.cfg.Metrics.setReady(d.Ready())
	d.log.Info("dataplane programmed, ready")
	if d.cfg.Notifier != nil && !d.notified.Swap(true) {
		if err := d.cfg.Notifier.Notify("READY=1"); err != nil {
			d.log.Warn("cannot tell the service manager that weftd is ready", "err", err)
		}
	}
	return nil
}

// awaitPolicy waits for the first network policy transaction that
// committed the cluster's state, saying every minute that it waits.
func (d *Daemon) awaitPolicy(ctx context.Context, ps *policySession) error {
	tick := time.NewTicker(time.Minute)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ps.first:
			return nil
		case <-tick.C:
			d.log.Warn("not ready, and no subnet file for the CNI plugin, until network policy is programmed from the API server's state")
		}
	}
}
