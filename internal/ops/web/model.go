package web

import (
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/weft-net/weft/internal/ops/inspect"
	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/vtep"
)

// Snapshot is what the page draws at one moment. It carries no credential
// and no file path: the datastore is named by its kind only.
type Snapshot struct {
	Time     time.Time  `json:"time"`
	Source   string     `json:"source"` // "etcd", "Kubernetes API"
	Network  string     `json:"network"`
	Encap    string     `json:"encap"` // the configured backend, e.g. "vxlan VNI 1, UDP 8472"
	Nodes    []Node     `json:"nodes"`
	Links    []Link     `json:"links"`
	Rejected []Rejected `json:"rejected"`
	Errors   []string   `json:"errors"`
}

// Node is one lease, or an observed node without one.
type Node struct {
	Name      string    `json:"name"`
	Underlay  string    `json:"underlay"`
	Subnet    string    `json:"subnet"` // "" when the node holds no lease
	Backend   string    `json:"backend"`
	VTEPMAC   string    `json:"vtepMAC"`
	LeaseTTL  string    `json:"leaseTTL"`
	Observed  bool      `json:"observed"`  // its kernel and metrics were read
	Dataplane string    `json:"dataplane"` // "kernel VXLAN weft.1", "userspace VXLAN (uvxlan) on TAP weft-u.1"
	Device    string    `json:"device"`
	Bridge    string    `json:"bridge"`
	Pods      []Pod     `json:"pods"`
	Counters  *Counters `json:"counters"`
	Peers     []Peer    `json:"peers"`
	Rejected  string    `json:"rejected"` // why weftd skips this lease ("": it does not)
	Error     string    `json:"error"`
}

// Pod is a pod on a node's bridge.
type Pod struct {
	Name string `json:"name"`
	IP   string `json:"ip"`
	Veth string `json:"veth"`
}

// Counters are a node's dataplane counters: frames from weftd's /metrics
// (weft_dataplane_frames_total), bytes from the overlay device's kernel
// counters plus those uvxlan's fast path carried past the device
// (weft_dataplane_events_total's fastpath_tx_bytes and fastpath_rx_bytes),
// repairs by kind (weft_repairs_total) and leases weftd rejected
// (weft_leases_rejected_total).
type Counters struct {
	TxFrames uint64            `json:"txFrames"`
	RxFrames uint64            `json:"rxFrames"`
	TxBytes  uint64            `json:"txBytes"`
	RxBytes  uint64            `json:"rxBytes"`
	Repairs  map[string]uint64 `json:"repairs"`
	Rejected uint64            `json:"rejected"`
	Ready    bool              `json:"ready"`

	fastTx, fastRx uint64 // bytes the fast path carried, added to the device's
}

// Peer is what an observed node programmed for one remote subnet
// (inspect.Compare's verdict).
type Peer struct {
	Subnet  string `json:"subnet"`
	Verdict string `json:"verdict"`
}

// Link joins two leased nodes. State says, for each observed end, whether
// it programmed the other as leased.
type Link struct {
	ID    string   `json:"id"`
	A     string   `json:"a"`
	B     string   `json:"b"`
	Kind  string   `json:"kind"`
	State []string `json:"state"`
}

// Rejected is a lease that weftd does not take as a peer.
type Rejected struct {
	Key    string `json:"key"`
	Node   string `json:"node"`
	Reason string `json:"reason"`
}

// Observation is what was read on one node: its name and underlay address
// (for a lab node, from the lab's state), its kernel and metrics, its pods.
type Observation struct {
	Name     string
	Underlay netip.Addr
	Kernel   *inspect.Kernel // nil when unread
	Counters *Counters       // nil when unread
	Bridge   string
	Pods     []Pod
	Err      error
}

// Build assembles a snapshot from the leases, the config and what was
// observed on some nodes. A node is named by its observation (matched by
// underlay address) or else by its lease's address.
func Build(now time.Time, source string, cfg *subnet.Config, ls []subnet.Lease, obs []Observation) *Snapshot {
	s := &Snapshot{Time: now, Source: source, Nodes: []Node{}, Links: []Link{}, Rejected: []Rejected{}, Errors: []string{}}
	if cfg != nil {
		s.Network = cfg.Network.String()
		s.Encap = encap(cfg)
	}
	used := map[int]bool{}
	byKey := map[string]string{}
	bad := rejected(cfg, ls)
	for _, l := range ls {
		n := leaseNode(l, now)
		if r, ok := bad[l.Key()]; ok {
			n.Rejected = r
		} else if i := slices.IndexFunc(obs, func(o Observation) bool { return o.Underlay == l.Attrs.PublicIP }); i >= 0 && !used[i] {
			used[i] = true
			observe(&n, obs[i], cfg, ls, l)
		}
		byKey[l.Key()] = n.Name
		s.Nodes = append(s.Nodes, n)
	}
	for i, o := range obs {
		if !used[i] {
			n := Node{Name: o.Name, Underlay: addr(o.Underlay), Error: "holds no lease"}
			observe(&n, o, cfg, ls, subnet.Lease{})
			s.Nodes = append(s.Nodes, n)
		}
	}
	s.Links = links(s.Nodes, ls)
	for _, l := range ls {
		if r, ok := bad[l.Key()]; ok {
			s.Rejected = append(s.Rejected, Rejected{Key: l.Key(), Node: byKey[l.Key()], Reason: r})
		}
	}
	return s
}

