package connectivity

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"path"
	"sort"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Member is what one node running `weftctl connectivity` publishes: its
// probe pod and its own VTEP address, each with a TCP echo port.
type Member struct {
	Node     string     `json:"node"` // the node's public IP
	Pod      netip.Addr `json:"pod"`
	PodPort  uint16     `json:"podPort"`
	VTEP     netip.Addr `json:"vtep"`
	VTEPPort uint16     `json:"vtepPort"`
}

// Row is one node's measurements, published for the others to print.
type Row struct {
	Node  string     `json:"node"`
	Pods  []PairJSON `json:"pods"`
	Nodes []PairJSON `json:"nodes"`
}

// PairJSON is a Pair as it travels through etcd.
type PairJSON struct {
	From, To        string
	Sent, Received  int
	Min, Avg, Max   time.Duration
	TCP             time.Duration
	TCPErr, PingErr string
	// The DF probes (Pair.DF, Pair.DFSize); absent from older weftctls.
	DFSize             int    `json:",omitempty"`
	DFSent, DFReceived int    `json:",omitempty"`
	DFErr              string `json:",omitempty"`
	// The DF probes were refused with "fragmentation needed" (DFErr is a
	// FragNeededError), naming DFPathMTU (0: unknown).
	DFFragNeeded bool `json:",omitempty"`
	DFPathMTU    int  `json:",omitempty"`
}

// ToJSON converts pairs for publishing.
func ToJSON(ps []Pair) []PairJSON {
	out := make([]PairJSON, len(ps))
	for i, p := range ps {
		out[i] = PairJSON{From: p.From, To: p.To, Sent: p.Ping.Sent, Received: p.Ping.Received,
			Min: p.Ping.Min, Avg: p.Ping.Avg, Max: p.Ping.Max, TCP: p.TCP,
			DFSize: p.DFSize, DFSent: p.DF.Sent, DFReceived: p.DF.Received}
		if p.DF.Err != nil {
			out[i].DFErr = p.DF.Err.Error()
		}
		var fn *FragNeededError
		if errors.As(p.DF.Err, &fn) {
			out[i].DFFragNeeded, out[i].DFPathMTU = true, fn.MTU
		}
		if p.TCPErr != nil {
			out[i].TCPErr = p.TCPErr.Error()
		}
		if p.Ping.Err != nil {
			out[i].PingErr = p.Ping.Err.Error()
		}
	}
	return out
}

// FromJSON converts published pairs back.
func FromJSON(ps []PairJSON) []Pair {
	out := make([]Pair, len(ps))
	for i, p := range ps {
		out[i] = Pair{From: p.From, To: p.To, TCP: p.TCP,
			Ping:   Stats{Sent: p.Sent, Received: p.Received, Min: p.Min, Avg: p.Avg, Max: p.Max},
			DFSize: p.DFSize, DF: Stats{Sent: p.DFSent, Received: p.DFReceived}}
		if p.DFErr != "" {
			out[i].DF.Err = remoteError(p.DFErr)
		}
		if p.DFFragNeeded {
			out[i].DF.Err = &FragNeededError{MTU: p.DFPathMTU}
		}
		if p.TCPErr != "" {
			out[i].TCPErr = remoteError(p.TCPErr)
		}
	}
	return out
}

type remoteError string

func (e remoteError) Error() string { return string(e) }

// Rendezvous lets the nodes of one run find each other through etcd under
// <prefix>/connectivity/: members/<node> and results/<node>, written with
// an etcd lease of TTL, kept alive while the run lasts, so that a killed
// run leaves nothing for long. Leave revokes it.
type Rendezvous struct {
	Client *clientv3.Client
	Prefix string // the network's etcd prefix
	TTL    time.Duration
	lease  clientv3.LeaseID
}

func (r *Rendezvous) dir(kind string) string { return path.Join(r.Prefix, "connectivity", kind) + "/" }

