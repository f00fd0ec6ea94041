package subnet

import (
	"context"
	"errors"
	"net/netip"
)

// EventType says what happened to a lease.
type EventType int

const (
	// EventAdded: a lease appeared or its value changed.
	EventAdded EventType = iota
	// EventRemoved: a lease expired or was deleted.
	EventRemoved
)

func (t EventType) String() string {
	if t == EventRemoved {
		return "removed"
	}
	return "added"
}

// Event is one change to the set of leases.
type Event struct {
	Type  EventType
	Lease Lease
}

// ErrLeaseLost is returned by Renew when the lease is no longer ours (the key
// was deleted or now carries another node's value); the caller acquires again.
var ErrLeaseLost = errors.New("lease lost")

// ErrExhausted is wrapped by Acquire when no subnet is free.
var ErrExhausted = errors.New("no free subnet")

// Registry is a datastore of node leases: etcd or the Kubernetes API.
// Implementations are safe for concurrent use.
type Registry interface {
	// Config returns the cluster network config.
	Config(ctx context.Context) (*Config, error)
	// Acquire returns this node's lease, creating or reusing one; it sets
	// the value to attrs. hints are the subnets named in an earlier subnet
	// file, at most one per family (invalid ones are skipped); each is
	// reused if still free. Acquire retries lost races itself and fails
	// with ErrExhausted when no subnet is free.
	Acquire(ctx context.Context, attrs LeaseAttrs, hints ...netip.Prefix) (Lease, error)
	// Renew extends a lease returned by Acquire and returns it with its new
	// expiration. A lease without expiration (a reservation) is returned as
	// is. ErrLeaseLost means the caller must Acquire again.
	Renew(ctx context.Context, l Lease) (Lease, error)
	// Watch sends the current leases as EventAdded events, then every
	// change, until ctx is done; it returns ctx's error then, or an error
	// that it cannot recover from. A batch is never empty. On a broken or
	// compacted watch it lists again and sends only the difference. Values
	// that do not parse are logged and skipped. An EventRemoved's lease
	// names the subnets; its Attrs may be empty.
	Watch(ctx context.Context, events chan<- []Event) error
}

// ErrPublicIPTaken is wrapped when another running node advertises this
// node's public address: leases are found by that address, so the two would
// share one subnet.
var ErrPublicIPTaken = errors.New("public IP taken by another node")
