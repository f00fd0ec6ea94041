package daemon

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net/netip"
	"os"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/weft-net/weft/backend"
	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/vtep"
)

// errLeaseLost ends a session: our key was deleted or taken over.
var errLeaseLost = errors.New("lease lost")

// networkAvailabler is implemented by registries that mark the node's
// network as available once the dataplane is programmed (Kubernetes).
// note, when not empty, is added to the condition's message.
type networkAvailabler interface {
	SetNetworkAvailable(ctx context.Context, note string) error
}

// leaseLoop acquires a lease and runs a session on it; when the lease is
// lost it acquires again, preferring the same subnet.
func (d *Daemon) leaseLoop(ctx context.Context, cfg *subnet.Config, typ string) error {
	attrs := d.attrs(cfg, typ)
	if d.cfg.Factories.LeaseData != nil {
		if err := d.cfg.Factories.LeaseData(ctx, typ, cfg, &attrs); err != nil {
			return fmt.Errorf("daemon: lease data: %w", err)
		}
	}
	hints := d.previousSubnets()
	for {
		lease, err := d.acquire(ctx, attrs, hints)
		if err != nil {
			return err
		}
		err = d.session(ctx, cfg, typ, lease)
		if !errors.Is(err, errLeaseLost) {
			return err
		}
		d.ready.Store(false)
		d.cfg.Metrics.setReady(false)
		d.cfg.Metrics.lost()
		d.log.Warn("our lease was deleted or taken over, acquiring again", "subnet", lease.Subnet)
		hints = []netip.Prefix{lease.Subnet, lease.IPv6Subnet}
	}
}

// attrs is the lease value this node advertises. A uvxlan node advertises
// "vxlan" as well: on the wire it is VXLAN. host-gw and alloc leases
// carry the public addresses and no backend data, as Flannel writes them; a
// wireguard lease gets its data (the public key) from Factories.LeaseData,
// an extension lease its data (what PreStartupCommand printed) likewise.
func (d *Daemon) attrs(cfg *subnet.Config, typ string) subnet.LeaseAttrs {
	if typ == subnet.BackendTypeHostGW || typ == subnet.BackendTypeAlloc || typ == subnet.BackendTypeWireGuard ||
		typ == subnet.BackendTypeExtension {
		a := subnet.LeaseAttrs{BackendType: subnet.LeaseBackendType(typ)}
		if cfg.EnableIPv4 {
			a.PublicIP = d.cfg.Node.PublicIP
		}
		if cfg.EnableIPv6 {
			a.PublicIPv6 = d.cfg.Node.PublicIPv6
		}
		return a
	}
	a := subnet.LeaseAttrs{BackendType: subnet.BackendTypeVXLAN}
	if cfg.EnableIPv4 {
		a.PublicIP = d.cfg.Node.PublicIP
		a.BackendData = &subnet.VXLANData{VNI: cfg.Backend.VNI, VtepMAC: vtep.DeviceMAC(d.cfg.Node.PublicIP, cfg.Backend.VNI)}
	}
	if cfg.EnableIPv6 && d.cfg.Node.PublicIPv6.IsValid() {
		a.PublicIPv6 = d.cfg.Node.PublicIPv6
		a.BackendV6Data = &subnet.VXLANData{VNI: cfg.Backend.VNI, VtepMAC: vtep.DeviceMAC(d.cfg.Node.PublicIPv6, cfg.Backend.VNI)}
	}
	return a
}

// previousSubnets are the node subnets, IPv4 and IPv6, named in an existing
// subnet file (flanneld's FLANNEL_SUBNET and FLANNEL_IPV6_SUBNET); the
// registry reuses them when this node has no lease any more.
func (d *Daemon) previousSubnets() []netip.Prefix {
	f, err := subnet.ReadFile(d.cfg.SubnetFile)
	if err != nil {
		return nil
	}
	var hints []netip.Prefix
	for _, p := range []netip.Prefix{f.Subnet, f.IPv6Subnet} {
		if p.IsValid() {
			hints = append(hints, p.Masked())
		}
	}
	return hints
}