func (r *Rendezvous) put(ctx context.Context, kind, node string, v any) error {
	if r.lease == 0 {
		l, err := r.Client.Grant(ctx, int64(r.TTL/time.Second)+1)
		if err != nil {
			return fmt.Errorf("connectivity: grant an etcd lease: %w", err)
		}
		r.lease = l.ID
		// Kept alive while this run lasts however many nodes it measures;
		// a killed run's keys go after TTL.
		ka, err := r.Client.KeepAlive(context.WithoutCancel(ctx), l.ID)
		if err != nil {
			return fmt.Errorf("connectivity: keep the etcd lease alive: %w", err)
		}
		go func() {
			for range ka { // ends when the lease is revoked or the client closed
			}
		}()
	}
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if _, err := r.Client.Put(ctx, r.dir(kind)+node, string(b), clientv3.WithLease(r.lease)); err != nil {
		return fmt.Errorf("connectivity: publish %s: %w", kind, err)
	}
	return nil
}

// Join publishes m.
func (r *Rendezvous) Join(ctx context.Context, m Member) error {
	return r.put(ctx, "members", m.Node, m)
}

// Publish publishes this node's row.
func (r *Rendezvous) Publish(ctx context.Context, row Row) error {
	return r.put(ctx, "results", row.Node, row)
}

// Leave revokes the etcd lease, removing what this node published.
func (r *Rendezvous) Leave(ctx context.Context) {
	if r.lease != 0 {
		r.Client.Revoke(ctx, r.lease)
	}
}

// WaitMembers waits until want members joined or until ctx ends, and
// returns those that did.
func (r *Rendezvous) WaitMembers(ctx context.Context, want int) ([]Member, error) {
	return waitFor[Member](ctx, r, "members", want)
}

// WaitRows waits until want rows are published or until ctx ends.
func (r *Rendezvous) WaitRows(ctx context.Context, want int) ([]Row, error) {
	rows, err := waitFor[Row](ctx, r, "results", want)
	sort.Slice(rows, func(i, j int) bool { return rows[i].Node < rows[j].Node })
	return rows, err
}

// Done says this node has read every row, and waits until want nodes
// have said so (or ctx ends): a node that left earlier would take its
// row away from one still waiting for it.
func (r *Rendezvous) Done(ctx context.Context, node string, want int) error {
	if err := r.put(ctx, "done", node, node); err != nil {
		return err
	}
	_, err := waitFor[string](ctx, r, "done", want)
	return err
}

// waitFor collects the values under kind until it has seen want of them
// or ctx ends: the listing, then every write from the listing's revision
// on. A value deleted after it was seen still counts (a node that is
// finished leaves), so every node gets past every stage.
func waitFor[T any](ctx context.Context, r *Rendezvous, kind string, want int) ([]T, error) {
	resp, err := r.Client.Get(ctx, r.dir(kind), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("connectivity: list %s: %w", kind, err)
	}
	seen := map[string]T{}
	add := func(k, v []byte) {
		var t T
		if json.Unmarshal(v, &t) == nil {
			seen[string(k)] = t
		}
	}
	for _, kv := range resp.Kvs {
		add(kv.Key, kv.Value)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w := r.Client.Watch(wctx, r.dir(kind), clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
	for len(seen) < want {
		select {
		case <-ctx.Done():
			return values(seen), nil // the caller goes on with whoever came
		case wr, ok := <-w:
			if !ok || wr.Err() != nil {
				return values(seen), fmt.Errorf("connectivity: watch %s: %v", kind, wr.Err())
			}
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypePut {
					add(ev.Kv.Key, ev.Kv.Value)
				}
			}
		}
	}
	return values(seen), nil
}

// values returns the map's values ordered by key.
func values[T any](m map[string]T) []T {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]T, 0, len(keys))
	for _, k := range keys {
		out = append(out, m[k])
	}
	return out
}
