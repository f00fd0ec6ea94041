package etcd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/weft-net/weft/subnet"
)

// errRace means another writer changed the subnets between our listing and
// our write: list again and retry.
var errRace = errors.New("lost a race with another writer")

// Acquire returns this node's lease; see subnet.Registry. In order it
//   - reuses a lease whose PublicIP (PublicIPv6 when IPv4 is off) is ours if
//     it still fits the config, rewriting its value to attrs but keeping its
//     etcd lease (a reservation keeps having none);
//   - else creates the hinted subnet of each family if it fits and is
//     free (the IPv4 and the IPv6 subnet of an earlier subnet file);
//   - else creates a subnet picked at random among the first 100 free ones.
//
// A lease of ours that no longer fits the config is deleted (reservations
// are left alone). Dual-stack configs get one key carrying both subnets.
func (r *Registry) Acquire(ctx context.Context, attrs subnet.LeaseAttrs, hints ...netip.Prefix) (subnet.Lease, error) {
	if r.err != nil {
		return subnet.Lease{}, r.err
	}
	cfg, err := r.Config(ctx)
	if err != nil {
		return subnet.Lease{}, fmt.Errorf("acquire lease: %w", err)
	}
	if cfg.EnableIPv4 && !attrs.PublicIP.IsValid() {
		return subnet.Lease{}, errors.New("acquire lease: attrs have no PublicIP but the network config enables IPv4")
	}
	if !cfg.EnableIPv4 && !attrs.PublicIPv6.IsValid() {
		return subnet.Lease{}, errors.New("acquire lease: attrs have no PublicIPv6 but the network is IPv6-only")
	}
	value, err := json.Marshal(attrs)
	if err != nil {
		return subnet.Lease{}, fmt.Errorf("acquire lease: %w", err)
	}
	for attempt := 0; ; attempt++ {
		l, err := r.tryAcquire(ctx, cfg, attrs, value, hints)
		if !errors.Is(err, errRace) {
			return l, err
		}
		if attempt+1 >= r.retries {
			return subnet.Lease{}, fmt.Errorf("acquire lease: lost %d races in a row to other nodes writing the same subnets: %w", attempt+1, err)
		}
		r.log.Debug("lost a race for a subnet, trying again", "attempt", attempt+1)
		// A little jitter, so that nodes racing for the same subnets spread out.
		select {
		case <-ctx.Done():
			return subnet.Lease{}, fmt.Errorf("acquire lease: %w", ctx.Err())
		case <-time.After(time.Duration(rand.Int64N(int64(5*time.Millisecond) * int64(attempt+1)))):
		}
	}
}

// tryAcquire makes one attempt on one listing. It returns errRace when the
// listing went stale under it.
func (r *Registry) tryAcquire(ctx context.Context, cfg *subnet.Config, attrs subnet.LeaseAttrs, value []byte, hints []netip.Prefix) (subnet.Lease, error) {
	entries, rev, err := r.list(ctx)
	if err != nil {
		return subnet.Lease{}, fmt.Errorf("acquire lease: etcd %s: %w", r.endpoints(), err)
	}
	r.kept.keep(entries, rev)
	own, stale := findOwn(cfg, entries, attrs)
	if len(stale) > 0 {
		if err := r.deleteStale(ctx, stale); err != nil {
			return subnet.Lease{}, err
		}
		return subnet.Lease{}, errRace // list again without them
	}
	if own != nil {
		return r.reuse(ctx, *own, attrs, value)
	}
	v4, v6, err := pick(cfg, entries, hints...)
	if err != nil {
		return subnet.Lease{}, fmt.Errorf("acquire lease: %w", err)
	}
	return r.create(ctx, subnet.Lease{Subnet: v4, IPv6Subnet: v6, Attrs: attrs}, value, rev)
}

// ownedBy reports whether a listed lease carries our public address.
func ownedBy(cfg *subnet.Config, e entry, attrs subnet.LeaseAttrs) bool {
	if e.bad != nil {
		return false
	}
	if cfg.EnableIPv4 {
		return e.lease.Attrs.PublicIP == attrs.PublicIP
	}
	return e.lease.Attrs.PublicIPv6 == attrs.PublicIPv6
}

// fitsConfig reports whether a lease has the families of cfg and subnets
// that cfg can hand out.
func fitsConfig(cfg *subnet.Config, l subnet.Lease) bool {
	if cfg.EnableIPv4 != l.Subnet.IsValid() || cfg.EnableIPv6 != l.IPv6Subnet.IsValid() {
		return false
	}
	return (!cfg.EnableIPv4 || cfg.Fits(l.Subnet)) && (!cfg.EnableIPv6 || cfg.Fits(l.IPv6Subnet))
}

