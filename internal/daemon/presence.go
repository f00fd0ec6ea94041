package daemon

import (
	"context"
	"errors"
	"fmt"

	"github.com/weft-net/weft/subnet"
)

// awaitPresence waits until the node's public addresses are claimed (no
// other running node advertises them), saying meanwhile why in Waiting.
func (d *Daemon) awaitPresence(ctx context.Context) error {
	p := d.cfg.Presence
	if p == nil {
		return nil
	}
	for {
		held, err := p.Held()
		if held {
			d.setWaiting(nil)
			return nil
		}
		d.setWaiting(err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-p.Changed():
		}
	}
}

// errPresenceLost ends a session whose public address another running node
// claimed while this one's claim had lapsed (etcd out of reach for longer
// than its TTL): the two would share the subnet found by that address.
var errPresenceLost = fmt.Errorf("another running node claimed this node's public IP: %w", errLeaseLost)

// watchPresence returns errPresenceLost once another node holds the claim;
// a claim that lapsed and is not taken (etcd out of reach) keeps the
// session.
func (d *Daemon) watchPresence(ctx context.Context) error {
	p := d.cfg.Presence
	if p == nil {
		return nil
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-p.Changed():
		}
		if held, err := p.Held(); !held && errors.Is(err, subnet.ErrPublicIPTaken) {
			d.log.Error("another running node claimed this node's public IP while its claim had lapsed; stopping the lease's session until the address is ours again",
				"err", err)
			return errPresenceLost
		}
	}
}

// Waiting is the error of the last attempt to claim the node's addresses or
// acquire its lease, "" once one succeeded: what /readyz says readiness
// waits for.
func (d *Daemon) Waiting() string {
	if p := d.waiting.Load(); p != nil {
		return *p
	}
	return ""
}

func (d *Daemon) setWaiting(err error) {
	if err == nil {
		d.waiting.Store(nil)
		return
	}
	msg := err.Error()
	d.waiting.Store(&msg)
}
