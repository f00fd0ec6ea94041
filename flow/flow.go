// Package flow keeps the recent flows of a node's pods and the verdicts
// of its network policy, as the kernel reports them: drops that weft's
// policy table logs to an NFLOG group (NFLog), and connections conntrack
// opens and closes, with their byte and packet counts (Conntrack).
//
// A Ring holds the latest flows in a fixed number of slots and takes at
// most a set rate of them (the rest are counted, not kept), so a flood
// cannot grow memory or CPU past its bound; Handler serves it read-only as
// JSON, Metrics counts verdicts per policy with a bounded number of
// labels. Nothing is written anywhere but memory.
package flow

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Directions of a policy verdict.
const (
	DirIngress = "ingress"
	DirEgress  = "egress"
)

// Verdicts and events.
const (
	Dropped = "dropped"
	Allowed = "allowed"

	EventDrop  = "drop"  // a packet the policy table dropped
	EventNew   = "new"   // conntrack confirmed a connection
	EventClose = "close" // conntrack destroyed one, with its counts
)

// Flow is one event of a flow.
type Flow struct {
	Seq     uint64     `json:"seq"`
	Time    time.Time  `json:"time"`
	Node    string     `json:"node,omitempty"`
	Event   string     `json:"event"`
	Verdict string     `json:"verdict"`
	Proto   string     `json:"proto"`
	Src     netip.Addr `json:"src"`
	Dst     netip.Addr `json:"dst"`
	SrcPort uint16     `json:"srcPort,omitempty"`
	DstPort uint16     `json:"dstPort,omitempty"`
	// Direction and Policies say, for a drop, which side's policies
	// isolated the pod (ingress: the destination's, egress: the
	// source's) and which policies those are ("namespace/name");
	// MorePolicies is how many more did not fit in the kernel's log
	// prefix.
	Direction    string   `json:"direction,omitempty"`
	Policies     []string `json:"policies,omitempty"`
	MorePolicies int      `json:"morePolicies,omitempty"`
	// Masqueraded says the kernel rewrote the source (SNAT, as weft's
	// masquerade does to traffic leaving the cluster network) to
	// MasqueradedAs. Service is the address the client asked for when the
	// kernel rewrote the destination (DNAT, as kube-proxy does to a
	// Service's address); Dst and DstPort are then where it went.
	Masqueraded   bool           `json:"masqueraded,omitempty"`
	MasqueradedAs netip.Addr     `json:"masqueradedAs,omitzero"`
	Service       netip.AddrPort `json:"service,omitzero"`
	// Counts are the bytes and packets of a closed connection, each way;
	// nil when the kernel did not count them (nf_conntrack_acct off).
	Counts *Counts `json:"counts,omitempty"`
}

// Counts are a connection's bytes and packets from its initiator (Orig)
// and back (Reply).
type Counts struct {
	OrigBytes    uint64 `json:"origBytes"`
	OrigPackets  uint64 `json:"origPackets"`
	ReplyBytes   uint64 `json:"replyBytes"`
	ReplyPackets uint64 `json:"replyPackets"`
}

// Reason says in words why the flow had its verdict.
func (f Flow) Reason() string {
	if f.Verdict != Dropped {
		return "allowed"
	}
	side := "destination"
	if f.Direction == DirEgress {
		side = "source"
	}
	s := "default deny (" + f.Direction + "): " + side + " pod selected by " + strings.Join(f.Policies, ", ")
	if f.MorePolicies > 0 {
		s += " and " + strconv.Itoa(f.MorePolicies) + " more"
	}
	return s + "; no rule allows"
}

// ProtoName is the name of IP protocol p.
func ProtoName(p uint8) string {
	switch p {
	case 1:
		return "icmp"
	case 2:
		return "igmp"
	case 6:
		return "tcp"
	case 17:
		return "udp"
	case 58:
		return "icmpv6"
	case 132:
		return "sctp"
	}
	return strconv.Itoa(int(p))
}

// Filter selects flows; a zero field selects all.
type Filter struct {
	Verdict   string
	Policy    string       // "namespace/name", or a name alone
	Namespace string       // of a deciding policy
	Addrs     []netip.Addr // source or destination
	Port      uint16       // source or destination port
}

// Match says whether f passes the filter.
func (fl Filter) Match(f Flow) bool {
	if fl.Verdict != "" && f.Verdict != fl.Verdict {
		return false
	}
	if fl.Port != 0 && f.SrcPort != fl.Port && f.DstPort != fl.Port {
		return false
	}
	if len(fl.Addrs) > 0 && !slices.Contains(fl.Addrs, f.Src) && !slices.Contains(fl.Addrs, f.Dst) {
		return false
	}
	if fl.Policy != "" && !slices.ContainsFunc(f.Policies, func(p string) bool {
		return p == fl.Policy || !strings.Contains(fl.Policy, "/") && strings.HasSuffix(p, "/"+fl.Policy)
	}) {
		return false
	}
	if fl.Namespace != "" && !slices.ContainsFunc(f.Policies, func(p string) bool {
		return strings.HasPrefix(p, fl.Namespace+"/")
	}) {
		return false
	}
	return true
}
