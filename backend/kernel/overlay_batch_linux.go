package kernel

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// minBatched is the smallest batch written through the batch writer; fewer
// entries go one request at a time, where a batch writer saves nothing.
const minBatched = 4

// batch returns the overlay's batch writer for a batch of n entries, or nil.
func (o *Overlay) batch(n int) *BatchWriter {
	if n < minBatched {
		return nil
	}
	return o.opts.Batch.Get()
}

// WriteBatch writes reqs through p and adds the successes to *done. It
// returns the first failure in request order (described by what), skipping
// the errno ignore (an entry already gone), or the error of the exchange.
// Every request is attempted, also after a failure.
func WriteBatch(p *BatchWriter, reqs []*nl.NetlinkRequest, ignore syscall.Errno, done *int, what func(i int) string) error {
	res, err := p.Write(reqs)
	if err != nil {
		return err
	}
	var first error
	for i, e := range res {
		switch {
		case e == nil:
			*done++
		case ignore != 0 && errors.Is(e, ignore):
		case first == nil:
			first = fmt.Errorf("%s: %w", what(i), e)
		}
	}
	return first
}

func (o *Overlay) batchNeighbours(p *BatchWriter, ns []Neighbour, set bool, done *int) error {
	reqs := make([]*nl.NetlinkRequest, len(ns))
	for i, n := range ns {
		reqs[i] = NeighRequest(o.neigh(n), set)
	}
	if set {
		return WriteBatch(p, reqs, 0, done, func(i int) string {
			return fmt.Sprintf("set neighbour %s lladdr %s", ns[i].IP, ns[i].MAC)
		})
	}
	return WriteBatch(p, reqs, unix.ENOENT, done, func(i int) string { return fmt.Sprintf("delete neighbour %s", ns[i].IP) })
}

func (o *Overlay) batchRoutes(p *BatchWriter, rs []Route, set bool, done *int) error {
	reqs := make([]*nl.NetlinkRequest, len(rs))
	for i, r := range rs {
		nr := o.route(r)
		if set {
			nr.Protocol = RouteProtocol
		} else {
			nr.Scope = netlink.SCOPE_NOWHERE
		}
		req, err := RouteRequest(nr, set)
		if err != nil {
			return fmt.Errorf("route %s via %s: %w", r.Dst, r.Gw, err)
		}
		reqs[i] = req
	}
	if set {
		return WriteBatch(p, reqs, 0, done, func(i int) string {
			return fmt.Sprintf("replace route %s via %s", rs[i].Dst, rs[i].Gw)
		})
	}
	return WriteBatch(p, reqs, unix.ESRCH, done, func(i int) string {
		return fmt.Sprintf("delete route %s via %s", rs[i].Dst, rs[i].Gw)
	})
}
