// Package etcd is the subnet.Registry kept in etcd (v3 API), in Flannel's
// layout so that weft and flanneld nodes can share one etcd:
//
//	<prefix>/config           the network config (JSON)
//	<prefix>/subnets/<key>    one lease per node, "10.244.59.0-24" or
//	                          "10.244.92.0-24&fd00:10:244:50::-64", its value
//	                          the LeaseAttrs JSON, attached to an etcd lease
//	<prefix>/weft-presence/<address>  weft only: the node (name and
//	                          instance) that advertises this public
//	                          address (Presence), on a short etcd lease
//
// A key without an etcd lease is an administrator's reservation: it is only
// ever handed to the node whose public address it names, and it keeps having
// no lease. New leases are created with a transaction that succeeds only if
// the key does not exist, so two nodes never get the same subnet.
package etcd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/weft-net/weft/subnet"
)

// Defaults for Options.
const (
	DefaultPrefix         = "/coreos.com/network"
	DefaultTTL            = 24 * time.Hour
	DefaultRaceRetries    = 32
	DefaultRequestTimeout = 10 * time.Second
)

// Options tune a Registry. Zero values take the defaults.
type Options struct {
	Prefix string        // etcd key prefix, DefaultPrefix
	TTL    time.Duration // lifetime of a new lease, DefaultTTL; whole seconds, at least 1s
	// RaceRetries bounds how often Acquire starts over after another node
	// took the subnet it was about to create (DefaultRaceRetries).
	RaceRetries int
	// RequestTimeout bounds each etcd request made on the caller's behalf,
	// so that an unreachable etcd becomes an error the caller can retry
	// instead of a call that never returns (DefaultRequestTimeout).
	RequestTimeout time.Duration
	// Rejections records keys that are not lease keys and values that do
	// not parse (logged once per key, counted); nil: logged once per key to
	// the registry's logger.
	Rejections *subnet.Rejections
}

// Registry is the etcd subnet registry. It is safe for concurrent use.
type Registry struct {
	client  *clientv3.Client
	prefix  string // without a trailing slash
	ttl     int64  // seconds
	retries int
	timeout time.Duration
	log     *slog.Logger
	rej     *subnet.Rejections
	err     error   // bad options, returned by every method
	kept    listing // Acquire's last listing, for the next Watch
}

var _ subnet.Registry = (*Registry)(nil)

// New returns a registry on client. Invalid options are reported by the
// first call of any method.
func New(client *clientv3.Client, opts Options, log *slog.Logger) *Registry {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Registry{
		client:  client,
		prefix:  strings.TrimRight(opts.Prefix, "/"),
		retries: opts.RaceRetries,
		timeout: opts.RequestTimeout,
		log:     log.With("component", "etcd"),
		rej:     opts.Rejections,
	}
	if r.rej == nil {
		r.rej = subnet.NewRejections(r.log, nil)
	}
	if opts.Prefix == "" {
		r.prefix = DefaultPrefix
	}
	if opts.TTL == 0 {
		opts.TTL = DefaultTTL
	}
	r.ttl = int64((opts.TTL + time.Second - 1) / time.Second)
	if r.retries == 0 {
		r.retries = DefaultRaceRetries
	}
	if r.timeout == 0 {
		r.timeout = DefaultRequestTimeout
	}
	switch {
	case client == nil:
		r.err = errors.New("etcd registry: no client")
	case opts.TTL < 0:
		r.err = fmt.Errorf("etcd registry: TTL %s: must be positive", opts.TTL)
	case r.retries < 0:
		r.err = fmt.Errorf("etcd registry: RaceRetries %d: must not be negative", r.retries)
	case r.timeout < 0:
		r.err = fmt.Errorf("etcd registry: RequestTimeout %s: must not be negative", r.timeout)
	}
	return r
}

func (r *Registry) configKey() string  { return r.prefix + "/config" }
func (r *Registry) subnetsDir() string { return r.prefix + "/subnets/" }

// request bounds one etcd request by the request timeout.
func (r *Registry) request(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, r.timeout)
}

