package subnet

import (
	"log/slog"
	"sync"
)

// Rejections records the leases (and keys, and annotations) that are left
// out because they fail a check: each is logged once per key and reason, and
// counted once by reason through the count function (weftd's
// weft_leases_rejected_total). The registries report what does not parse, the
// daemon what parses but must not become a peer. Safe for concurrent use; a
// nil *Rejections records nothing.
type Rejections struct {
	log   *slog.Logger
	count func(reason string)

	mu   sync.Mutex
	seen map[string]string // key → reason last logged
}

// NewRejections returns a recorder logging to log; count may be nil.
func NewRejections(log *slog.Logger, count func(reason string)) *Rejections {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Rejections{log: log, count: count, seen: map[string]string{}}
}

// Reject records that key is left out for reason. Repeats of the same key
// and reason (a watch listing again) are neither logged nor counted again.
func (r *Rejections) Reject(key, reason string, err error) {
	if r == nil {
		return
	}
	r.mu.Lock()
	if r.seen[key] == reason {
		r.mu.Unlock()
		return
	}
	r.seen[key] = reason
	r.mu.Unlock()
	r.log.Warn("left out a subnet lease that fails a check", "key", key, "reason", reason, "err", err)
	if r.count != nil {
		r.count(reason)
	}
}

// Forget drops what is recorded for key (it was deleted, or now passes), so
// that a later rejection of it is logged and counted again.
func (r *Rejections) Forget(key string) {
	if r == nil {
		return
	}
	r.mu.Lock()
	delete(r.seen, key)
	r.mu.Unlock()
}
