package backend

import (
	"context"

	"golang.org/x/sync/errgroup"

	"github.com/weft-net/weft/vtep"
)

// Joined runs several dataplanes as one, for example the IPv4 and the IPv6
// halves of a dual-stack node whose dataplane carries one family each. Every
// part gets every table and takes the rows it carries.
type Joined struct {
	Parts []Backend
	ready chan struct{}
}

var _ Backend = (*Joined)(nil)

// Join returns the dataplanes as one.
func Join(parts ...Backend) *Joined {
	return &Joined{Parts: parts, ready: make(chan struct{})}
}

// Run runs every part until ctx is done or one of them fails, and closes
// Ready once all of them are ready.
func (j *Joined) Run(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	for _, p := range j.Parts {
		g.Go(func() error { return p.Run(gctx) })
	}
	g.Go(func() error {
		for _, p := range j.Parts {
			select {
			case <-p.Ready():
			case <-gctx.Done():
				return nil
			}
		}
		select {
		case <-j.ready:
		default:
			close(j.ready)
		}
		return nil
	})
	return g.Wait()
}

// Set hands t to every part.
func (j *Joined) Set(t vtep.Table) {
	for _, p := range j.Parts {
		p.Set(t)
	}
}

// Ready is closed once every part is ready.
func (j *Joined) Ready() <-chan struct{} { return j.ready }

// Stats sums the parts' counters.
func (j *Joined) Stats() Stats {
	var s Stats
	for _, p := range j.Parts {
		s = s.Add(p.Stats())
	}
	return s
}
