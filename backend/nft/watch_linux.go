package nft

import (
	"context"
	"log/slog"
	"time"

	"github.com/google/nftables"
)

// watchRetry is how long WatchTables waits before it subscribes again after
// losing its subscription.
const watchRetry = time.Second

// WatchTables sends on changed (without blocking: changed should have room
// for one) after each nftables transaction in the namespace at path (""
// for the current one) that touched a table, chain, set or rule of a table
// named in tables (any family), and once each time it has subscribed (at
// the start and after a lost subscription, when changes may have gone
// unseen). It subscribes again after an error, and returns when ctx ends.
func WatchTables(ctx context.Context, path string, tables []string, log *slog.Logger, changed chan<- struct{}) {
	for {
		err := watchOnce(ctx, path, tables, changed)
		if ctx.Err() != nil {
			return
		}
		log.Warn("lost the nftables change notifications; subscribing again", "err", err, "retryIn", watchRetry)
		select {
		case <-ctx.Done():
			return
		case <-time.After(watchRetry):
		}
	}
}

// watchOnce subscribes once and forwards notifications until ctx ends or
// the subscription fails.
func watchOnce(ctx context.Context, path string, tables []string, changed chan<- struct{}) error {
	// A lasting connection: the monitor subscribes on its socket, which
	// is closed here however the subscription ends (the monitor closes a
	// socket of its own only when Close is called before a receive error).
	conn, closeNS, err := dial(path, nftables.AsLasting())
	if err != nil {
		return err
	}
	defer conn.CloseLasting()
	mon := nftables.NewMonitor(nftables.WithMonitorEventBuffer(16))
	events, err := conn.AddGenerationalMonitor(mon)
	closeNS() // the subscription's socket is open in the namespace
	if err != nil {
		return err
	}
	defer func() {
		mon.Close()
		conn.CloseLasting() // ends the monitor's receive
		for range events {  // let the monitor's goroutine end
		}
	}()
	notify(changed)
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-events:
			if !ok {
				return errMonitorClosed
			}
			if ev.GeneratedBy != nil && ev.GeneratedBy.Error != nil {
				return ev.GeneratedBy.Error
			}
			if touches(ev.Changes, tables) {
				notify(changed)
			}
		}
	}
}

type watchError string

func (e watchError) Error() string { return string(e) }

const errMonitorClosed = watchError("the nftables monitor closed")

func notify(changed chan<- struct{}) {
	select {
	case changed <- struct{}{}:
	default:
	}
}

// touches reports whether changes name a table in tables; a change that
// could not be read counts as touching them.
func touches(changes []*nftables.MonitorEvent, tables []string) bool {
	for _, c := range changes {
		if c.Error != nil {
			return true
		}
		var name string
		switch d := c.Data.(type) {
		case *nftables.Table:
			name = d.Name
		case *nftables.Chain:
			if d.Table != nil {
				name = d.Table.Name
			}
		case *nftables.Rule:
			if d.Table != nil {
				name = d.Table.Name
			}
		case *nftables.Set:
			if d.Table != nil {
				name = d.Table.Name
			}
		default: // set elements and objects: Check does not compare them
			continue
		}
		for _, t := range tables {
			if name == t {
				return true
			}
		}
	}
	return false
}
