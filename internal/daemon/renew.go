package daemon

import (
	"context"
	"errors"
	"time"

	"github.com/weft-net/weft/subnet"
)

// renew keeps the lease alive: RenewMargin before it expires, and after a
// failure again every RetryInterval, or sooner as the expiry nears, so that a
// datastore outage shorter than the margin never costs the lease. Each
// attempt is bounded by a third of the time left, so one call that hangs on a
// dead etcd member cannot use up the margin. A lease without expiry needs
// nothing.
func (d *Daemon) renew(ctx context.Context, lease subnet.Lease) error {
	for !lease.Expiration.IsZero() {
		wait := time.Until(lease.Expiration.Add(-d.cfg.RenewMargin))
		if wait <= 0 { // margin longer than the TTL: renew at half the time left
			wait = max(time.Until(lease.Expiration)/2, 100*time.Millisecond)
		}
		if err := sleep(ctx, wait); err != nil {
			return nil
		}
		next, err := d.renewOnce(ctx, lease)
		if err != nil {
			return err
		}
		if next.Expiration.IsZero() && ctx.Err() != nil {
			return nil
		}
		lease = next
	}
	<-ctx.Done()
	return nil
}

// renewOnce renews the lease, retrying until it succeeds, the lease is lost
// (errLeaseLost) or ctx ends (a zero lease).
func (d *Daemon) renewOnce(ctx context.Context, lease subnet.Lease) (subnet.Lease, error) {
	for {
		left := time.Until(lease.Expiration)
		started := time.Now()
		actx, cancel := context.WithTimeout(ctx, min(max(left/3, time.Second), 30*time.Second))
		next, err := d.cfg.Registry.Renew(actx, lease)
		cancel()
		d.cfg.Metrics.renewed(err)
		switch {
		case err == nil:
			d.log.Info("renewed lease", "subnet", next.Subnet, "expires", next.Expiration)
			return next, nil
		case errors.Is(err, subnet.ErrLeaseLost):
			return subnet.Lease{}, errLeaseLost
		case ctx.Err() != nil:
			return subnet.Lease{}, nil
		}
		retry := retryIn(min(d.retryDelay(), max(time.Until(lease.Expiration)/4, 100*time.Millisecond)), time.Since(started))
		d.log.Warn("cannot renew the lease, retrying", "err", err, "retryIn", retry, "expires", lease.Expiration)
		if sleep(ctx, retry) != nil {
			return subnet.Lease{}, nil
		}
	}
}

// retryIn is the wait before the next attempt of a call that failed after
// spent, for attempts that start at most every apart (5 s at most,
// retryDelay). An attempt that waited that long already (a request queued
// for an unreachable datastore until its timeout) is followed by the next
// at once: a renewal is then always waiting when the datastore returns and
// goes through as soon as the connection does. Sleeping the interval after
// a timed-out attempt made the node miss the return by up to that much
// (bench/faults: etcd outage, node cut off from etcd).
func retryIn(every, spent time.Duration) time.Duration { return max(every-spent, 0) }
