package etcd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/weft-net/weft/subnet"
)

// DefaultPresenceTTL is how long a presence record outlives the weftd that
// kept it: the etcd client renews it every third of that.
const DefaultPresenceTTL = 60 * time.Second

// Presence is the record that a running node advertises its public
// addresses: one key per address, <prefix>/weft-presence/<address>, holding
// the node's name and instance (PresenceOwner), attached to a short etcd
// lease that the node keeps alive while Run runs (Flannel never reads these
// keys). Leases are found by public address, so two live nodes that
// advertise the same one (every Vagrant VM's NAT address) would share a
// subnet; a claim on an address whose record names another owner is
// refused with subnet.ErrPublicIPTaken until that record expires. The
// record is not deleted when weftd stops: a restart of the same instance
// takes it back at once, while a duplicate waiting for the address cannot
// slip in during the restart. A node that is gone stops renewing, and its
// record expires within the TTL: a machine that replaced it with its
// address then takes its lease over, as with Flannel.
type Presence struct {
	client  *clientv3.Client
	dir     string
	owner   PresenceOwner
	value   string // owner as JSON
	addrs   []netip.Addr
	ttl     int64 // seconds
	timeout time.Duration
	retry   time.Duration
	log     *slog.Logger

	mu      sync.Mutex
	held    bool          // the record is ours and alive
	err     error         // why it is not held; nil while it is
	changed chan struct{} // has a value after a set
}

// PresenceOwner identifies the weftd that holds an address: the node's
// name and a token of its instance, which weftd's restarts keep and a
// reboot or a cloned machine does not (internal/daemon keeps it with the
// boot id beside the subnet file). A record with the same name but another
// token is another machine with this name (a clone) or this one before a
// reboot: it is waited out like any other owner's.
type PresenceOwner struct {
	Node     string `json:"node"`
	Instance string `json:"instance"`
}

// PresenceOptions tune a Presence. Zero values take the defaults.
type PresenceOptions struct {
	Prefix string        // etcd key prefix, DefaultPrefix
	TTL    time.Duration // DefaultPresenceTTL; whole seconds, at least 5 s
	// RequestTimeout bounds each etcd request (DefaultRequestTimeout).
	RequestTimeout time.Duration
	// Retry is the wait after a failed claim (5 s).
	Retry time.Duration
}