// findOwn returns the lease of ours to reuse (a reservation before a
// leased key) and our leases that no longer fit the config.
func findOwn(cfg *subnet.Config, entries []entry, attrs subnet.LeaseAttrs) (*entry, []entry) {
	var own *entry
	var stale []entry
	for i, e := range entries {
		switch {
		case !ownedBy(cfg, e, attrs):
		case !fitsConfig(cfg, e.lease) && e.leaseID != 0:
			stale = append(stale, e)
		case !fitsConfig(cfg, e.lease):
			// An admin's reservation outside the config: not ours to delete.
		case own == nil || (own.leaseID != 0 && e.leaseID == 0):
			own = &entries[i]
		}
	}
	return own, stale
}

// deleteStale deletes our leases that the config no longer allows, each
// only if unchanged since the listing.
func (r *Registry) deleteStale(ctx context.Context, stale []entry) error {
	for _, e := range stale {
		key := r.subnetsDir() + e.name
		rctx, cancel := r.request(ctx)
		_, err := r.client.Txn(rctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", e.lease.Revision)).
			Then(clientv3.OpDelete(key)).Commit()
		cancel()
		if err != nil {
			return fmt.Errorf("acquire lease: delete our lease %s that no longer fits the config: %w", key, err)
		}
		r.log.Info("deleted our lease that no longer fits the network config", "key", key)
	}
	return nil
}

// reuse takes over a listed lease of ours, rewriting its value if needed.
func (r *Registry) reuse(ctx context.Context, e entry, attrs subnet.LeaseAttrs, value []byte) (subnet.Lease, error) {
	key := r.subnetsDir() + e.name
	l := e.lease
	l.Attrs = attrs
	rctx, cancel := r.request(ctx)
	defer cancel()
	if !sameValue(e.value, value) {
		resp, err := r.client.Txn(rctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", e.lease.Revision)).
			Then(clientv3.OpPut(key, string(value), clientv3.WithIgnoreLease())).Commit()
		if err != nil {
			return subnet.Lease{}, fmt.Errorf("acquire lease: update %s: %w", key, err)
		}
		if !resp.Succeeded {
			return subnet.Lease{}, errRace
		}
		l.Revision = resp.Header.Revision
		r.kept.wrote(entry{name: e.name, lease: subnet.Lease{Subnet: l.Subnet, IPv6Subnet: l.IPv6Subnet, Attrs: attrs,
			Revision: l.Revision}, value: value, leaseID: e.leaseID}, l.Revision)
	}
	if e.leaseID == 0 {
		r.log.Info("reusing the subnet reserved for us", "key", key)
		return l, nil
	}
	start := time.Now()
	ttl, err := r.client.TimeToLive(rctx, e.leaseID)
	if err != nil {
		return subnet.Lease{}, fmt.Errorf("acquire lease: time to live of %s: %w", key, err)
	}
	if ttl.TTL <= 0 { // expired since the listing
		return subnet.Lease{}, errRace
	}
	l.Expiration = start.Add(time.Duration(ttl.TTL) * time.Second)
	r.log.Info("reusing our lease", "key", key, "expires", l.Expiration)
	return l, nil
}

// create writes a new lease if its key does not exist yet. A dual-stack
// key names two subnets, and another node may have created a key with our
// IPv6 subnet and another IPv4 one (or the reverse) since the listing at
// rev: then no key is created after rev, or it is a race (renewals rewrite
// existing keys and do not count).
func (r *Registry) create(ctx context.Context, l subnet.Lease, value []byte, rev int64) (subnet.Lease, error) {
	key := r.subnetsDir() + l.Key()
	rctx, cancel := r.request(ctx)
	defer cancel()
	start := time.Now()
	grant, err := r.client.Grant(rctx, r.ttl)
	if err != nil {
		return subnet.Lease{}, fmt.Errorf("acquire lease: grant a %ds etcd lease: %w", r.ttl, err)
	}
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.Version(key), "=", 0)}
	if l.Subnet.IsValid() && l.IPv6Subnet.IsValid() {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(r.subnetsDir()), "<", rev+1).WithPrefix())
	}
	resp, err := r.client.Txn(rctx).
		If(cmps...).
		Then(clientv3.OpPut(key, string(value), clientv3.WithLease(grant.ID))).Commit()
	if err != nil {
		// The put may have happened: keep the grant (it expires by itself)
		// rather than risk deleting a key that is ours.
		return subnet.Lease{}, fmt.Errorf("acquire lease: create %s: %w", key, err)
	}
	if !resp.Succeeded {
		r.revoke(ctx, grant.ID)
		return subnet.Lease{}, errRace
	}
	l.Expiration = start.Add(time.Duration(grant.TTL) * time.Second)
	l.Revision = resp.Header.Revision
	r.kept.wrote(entry{name: l.Key(), lease: subnet.Lease{Subnet: l.Subnet, IPv6Subnet: l.IPv6Subnet, Attrs: l.Attrs,
		Revision: l.Revision}, value: value, leaseID: grant.ID}, l.Revision)
	r.log.Info("created a lease", "key", key, "expires", l.Expiration)
	return l, nil
}
