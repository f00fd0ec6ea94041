package inspect

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"path"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/weft-net/weft/subnet"
)

// EtcdConfig reads and parses <prefix>/config.
func EtcdConfig(ctx context.Context, c *clientv3.Client, prefix string) (*subnet.Config, error) {
	key := path.Join(prefix, "config")
	r, err := c.Get(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", key, err)
	}
	if len(r.Kvs) == 0 {
		return nil, fmt.Errorf("read %s: no network config in etcd (wrong --etcd-prefix?)", key)
	}
	return subnet.ParseConfig(r.Kvs[0].Value)
}

// DefaultRenewMargin is how long before expiry weftd and flanneld renew a
// lease unless --subnet-lease-renew-margin says otherwise.
const DefaultRenewMargin = time.Hour

// Listed is a lease as listed from etcd, with the TTL its etcd lease was
// last granted for: weftd and flanneld grant a fresh etcd lease at each
// renewal, so Expiration minus Granted is when the node last renewed. Zero
// for a key without an etcd lease (a reservation) and for leases from the
// Kubernetes API.
type Listed struct {
	subnet.Lease
	Granted time.Duration
}

// Leases returns the leases of ls.
func Leases(ls []Listed) []subnet.Lease {
	out := make([]subnet.Lease, len(ls))
	for i, l := range ls {
		out[i] = l.Lease
	}
	return out
}

// EtcdLeases lists <prefix>/subnets/ with the time left on each etcd
// lease (Lease.Expiration; zero for a key without TTL, a reservation) and
// the TTL it was granted for. Keys or values that do not parse are
// returned as errors in bad, not dropped silently.
func EtcdLeases(ctx context.Context, c *clientv3.Client, prefix string) (leases []Listed, bad []error, err error) {
	dir := path.Join(prefix, "subnets") + "/"
	r, err := c.Get(ctx, dir, clientv3.WithPrefix())
	if err != nil {
		return nil, nil, fmt.Errorf("list %s: %w", dir, err)
	}
	now := time.Now()
	for _, kv := range r.Kvs {
		key := strings.TrimPrefix(string(kv.Key), dir)
		v4, v6, err := subnet.ParseKey(key)
		if err != nil {
			bad = append(bad, err)
			continue
		}
		l := Listed{Lease: subnet.Lease{Subnet: v4, IPv6Subnet: v6, Revision: kv.ModRevision}}
		if err := json.Unmarshal(kv.Value, &l.Attrs); err != nil {
			bad = append(bad, fmt.Errorf("lease %s: %w", key, err))
			continue
		}
		if kv.Lease != 0 {
			ttl, err := c.TimeToLive(ctx, clientv3.LeaseID(kv.Lease))
			if err != nil {
				return nil, nil, fmt.Errorf("ttl of lease %s: %w", key, err)
			}
			l.Expiration = now.Add(time.Duration(ttl.TTL) * time.Second)
			l.Granted = time.Duration(ttl.GrantedTTL) * time.Second
		}
		leases = append(leases, l)
	}
	slices.SortFunc(leases, func(a, b Listed) int { return compareLeases(a.Lease, b.Lease) })
	return leases, bad, nil
}

// SortLeases orders leases by subnet.
func SortLeases(ls []subnet.Lease) {
	slices.SortFunc(ls, compareLeases)
}

func compareLeases(a, b subnet.Lease) int {
	if c := a.Subnet.Addr().Compare(b.Subnet.Addr()); c != 0 {
		return c
	}
	return a.IPv6Subnet.Addr().Compare(b.IPv6Subnet.Addr())
}

// LeaseFor returns the lease whose subnet holds ip.
func LeaseFor(ls []subnet.Lease, ip netip.Addr) (subnet.Lease, bool) {
	for _, l := range ls {
		if l.Subnet.Contains(ip) || l.IPv6Subnet.Contains(ip) {
			return l, true
		}
	}
	return subnet.Lease{}, false
}

// RenderLeases prints one line per lease: subnet, node (public) address,
// VTEP MAC, backend type, time left, and where the lease stands in its
// node's renewals (see Overdue), relative to now. margin is the nodes'
// --subnet-lease-renew-margin.
func RenderLeases(w io.Writer, ls []Listed, margin time.Duration, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SUBNET\tNODE IP\tVTEP MAC\tBACKEND\tTTL LEFT\tRENEWAL")
	for _, l := range ls {
		sn := l.Subnet.String()
		if !l.Subnet.IsValid() {
			sn = "-"
		}
		if l.IPv6Subnet.IsValid() {
			sn += "," + l.IPv6Subnet.String()
		}
		mac := "-"
		if l.Attrs.BackendData != nil {
			mac = l.Attrs.BackendData.VtepMAC.String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", sn, addrOrDash(l.Attrs.PublicIP), mac, l.Attrs.BackendType,
			ttlLeft(l.Expiration, now), renewal(l, margin, now))
	}
	return tw.Flush()
}

// renewalDue is when l's node should renew it, as weftd (and flanneld)
// schedule it: margin before it expires, or halfway through its TTL when
// the margin is as long as the TTL or longer; and the grace after that
// before Overdue calls it late. ok is false for a lease that is not
// renewed (a reservation, a Kubernetes lease).
func renewalDue(l Listed, margin time.Duration) (due time.Time, grace time.Duration, ok bool) {
	if l.Expiration.IsZero() || l.Granted <= 0 {
		return time.Time{}, 0, false
	}
	left := margin
	if margin >= l.Granted {
		left = l.Granted / 2
	}
	// The grace covers a renewal in flight or retried (weftd retries
	// within seconds) and etcd's whole-second TTLs (up to a second off).
	return l.Expiration.Add(-left), min(max(left/10, 3*time.Second), time.Minute), true
}

// Overdue reports whether l's node has not renewed it on time: its renewal
// was due (see renewalDue) more than a grace ago, a tenth of the time
// between due and expiry, from 3 s to a minute. Such a node has most likely
// stopped (or lost etcd); the lease stays taken until it expires. late is
// how long ago the renewal was due.
func Overdue(l Listed, margin time.Duration, now time.Time) (late time.Duration, overdue bool) {
	due, grace, ok := renewalDue(l, margin)
	if !ok {
		return 0, false
	}
	late = now.Sub(due)
	return late, late > grace
}

func renewal(l Listed, margin time.Duration, now time.Time) string {
	due, _, ok := renewalDue(l, margin)
	if !ok {
		return "-"
	}
	if late, overdue := Overdue(l, margin, now); overdue {
		return "OVERDUE " + late.Round(time.Second).String()
	}
	if d := due.Sub(now).Round(time.Second); d > 0 {
		return "due in " + d.String()
	}
	return "due now"
}

func ttlLeft(exp, now time.Time) string {
	if exp.IsZero() {
		return "no TTL"
	}
	d := exp.Sub(now).Round(time.Second)
	if d <= 0 {
		return "expired"
	}
	return d.String()
}

func addrOrDash(a netip.Addr) string {
	if !a.IsValid() {
		return "-"
	}
	return a.String()
}