func (d *Daemon) acquire(ctx context.Context, attrs subnet.LeaseAttrs, hints []netip.Prefix) (subnet.Lease, error) {
	if err := d.awaitPresence(ctx); err != nil {
		return subnet.Lease{}, err
	}
	for {
		lease, err := d.cfg.Registry.Acquire(ctx, attrs, hints...)
		d.setWaiting(err)
		if err == nil {
			d.cfg.Metrics.acquired()
			d.log.Info("acquired lease", "subnet", lease.Subnet, "ipv6Subnet", lease.IPv6Subnet,
				"publicIP", lease.Attrs.PublicIP, "publicIPv6", lease.Attrs.PublicIPv6, "expires", lease.Expiration)
			return lease, nil
		}
		if ctx.Err() != nil {
			return subnet.Lease{}, ctx.Err()
		}
		d.log.Error("cannot acquire a subnet lease, retrying", "err", err, "retryIn", d.retryDelay())
		if err := sleep(ctx, d.retryDelay()); err != nil {
			return subnet.Lease{}, err
		}
	}
}

// overlayMTU is the MTU of the overlay device and of pods. Without
// encapsulation (host-gw, alloc, and extension, whose commands weft does not
// know) it is the underlay's MTU, as Flannel's.
func (d *Daemon) overlayMTU(cfg *subnet.Config, typ string) int {
	underlay := d.cfg.Node.UnderlayMTU
	if typ == subnet.BackendTypeHostGW || typ == subnet.BackendTypeAlloc || typ == subnet.BackendTypeExtension {
		return underlay
	}
	if typ == subnet.BackendTypeWireGuard { // Flannel's: the configured or underlay MTU minus 80
		if cfg.Backend.MTU != 0 {
			underlay = cfg.Backend.MTU
		}
		return underlay - wireGuardOverhead
	}
	if cfg.Backend.MTU != 0 {
		underlay = cfg.Backend.MTU
	}
	return vtep.OverlayMTU(underlay, !d.cfg.Node.PublicIP.IsValid())
}

