package connectivity

import (
	"context"
	"encoding/json"
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
}

// ToJSON converts pairs for publishing.
func ToJSON(ps []Pair) []PairJSON {
	out := make([]PairJSON, len(ps))
	for i, p := range ps {
		out[i] = PairJSON{From: p.From, To: p.To, Sent: p.Ping.Sent, Received: p.Ping.Received,
			Min: p.Ping.Min, Avg: p.Ping.Avg, Max: p.Ping.Max, TCP: p.TCP}
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
			Ping: Stats{Sent: p.Sent, Received: p.Received, Min: p.Min, Avg: p.Avg, Max: p.Max}}
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
// an etcd lease of TTL so that a killed run leaves nothing for long.
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

// list decodes every value under kind.
func list[T any](ctx context.Context, r *Rendezvous, kind string) ([]T, error) {
	resp, err := r.Client.Get(ctx, r.dir(kind), clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		return nil, fmt.Errorf("connectivity: list %s: %w", kind, err)
	}
	var out []T
	for _, kv := range resp.Kvs {
		var v T
		if json.Unmarshal(kv.Value, &v) == nil {
			out = append(out, v)
		}
	}
	return out, nil
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

func waitFor[T any](ctx context.Context, r *Rendezvous, kind string, want int) ([]T, error) {
	w := r.Client.Watch(ctx, r.dir(kind), clientv3.WithPrefix())
	for {
		got, err := list[T](context.WithoutCancel(ctx), r, kind)
		if err != nil || len(got) >= want {
			return got, err
		}
		select {
		case <-ctx.Done():
			return got, nil // the caller goes on with whoever came
		case <-w:
		}
	}
}
