package etcd

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/weft-net/weft/subnet"
)

// Renew attaches a fresh etcd lease of the configured TTL to l's key, but
// only while the key still holds l's value; see subnet.Registry. The old
// etcd lease is revoked once nothing is attached to it. A reservation (zero
// Expiration) is returned unchanged; a key that an administrator turned into
// a reservation (same value, no etcd lease) is returned as one.
func (r *Registry) Renew(ctx context.Context, l subnet.Lease) (subnet.Lease, error) {
	if r.err != nil {
		return l, r.err
	}
	if l.Expiration.IsZero() {
		return l, nil
	}
	if !l.Subnet.IsValid() && !l.IPv6Subnet.IsValid() {
		return l, fmt.Errorf("renew lease: the lease has no subnet")
	}
	key := r.subnetsDir() + l.Key()
	value, err := json.Marshal(l.Attrs)
	if err != nil {
		return l, fmt.Errorf("renew lease %s in etcd %s: %w", key, r.endpoints(), err)
	}
	rctx, cancel := r.request(ctx)
	defer cancel()
	start := time.Now()
	grant, err := r.client.Grant(rctx, r.ttl)
	if err != nil {
		return l, fmt.Errorf("renew lease %s: grant a %ds etcd lease: %w", key, r.ttl, err)
	}
	resp, err := r.client.Txn(rctx).
		If(clientv3.Compare(clientv3.Value(key), "=", string(value)),
			clientv3.Compare(clientv3.LeaseValue(key), "!=", 0)).
		Then(clientv3.OpGet(key), clientv3.OpPut(key, string(value), clientv3.WithLease(grant.ID))).
		Else(clientv3.OpGet(key)).Commit()
	if err != nil {
		// The put may have happened: revoking the grant could delete our
		// key, so leave it to expire by itself.
		return l, fmt.Errorf("renew lease %s in etcd %s: %w", key, r.endpoints(), err)
	}
	kvs := resp.Responses[0].GetResponseRange().GetKvs()
	if !resp.Succeeded {
		r.revoke(ctx, grant.ID)
		return r.notRenewed(l, key, value, kvs)
	}
	if len(kvs) == 1 && kvs[0].Lease != 0 {
		r.revokeIfUnused(ctx, clientv3.LeaseID(kvs[0].Lease))
	}
	l.Expiration = start.Add(time.Duration(grant.TTL) * time.Second)
	l.Revision = resp.Header.Revision
	return l, nil
}

// notRenewed explains a failed renewal from the key's current state.
func (r *Registry) notRenewed(l subnet.Lease, key string, value []byte, kvs []*mvccpb.KeyValue) (subnet.Lease, error) {
	if len(kvs) == 0 {
		return l, fmt.Errorf("renew lease %s: key deleted: %w", key, subnet.ErrLeaseLost)
	}
	kv := kvs[0]
	if !sameValue(kv.Value, value) {
		return l, fmt.Errorf("renew lease %s: key now holds %s instead of ours: %w", key, kv.Value, subnet.ErrLeaseLost)
	}
	r.log.Info("our lease was turned into a reservation; it needs no renewal", "key", key)
	l.Expiration = time.Time{}
	l.Revision = kv.ModRevision
	return l, nil
}

// revokeIfUnused revokes an etcd lease that no key is attached to any more
// (the one a renewal replaced). A lease that still holds keys, such as one
// shared by another tool, is left alone.
func (r *Registry) revokeIfUnused(ctx context.Context, id clientv3.LeaseID) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.timeout)
	defer cancel()
	ttl, err := r.client.TimeToLive(rctx, id, clientv3.WithAttachedKeys())
	if err != nil || ttl.TTL <= 0 || len(ttl.Keys) > 0 {
		return
	}
	r.revoke(ctx, id)
}

// Move rewrites the value of l's key to attrs, keeping its etcd lease (and
// so its expiry), if the key still holds l.Attrs; else ErrLeaseLost. A node
// whose underlay address was replaced moves its lease, so that it keeps its
// subnet: Acquire finds a node's lease by its public address.
func (r *Registry) Move(ctx context.Context, l subnet.Lease, attrs subnet.LeaseAttrs) (subnet.Lease, error) {
	if r.err != nil {
		return l, r.err
	}
	key := r.subnetsDir() + l.Key()
	old, err := json.Marshal(l.Attrs)
	if err != nil {
		return l, fmt.Errorf("move lease %s: %w", key, err)
	}
	value, err := json.Marshal(attrs)
	if err != nil {
		return l, fmt.Errorf("move lease %s: %w", key, err)
	}
	rctx, cancel := r.request(ctx)
	defer cancel()
	resp, err := r.client.Txn(rctx).
		If(clientv3.Compare(clientv3.Value(key), "=", string(old))).
		Then(clientv3.OpPut(key, string(value), clientv3.WithIgnoreLease())).Commit()
	if err != nil {
		return l, fmt.Errorf("move lease %s in etcd %s: %w", key, r.endpoints(), err)
	}
	if !resp.Succeeded {
		return l, fmt.Errorf("move lease %s: the key no longer holds our value: %w", key, subnet.ErrLeaseLost)
	}
	l.Attrs, l.Revision = attrs, resp.Header.Revision
	return l, nil
}