// podMTU is the pods' MTU (FLANNEL_MTU) for overlay MTU mtu: on a dual-stack
// node of vxlan or uvxlan, whose IPv6 device has an IPv6 outer header and so
// an MTU 20 bytes below mtu (the IPv4 device's), that smaller one, so that
// pods' full-size IPv6 packets fit without path-MTU discovery; else mtu.
func (d *Daemon) podMTU(typ string, lease subnet.Lease, mtu int) int {
	vxlan := typ == subnet.BackendTypeVXLAN || typ == subnet.BackendTypeUVXLAN
	if vxlan && lease.Subnet.IsValid() && lease.IPv6Subnet.IsValid() && d.cfg.Node.PublicIP.IsValid() {
		return mtu - (vtep.OverheadIPv6 - vtep.OverheadIPv4)
	}
	return mtu
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
	written := make(chan struct{}) // closed once the subnet file is written
	var ps *policySession
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
			return fmt.Errorf("daemon: remove the subnet file until the policy table commits: %w", err)
		}
		ps = d.newPolicySession()
		pol, err := d.cfg.Factories.Policy(cfg, lease, ps)
		if err != nil {
			return fmt.Errorf("daemon: network policy: %w", err)
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
	} else {
		if err := d.writeSubnetFile(cfg, lease, d.podMTU(typ, lease, mtu)); err != nil {
			return err
		}
		close(written)
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

// renew keeps the lease alive: RenewMargin before it expires, and after a
// failure again every RetryInterval, or sooner as the expiry nears, so that a
// datastore outage shorter than the margin never costs the lease. Each
// attempt is bounded by a third of the time left, so one call that hangs on a
// dead etcd member cannot use up the margin. A lease without expiry needs
// nothing.
func (d *Daemon) renew(ctx context.Context, lease subnet.Lease) error {
	for !lease.Expiration.IsZero() {
		wait := time.Until(lease.Expiration.Add(-d.cfg.RenewMargin))
		if wait <= 0 { // margin longer than the TTL: renew at half the time left
			wait = max(time.Until(lease.Expiration)/2, 100*time.Millisecond)
		}
		if err := sleep(ctx, wait); err != nil {
			return nil
		}
		next, err := d.renewOnce(ctx, lease)
		if err != nil {
			return err
		}
		if next.Expiration.IsZero() && ctx.Err() != nil {
			return nil
		}
		lease = next
	}
	<-ctx.Done()
	return nil
}

// renewOnce renews the lease, retrying until it succeeds, the lease is lost
// (errLeaseLost) or ctx ends (a zero lease).
func (d *Daemon) renewOnce(ctx context.Context, lease subnet.Lease) (subnet.Lease, error) {
	for {
		left := time.Until(lease.Expiration)
		started := time.Now()
		actx, cancel := context.WithTimeout(ctx, min(max(left/3, time.Second), 30*time.Second))
		next, err := d.cfg.Registry.Renew(actx, lease)
		cancel()
		d.cfg.Metrics.renewed(err)
		switch {
		case err == nil:
			d.log.Info("renewed lease", "subnet", next.Subnet, "expires", next.Expiration)
			return next, nil
		case errors.Is(err, subnet.ErrLeaseLost):
			return subnet.Lease{}, errLeaseLost
		case ctx.Err() != nil:
			return subnet.Lease{}, nil
		}
		retry := retryIn(min(d.retryDelay(), max(time.Until(lease.Expiration)/4, 100*time.Millisecond)), time.Since(started))
		d.log.Warn("cannot renew the lease, retrying", "err", err, "retryIn", retry, "expires", lease.Expiration)
		if sleep(ctx, retry) != nil {
			return subnet.Lease{}, nil
		}
	}
}

// retryIn is the wait before the next attempt of a call that failed after
// spent, for attempts that start at most every apart (5 s at most,
// retryDelay). An attempt that waited that long already (a request queued
// for an unreachable datastore until its timeout) is followed by the next
// at once: a renewal is then always waiting when the datastore returns and
// goes through as soon as the connection does. Sleeping the interval after
// a timed-out attempt made the node miss the return by up to that much
// (bench/faults: etcd outage, node cut off from etcd).
func retryIn(every, spent time.Duration) time.Duration { return max(every-spent, 0) }

// watch follows the registry and hands every new peer table to the backend.
func (d *Daemon) watch(ctx context.Context, cfg *subnet.Config, self subnet.Lease, b backend.Backend) error {
	leaseType := subnet.LeaseBackendType(cfg.Backend.Type)
	events := make(chan []subnet.Event, 64)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return d.cfg.Registry.Watch(gctx, events) })
	g.Go(func() error {
		peers := newPeerSet(cfg, self, d.cfg.Rejections, leaseType)
		selfKey := self.Key()
		for {
			var batch []subnet.Event
			select {
			case <-gctx.Done():
				return nil
			case batch = <-events:
			}
			batch = drainBatches(events, batch)
			start := time.Now()
			var added, removed int
			for _, ev := range batch {
				if ev.Lease.Key() == selfKey && lostOwnLease(ev, self) {
					return errLeaseLost
				}
				peers.apply(ev)
				if ev.Type == subnet.EventRemoved {
					removed++
				} else {
					added++
				}
			}
			ups, rebuilt := peers.update()
			if u, ok := b.(updater); ok && !rebuilt {
				u.Update(ups)
			} else {
				b.Set(maps.Clone(peers.tab)) // the backend keeps it; peers changes its own
			}
			v4 := 0
			for p := range peers.tab {
				if p.Addr().Is4() {
					v4++
				}
			}
			d.cfg.Metrics.batch(added, removed, len(peers.leases), v4, len(peers.tab)-v4, time.Since(start))
		}
	})
	err := g.Wait()
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		return nil
	}
	return err
}

// drainBatches adds to batch the batches already waiting in events, so that
// a burst of changes (many nodes joining, a relisting) costs one table and
// one sync rather than one each. It never waits for a batch.
func drainBatches(events <-chan []subnet.Event, batch []subnet.Event) []subnet.Event {
	for {
		select {
		case more := <-events:
			batch = append(batch[:len(batch):len(batch)], more...)
		default:
			return batch
		}
	}
}

// updater is a backend that keeps the peer table it was last Set and takes
// changes to it row by row (the vxlan backend): a change among thousands of
// peers then costs neither a copy of the table nor a comparison of two.
type updater interface {
	Update(ups []vtep.Update)
}

// lostOwnLease reports whether an event on our own key means the lease is
// no longer ours: deleted, or rewritten with another node's address.
func lostOwnLease(ev subnet.Event, self subnet.Lease) bool {
	if ev.Type == subnet.EventRemoved {
		return true
	}
	a, s := ev.Lease.Attrs, self.Attrs
	return a.PublicIP != s.PublicIP || a.PublicIPv6 != s.PublicIPv6
}

