// Package backend defines what every weft dataplane implements (Backend),
// the counters each reports in one shape (Stats), and Join, which runs
// several as one.
//
// The dataplanes live in subpackages: vxlan (a kernel VXLAN device), uvxlan
// (a userspace VTEP on a TAP device, with an optional tc fast path), hostgw
// (a route per peer via its public address), wireguard (kernel or
// wireguard-go devices), extension (the user's commands on lease events)
// and alloc (leases only, no dataplane); masq holds the masquerade and
// forward rules. What several of them program the same way
// (routes, neighbours and FDB entries, the reconciler that repairs
// drift, the underlay device) is in backend/kernel.
package backend

import (
	"context"

	"github.com/weft-net/weft/vtep"
)

// Backend is a dataplane.
//
// Set may be called at any time, before Run and concurrently with it; it
// never blocks on the kernel. Run applies the latest table handed to Set,
// repairs drift until ctx is done, and returns after all its goroutines have
// exited. Run leaves the programmed state in place on return, so that a
// restarting daemon drops no traffic. Ready is closed once the device is up
// and the first table handed to Set has been programmed (the daemon reports
// ready, and in Kubernetes mode clears NetworkUnavailable, only then). Stats
// reports repairs, frames and drops (see Reporter).
type Backend interface {
	Run(ctx context.Context) error
	Set(t vtep.Table)
	Ready() <-chan struct{}
	Reporter
}