// NewPresence returns the presence record of node for addrs (invalid
// addresses are left out).
func NewPresence(client *clientv3.Client, owner PresenceOwner, addrs []netip.Addr, opts PresenceOptions, log *slog.Logger) (*Presence, error) {
	if client == nil {
		return nil, errors.New("etcd presence: no client")
	}
	if owner.Node == "" {
		return nil, errors.New("etcd presence: no node name")
	}
	if owner.Instance == "" {
		return nil, errors.New("etcd presence: no instance token")
	}
	value, err := json.Marshal(owner)
	if err != nil {
		return nil, fmt.Errorf("etcd presence: %w", err)
	}
	if opts.TTL == 0 {
		opts.TTL = DefaultPresenceTTL
	}
	if opts.TTL < 5*time.Second {
		return nil, fmt.Errorf("etcd presence: TTL %s: at least 5s", opts.TTL)
	}
	if opts.Prefix == "" {
		opts.Prefix = DefaultPrefix
	}
	if opts.RequestTimeout <= 0 {
		opts.RequestTimeout = DefaultRequestTimeout
	}
	if opts.Retry <= 0 {
		opts.Retry = 5 * time.Second
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	p := &Presence{
		client: client, dir: strings.TrimRight(opts.Prefix, "/") + "/weft-presence/", owner: owner, value: string(value),
		ttl: int64((opts.TTL + time.Second - 1) / time.Second), timeout: opts.RequestTimeout, retry: opts.Retry,
		log: log.With("component", "presence"), err: errors.New("presence: not claimed yet"),
		changed: make(chan struct{}, 1),
	}
	for _, a := range addrs {
		if a.IsValid() {
			p.addrs = append(p.addrs, a.Unmap())
		}
	}
	if len(p.addrs) == 0 {
		return nil, errors.New("etcd presence: no public address")
	}
	return p, nil
}

// Key is the presence key of addr.
func (p *Presence) Key(addr netip.Addr) string { return p.dir + addr.String() }

// Held reports whether the record is ours and alive; when not, err says
// why (wrapping subnet.ErrPublicIPTaken when another owner holds an
// address).
func (p *Presence) Held() (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held, p.err
}

// Changed has a value after Held's answer may have changed, for one
// reader to wait on instead of asking Held again and again.
func (p *Presence) Changed() <-chan struct{} { return p.changed }

func (p *Presence) set(held bool, err error) {
	p.mu.Lock()
	p.held, p.err = held, err
	p.mu.Unlock()
	select {
	case p.changed <- struct{}{}:
	default:
	}
}

// Run claims the addresses, retrying until the claim succeeds, and keeps
// the record alive until ctx ends; it leaves the record to expire then. A
// record that lapsed (etcd out of reach for longer than the TTL) is claimed
// again, and while another owner holds an address it is not held. Run
// returns nil when ctx ends.
func (p *Presence) Run(ctx context.Context) error {
	var lastErr string
	for {
		id, err := p.claim(ctx)
		if err != nil {
			p.set(false, err)
			if ctx.Err() != nil {
				return nil
			}
			if msg := err.Error(); msg != lastErr {
				p.log.Error("cannot record this node's public address as in use; retrying", "err", err, "retryIn", p.retry)
				lastErr = msg
			}
			if sleep(ctx, p.retry) != nil {
				return nil
			}
			continue
		}
		lastErr = ""
		p.set(true, nil)
		p.log.Info("recorded this node's public address as in use", "addresses", p.addrs, "ttl", time.Duration(p.ttl)*time.Second)
		p.keepAlive(ctx, id)
		if ctx.Err() != nil {
			return nil
		}
		p.set(false, errors.New("presence: the record lapsed; claiming the address again"))
		p.log.Warn("the presence record lapsed (etcd out of reach for longer than its TTL?); claiming the address again")
		p.revoke(ctx, id) // if it is still there, it would only keep a stale record alive
	}
}

// keepAlive renews the record's etcd lease until ctx ends or the lease is
// gone.
func (p *Presence) keepAlive(ctx context.Context, id clientv3.LeaseID) {
	kctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch, err := p.client.KeepAlive(kctx, id)
	if err != nil {
		return
	}
	for range ch { // closed when kctx ends or the lease cannot be renewed
	}
}

// claim grants an etcd lease and, in one transaction per address, puts the
// node's name under each address whose key is absent or already names this
// node. Another name there is a live node with our address.
func (p *Presence) claim(ctx context.Context) (clientv3.LeaseID, error) {
	rctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	grant, err := p.client.Grant(rctx, p.ttl)
	if err != nil {
		return 0, fmt.Errorf("presence: grant an etcd lease: %w", err)
	}
	for _, a := range p.addrs {
		key := p.Key(a)
		resp, err := p.client.Txn(rctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, p.value, clientv3.WithLease(grant.ID))).
			Else(clientv3.OpGet(key)).Commit()
		if err == nil && !resp.Succeeded {
			kvs := resp.Responses[0].GetResponseRange().Kvs
			if len(kvs) == 1 && string(kvs[0].Value) != p.value {
				p.revoke(ctx, grant.ID)
				return 0, p.taken(a, key, kvs[0].Value)
			}
			// Ours, from an earlier run of this instance whose record has
			// not expired (or gone between the two reads): attach it to
			// the new lease.
			resp, err = p.client.Txn(rctx).
				If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
				Then(clientv3.OpPut(key, p.value, clientv3.WithLease(grant.ID))).
				Else(clientv3.OpTxn(
					[]clientv3.Cmp{clientv3.Compare(clientv3.Value(key), "=", p.value)},
					[]clientv3.Op{clientv3.OpPut(key, p.value, clientv3.WithLease(grant.ID))}, nil)).Commit()
			if err == nil && !resp.Succeeded && !resp.Responses[0].GetResponseTxn().Succeeded {
				err = fmt.Errorf("another node took %s meanwhile", key)
			}
		}
		if err != nil {
			p.revoke(ctx, grant.ID)
			return 0, fmt.Errorf("presence: record %s: %w", key, err)
		}
	}
	return grant.ID, nil
}

// taken is the error for an address whose record (value) names another
// owner.
func (p *Presence) taken(a netip.Addr, key string, value []byte) error {
	var other PresenceOwner
	if err := json.Unmarshal(value, &other); err != nil || other.Node == "" {
		other.Node = string(value)
	}
	ttl := time.Duration(p.ttl) * time.Second
	if other.Node == p.owner.Node {
		return fmt.Errorf("%w: %s is claimed by another instance of node %q (a machine cloned with this name, or this one before a reboot); "+
			"if that instance is gone, its record %s expires within %s; if it runs, give each node its own name (--node-name) and address (--public-ip or --iface)",
			subnet.ErrPublicIPTaken, a, other.Node, key, ttl)
	}
	return fmt.Errorf("%w: %s is advertised by the running node %q, and this node is %q: "+
		"two nodes advertise the same address (an address every VM has, such as Vagrant's NAT 10.0.2.15?) and would share one subnet; "+
		"give this node an address of its own with --public-ip or --iface (if %q is gone, its record %s expires within %s)",
		subnet.ErrPublicIPTaken, a, other.Node, p.owner.Node, other.Node, key, ttl)
}

func (p *Presence) revoke(ctx context.Context, id clientv3.LeaseID) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.timeout)
	defer cancel()
	if _, err := p.client.Revoke(rctx, id); err != nil {
		p.log.Debug("cannot revoke an unused etcd lease; it expires by itself", "err", err)
	}
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