// wireGuardOverhead is what Flannel's wireguard backend takes off the MTU.
const wireGuardOverhead = 80

// leaseMover is a registry that can rewrite the addresses of a lease it
// handed out (subnet/etcd). A Kubernetes node's subnet is its podCIDR and
// follows the node whatever its address, so that registry needs none.
type leaseMover interface {
	// Move rewrites l's value to attrs if it still holds l.Attrs, keeping
	// its subnets and expiry; ErrLeaseLost if it does not.
	Move(ctx context.Context, l subnet.Lease, attrs subnet.LeaseAttrs) (subnet.Lease, error)
}

// MoveLease rewrites this node's lease to advertise addr, the underlay's new
// address, in place of the old one of its family (and the VXLAN MAC derived
// from it): peers then send to the new address, and the next start, which
// finds its lease by its public address, keeps the subnet and its pods'
// addresses. Without a lease, or with a registry that cannot move one, it
// does nothing.
func (d *Daemon) MoveLease(ctx context.Context, addr netip.Addr) error {
	l := d.Lease()
	mv, ok := d.cfg.Registry.(leaseMover)
	if l == nil || !ok {
		return nil
	}
	attrs := l.Attrs
	if addr.Is4() {
		attrs.PublicIP = addr
		if attrs.BackendData != nil {
			attrs.BackendData = &subnet.VXLANData{VNI: attrs.BackendData.VNI, VtepMAC: vtep.DeviceMAC(addr, attrs.BackendData.VNI)}
		}
	} else {
		attrs.PublicIPv6 = addr
		if attrs.BackendV6Data != nil {
			attrs.BackendV6Data = &subnet.VXLANData{VNI: attrs.BackendV6Data.VNI, VtepMAC: vtep.DeviceMAC(addr, attrs.BackendV6Data.VNI)}
		}
	}
	moved, err := mv.Move(ctx, *l, attrs)
	if err != nil {
		return fmt.Errorf("move lease %s to %s: %w", l.Subnet, addr, err)
	}
	d.log.Info("moved our lease to the new underlay address", "subnet", moved.Subnet, "ipv6Subnet", moved.IPv6Subnet,
		"publicIP", moved.Attrs.PublicIP, "publicIPv6", moved.Attrs.PublicIPv6)
	return nil
}

// presenceCheck is how often the presence claim is looked at.
const presenceCheck = 250 * time.Millisecond

// awaitPresence waits until the node's public addresses are claimed (no
// other running node advertises them), saying meanwhile why in Waiting.
func (d *Daemon) awaitPresence(ctx context.Context) error {
	p := d.cfg.Presence
	if p == nil {
		return nil
	}
	tick := time.NewTicker(presenceCheck)
	defer tick.Stop()
	for {
		held, err := p.Held()
		if held {
			d.setWaiting(nil)
			return nil
		}
		d.setWaiting(err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// errPresenceLost ends a session whose public address another running node
// claimed while this one's claim had lapsed (etcd out of reach for longer
// than its TTL): the two would share the subnet found by that address.
var errPresenceLost = fmt.Errorf("another running node claimed this node's public IP: %w", errLeaseLost)

// watchPresence returns errPresenceLost once another node holds the claim;
// a claim that lapsed and is not taken (etcd out of reach) keeps the
// session.
func (d *Daemon) watchPresence(ctx context.Context) error {
	p := d.cfg.Presence
	if p == nil {
		return nil
	}
	tick := time.NewTicker(presenceCheck)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		if held, err := p.Held(); !held && errors.Is(err, subnet.ErrPublicIPTaken) {
			d.log.Error("another running node claimed this node's public IP while its claim had lapsed; stopping the lease's session until the address is ours again",
				"err", err)
			return errPresenceLost
		}
	}
}

// Waiting is the error of the last attempt to claim the node's addresses or
// acquire its lease, "" once one succeeded: what /readyz says readiness
// waits for.
func (d *Daemon) Waiting() string {
	if p := d.waiting.Load(); p != nil {
		return *p
	}
	return ""
}

func (d *Daemon) setWaiting(err error) {
	if err == nil {
		d.waiting.Store(nil)
		return
	}
	msg := err.Error()
	d.waiting.Store(&msg)
}
