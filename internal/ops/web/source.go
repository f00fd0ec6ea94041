package web

import (
	"context"
	"net/netip"

	"github.com/weft-net/weft/subnet"
)

// Source reads the overlay for the page. It never writes: not to the
// datastore, not to a node's kernel. Both methods may be called from
// several goroutines at once.
type Source interface {
	Snapshot(ctx context.Context) (*Snapshot, error)
	Path(ctx context.Context, src, dst netip.Addr) (*PathView, error)
}

// Leases reads every lease and the network config, as `weftctl leases`
// does (etcd or the Kubernetes API).
type Leases func(ctx context.Context) ([]subnet.Lease, *subnet.Config, error)
