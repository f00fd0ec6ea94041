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

// EtcdLeases lists <prefix>/subnets/ with the time left on each etcd
// lease (Lease.Expiration; zero for a key without TTL, a reservation).
// Keys or values that do not parse are returned as errors in bad, not
// dropped silently.
func EtcdLeases(ctx context.Context, c *clientv3.Client, prefix string) (leases []subnet.Lease, bad []error, err error) {
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
		l := subnet.Lease{Subnet: v4, IPv6Subnet: v6, Revision: kv.ModRevision}
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
		}
		leases = append(leases, l)
	}
	SortLeases(leases)
	return leases, bad, nil
}

// SortLeases orders leases by subnet.
func SortLeases(ls []subnet.Lease) {
	slices.SortFunc(ls, func(a, b subnet.Lease) int {
		if c := a.Subnet.Addr().Compare(b.Subnet.Addr()); c != 0 {
			return c
		}
		return a.IPv6Subnet.Addr().Compare(b.IPv6Subnet.Addr())
	})
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
// VTEP MAC, backend type and time left, relative to now.
func RenderLeases(w io.Writer, ls []subnet.Lease, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SUBNET\tNODE IP\tVTEP MAC\tBACKEND\tTTL LEFT")
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
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", sn, addrOrDash(l.Attrs.PublicIP), mac, l.Attrs.BackendType, ttlLeft(l.Expiration, now))
	}
	return tw.Flush()
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
