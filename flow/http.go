package flow

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// Page is what Handler answers: the node's flows that match, oldest
// first, the sequence number to ask from next (since=Next), the ring's
// counts and what its readers missed.
type Page struct {
	Node    string   `json:"node"`
	Flows   []Flow   `json:"flows"`
	Next    uint64   `json:"next"`
	Stats   Stats    `json:"stats"`
	Readers *Readers `json:"readers,omitempty"`
}

// Readers says what the kernel's events to a node's flows lacked since
// weftd started: the times a socket overflowed (Lost), and the pauses of
// the conntrack reader over its rate.
type Readers struct {
	Lost                   uint64  `json:"lost"`
	ConntrackRate          int     `json:"conntrackRate"`
	ConntrackPauses        uint64  `json:"conntrackPauses"`
	ConntrackPausedSeconds float64 `json:"conntrackPausedSeconds"`
}

// Gaps says in words what the node's flows lacked since weftd started
// (the counts are weftd's, not the page's), or "" when nothing.
func (p Page) Gaps() string {
	var parts []string
	if n := p.Stats.Suppressed; n > 0 {
		parts = append(parts, fmt.Sprintf("%d flows over the ring's rate (%g a second) not kept", n, p.Stats.Rate))
	}
	if r := p.Readers; r != nil {
		if r.ConntrackPauses > 0 {
			parts = append(parts, fmt.Sprintf("conntrack's events not read for %.1f s in %d pauses (over %d a second)",
				r.ConntrackPausedSeconds, r.ConntrackPauses, r.ConntrackRate))
		}
		if r.Lost > 0 {
			parts = append(parts, fmt.Sprintf("events lost %d times (a socket overflowed)", r.Lost))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return "since weftd started, " + strings.Join(parts, "; ")
}

// MaxWait bounds the wait=seconds a request may ask for.
const MaxWait = 30 * time.Second

// Handler serves r read-only: GET with the query parameters since (a
// sequence number), limit, wait (seconds to wait for a flow after since
// when there is none yet, at most MaxWait) and the filters verdict,
// policy, namespace, addr (repeatable) and port. readers, when not nil,
// says what the node's readers missed.
func Handler(node string, r *Ring, readers func() Readers) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodGet {
			http.Error(w, "flows: GET only", http.StatusMethodNotAllowed)
			return
		}
		q, err := parseQuery(req)
		if err != nil {
			http.Error(w, "flows: "+err.Error(), http.StatusBadRequest)
			return
		}
		flows, next := r.Since(q.since, q.filter.Match, q.limit)
		if len(flows) == 0 && q.wait > 0 {
			ctx, cancel := context.WithTimeout(req.Context(), q.wait)
			defer cancel()
			for len(flows) == 0 && ctx.Err() == nil {
				r.Wait(ctx, next)
				var more []Flow
				more, next = r.Since(next, q.filter.Match, q.limit)
				flows = more
			}
		}
		if flows == nil {
			flows = []Flow{}
		}
		for i := range flows {
			flows[i].Node = node
		}
		page := Page{Node: node, Flows: flows, Next: next, Stats: r.Stats()}
		if readers != nil {
			rs := readers()
			page.Readers = &rs
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(page)
	})
}

type query struct {
	since  uint64
	limit  int
	wait   time.Duration
	filter Filter
}

func parseQuery(req *http.Request) (query, error) {
	v := req.URL.Query()
	var q query
	var err error
	if s := v.Get("since"); s != "" {
		if q.since, err = strconv.ParseUint(s, 10, 64); err != nil {
			return q, fmt.Errorf("since %q: %w", s, err)
		}
	}
	if s := v.Get("limit"); s != "" {
		if q.limit, err = strconv.Atoi(s); err != nil || q.limit < 0 {
			return q, fmt.Errorf("limit %q: not a count", s)
		}
	}
	if s := v.Get("wait"); s != "" {
		secs, err := strconv.ParseFloat(s, 64)
		if err != nil || secs < 0 {
			return q, fmt.Errorf("wait %q: not a number of seconds", s)
		}
		q.wait = min(time.Duration(secs*float64(time.Second)), MaxWait)
	}
	if s := v.Get("port"); s != "" {
		p, err := strconv.ParseUint(s, 10, 16)
		if err != nil {
			return q, fmt.Errorf("port %q: %w", s, err)
		}
		q.filter.Port = uint16(p)
	}
	for _, s := range v["addr"] {
		for _, one := range strings.Split(s, ",") {
			a, err := netip.ParseAddr(one)
			if err != nil {
				return q, fmt.Errorf("addr: %w", err)
			}
			q.filter.Addrs = append(q.filter.Addrs, a)
		}
	}
	q.filter.Verdict, q.filter.Policy, q.filter.Namespace = v.Get("verdict"), v.Get("policy"), v.Get("namespace")
	return q, nil
}