func leaseNode(l subnet.Lease, now time.Time) Node {
	n := Node{Name: addr(l.Attrs.PublicIP), Underlay: addr(l.Attrs.PublicIP), Subnet: l.Subnet.String(),
		Backend: string(l.Attrs.BackendType), LeaseTTL: "no TTL", Pods: []Pod{}, Peers: []Peer{}}
	if l.Attrs.BackendData != nil {
		n.VTEPMAC = l.Attrs.BackendData.VtepMAC.String()
	}
	if !l.Expiration.IsZero() {
		n.LeaseTTL = max(l.Expiration.Sub(now).Round(time.Second), 0).String()
	}
	return n
}

// observe adds what was read on the node; self is its lease (zero: none).
func observe(n *Node, o Observation, cfg *subnet.Config, ls []subnet.Lease, self subnet.Lease) {
	n.Name, n.Observed, n.Bridge, n.Pods, n.Counters = o.Name, true, o.Bridge, o.Pods, o.Counters
	if n.Pods == nil {
		n.Pods = []Pod{}
	}
	if o.Err != nil {
		n.Error = o.Err.Error()
	}
	k := o.Kernel
	if k == nil {
		return
	}
	n.Device = k.Device.Name
	n.Dataplane = "kernel VXLAN device " + k.Device.Name
	if k.Device.Kind != inspect.KindVXLAN {
		n.Dataplane = "userspace VXLAN (uvxlan) on TAP " + k.Device.Name
	}
	if !self.Subnet.IsValid() {
		return
	}
	ok, _ := inspect.CheckLeases(cfg, self, ls)
	n.Peers = []Peer{}
	for _, p := range inspect.Compare(k, vtep.FromLeases(ok, self)) {
		n.Peers = append(n.Peers, Peer{Subnet: p.Subnet.String(), Verdict: p.Verdict})
	}
}

// links joins every pair of leased nodes whose leases both pass the checks
// (weftd programs a full mesh), with each observed end's verdict.
func links(nodes []Node, ls []subnet.Lease) []Link {
	var out []Link
	for i, a := range nodes {
		for _, b := range nodes[i+1:] {
			if a.Subnet == "" || b.Subnet == "" || a.Rejected != "" || b.Rejected != "" {
				continue
			}
			l := Link{ID: a.Name + "--" + b.Name, A: a.Name, B: b.Name, Kind: linkKind(a.Backend, b.Backend), State: []string{}}
			for _, end := range [][2]Node{{a, b}, {b, a}} {
				if v := verdict(end[0], end[1].Subnet); v != "" {
					l.State = append(l.State, fmt.Sprintf("%s → %s: %s", end[0].Name, end[1].Name, v))
				}
			}
			out = append(out, l)
		}
	}
	if out == nil {
		out = []Link{}
	}
	return out
}

func linkKind(a, b string) string {
	if a == b {
		return a
	}
	return a + "/" + b
}

func verdict(n Node, subnet string) string {
	for _, p := range n.Peers {
		if p.Subnet == subnet {
			return p.Verdict
		}
	}
	if n.Observed && n.Device != "" {
		return inspect.Missing
	}
	return ""
}

// rejected maps the key of each lease that the config's checks reject, as
// weftd does (prefix lengths held to the config's), to the reason.
func rejected(cfg *subnet.Config, ls []subnet.Lease) map[string]string {
	out := map[string]string{}
	if cfg == nil {
		return out
	}
	for _, l := range ls {
		if err := cfg.CheckLease(l, subnet.PrefixLens{}); err != nil {
			out[l.Key()] = err.Error()
		}
	}
	return out
}

func encap(cfg *subnet.Config) string {
	switch cfg.Backend.Type {
	case subnet.BackendTypeVXLAN:
		return fmt.Sprintf("vxlan VNI %d, UDP %d", cfg.Backend.VNI, cfg.Backend.Port)
	default:
		return string(cfg.Backend.Type)
	}
}

func addr(a netip.Addr) string {
	if !a.IsValid() {
		return "-"
	}
	return a.String()
}