// Config reads and parses <prefix>/config.
func (r *Registry) Config(ctx context.Context) (*subnet.Config, error) {
	if r.err != nil {
		return nil, r.err
	}
	rctx, cancel := r.request(ctx)
	defer cancel()
	resp, err := r.client.Get(rctx, r.configKey())
	if err != nil {
		return nil, fmt.Errorf("etcd registry: read %s from etcd %s: %w%s", r.configKey(), r.endpoints(), err, noAnswerHint(err))
	}
	if len(resp.Kvs) == 0 {
		return nil, fmt.Errorf("etcd registry: network config %s: key not found: write the network config (JSON) there", r.configKey())
	}
	cfg, err := subnet.ParseConfig(resp.Kvs[0].Value)
	if err != nil {
		return nil, fmt.Errorf("etcd registry: %s: %w", r.configKey(), err)
	}
	return cfg, nil
}

// endpoints names the etcd endpoints the client tries, for errors.
func (r *Registry) endpoints() string {
	if r.client == nil {
		return "(no client)"
	}
	return strings.Join(r.client.Endpoints(), ",")
}

// noAnswerHint explains a request that got no answer in time: etcd is not
// reachable, or refuses the connection's TLS (a server requiring client
// certificates looks exactly like that to the client).
func noAnswerHint(err error) string {
	if !errors.Is(err, context.DeadlineExceeded) {
		return ""
	}
	return " (no answer: check that etcd serves clients at that address, and, if it requires client certificates," +
		" that --etcd-certfile and --etcd-keyfile name a certificate signed by its CA, with --etcd-cafile for its own)"
}

// entry is one lease key as listed from etcd.
type entry struct {
	name    string // key below <prefix>/subnets/
	lease   subnet.Lease
	value   []byte
	leaseID clientv3.LeaseID // 0 for a reservation
	bad     error            // the value does not parse (the key does)
}

// decode parses one key-value. A key that is not a lease key is an error;
// a lease key with a bad value is returned with bad set.
func (r *Registry) decode(kv *mvccpb.KeyValue) (entry, error) {
	// Only the name is copied out of the key: the watcher keeps it, for
	// every lease.
	name := string(bytes.TrimPrefix(kv.Key, []byte(r.subnetsDir())))
	v4, v6, err := subnet.ParseKey(name)
	if err != nil {
		return entry{}, err
	}
	e := entry{
		name:    name,
		lease:   subnet.Lease{Subnet: v4, IPv6Subnet: v6, Revision: kv.ModRevision},
		value:   kv.Value,
		leaseID: clientv3.LeaseID(kv.Lease),
	}
	if err := json.Unmarshal(kv.Value, &e.lease.Attrs); err != nil {
		e.bad = fmt.Errorf("lease value %q: %w", kv.Value, err)
	}
	return e, nil
}

// list reads every lease key, sorted by name. Keys that are not lease keys
// are recorded as rejected and skipped; keys with bad values are recorded
// and returned marked bad.
func (r *Registry) list(ctx context.Context) ([]entry, int64, error) {
	rctx, cancel := r.request(ctx)
	defer cancel()
	resp, err := r.client.Get(rctx, r.subnetsDir(), clientv3.WithPrefix())
	if err != nil {
		return nil, 0, fmt.Errorf("list %s: %w", r.subnetsDir(), err)
	}
	out := make([]entry, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		e, err := r.decode(kv)
		if err != nil {
			r.rej.Reject(string(kv.Key), subnet.RejectMalformedKey, err)
			continue
		}
		if e.bad != nil {
			r.rej.Reject(string(kv.Key), subnet.RejectMalformedValue, e.bad)
		} else {
			r.rej.Forget(string(kv.Key))
		}
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out, resp.Header.Revision, nil
}

// revoke drops an etcd lease we granted but did not use, on a context of its
// own so that it also runs when the caller's context is done.
func (r *Registry) revoke(ctx context.Context, id clientv3.LeaseID) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.timeout)
	defer cancel()
	if _, err := r.client.Revoke(rctx, id); err != nil {
		r.log.Debug("cannot revoke an unused etcd lease; it expires by itself", "lease", fmt.Sprintf("%x", int64(id)), "err", err)
	}
}

// sameValue reports whether two lease values are the same bytes.
func sameValue(a, b []byte) bool { return bytes.Equal(a, b) }
