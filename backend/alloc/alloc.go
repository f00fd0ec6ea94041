// Package alloc is the dataplane of Flannel's "alloc" backend type: none.
// The node leases a subnet and writes the subnet file, and the operator (or
// another agent) makes pod traffic flow between nodes; weft programs nothing
// and routes to no peer.
package alloc

import (
	"context"

	"github.com/weft-net/weft/backend"
	"github.com/weft-net/weft/vtep"
)

// Backend is the empty dataplane. It is ready at once and reports no
// counters.
type Backend struct{ ready chan struct{} }

var _ backend.Backend = (*Backend)(nil)

// New returns the empty dataplane.
func New() *Backend {
	b := &Backend{ready: make(chan struct{})}
	close(b.ready)
	return b
}

// Run waits until ctx is done.
func (b *Backend) Run(ctx context.Context) error {
	<-ctx.Done()
	return nil
}

// Set ignores the table: alloc programs no peer.
func (b *Backend) Set(vtep.Table) {}

// Ready is closed from the start.
func (b *Backend) Ready() <-chan struct{} { return b.ready }

// Stats is empty: there is no dataplane to count.
func (b *Backend) Stats() backend.Stats { return backend.Stats{} }
