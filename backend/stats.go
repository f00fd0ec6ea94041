package backend

// Stats is what every dataplane reports about itself, in one shape, so that
// the daemon exports the same metrics whichever backend runs.
//
// Counters only grow during the life of one Backend value. Maps may be nil
// when empty; readers treat a missing key as zero.
type Stats struct {
	// Repairs counts what the dataplane put back because it had drifted
	// from what it had programmed (deleted or changed by someone else, or
	// a socket that failed), by kind: "device", "address", "neigh", "fdb",
	// "route", "socket". A recreated device counts once as "device"; the
	// entries rewritten on it then are not counted again.
	Repairs map[string]uint64
	// TxFrames and RxFrames count the inner frames the dataplane sent into
	// and took out of the overlay. A kernel dataplane reports its device's
	// packet counters.
	TxFrames, RxFrames uint64
	// Drops counts frames and datagrams the dataplane dropped, by reason.
	Drops map[string]uint64
	// Events counts other things worth watching, by name (for example
	// uvxlan's "partial_checksum").
	Events map[string]uint64
}

// Reporter is the part of a Backend that reports its counters. Stats is
// safe to call at any time, from any goroutine, also before and after Run.
type Reporter interface {
	Stats() Stats
}

// Add returns the sum of s and o (the Stats of the parts of a Joined).
func (s Stats) Add(o Stats) Stats {
	sum := Stats{TxFrames: s.TxFrames + o.TxFrames, RxFrames: s.RxFrames + o.RxFrames}
	sum.Repairs = addCounts(s.Repairs, o.Repairs)
	sum.Drops = addCounts(s.Drops, o.Drops)
	sum.Events = addCounts(s.Events, o.Events)
	return sum
}

func addCounts(a, b map[string]uint64) map[string]uint64 {
	if len(a)+len(b) == 0 {
		return nil
	}
	out := make(map[string]uint64, len(a)+len(b))
	for k, v := range a {
		out[k] += v
	}
	for k, v := range b {
		out[k] += v
	}
	return out
}
