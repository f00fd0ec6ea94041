package plugin

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/plugins/ipam/host-local/backend/disk"
)

// Addresses live in host-local's store (containernetworking/plugins
// v1.10.0, disk.Store: one file per address, whose flock on dir/lock
// serialises concurrent plugin processes), in the directory where
// host-local keeps it for the same configuration (Config.storeDir), so
// that weft and host-local (under Flannel's plugin) share it: a node
// switched between them with pods running never hands out an address
// twice. Allocation is round-robin as host-local allocates (allocateIn).
// What weft adds: all-or-nothing across families, and the list of released
// attachments that GC needs to delete their veths.

// ErrExhausted is returned when a node subnet has no free address left.
var ErrExhausted = errors.New("no free address")

// ErrDuplicate is returned when an attachment already holds an address.
var ErrDuplicate = errors.New("attachment already has an address")

// Attachment names one pod interface: the runtime's container ID and the
// interface name inside the pod.
type Attachment struct {
	ContainerID string
	IfName      string
}

// key is the content of the attachment's reservation files.
func (a Attachment) key() string {
	return strings.TrimSpace(a.ContainerID) + disk.LineBreak + a.IfName
}

// Range is one family's pool: every host address of Subnet except the
// network address, the IPv4 broadcast and Gateway. ID numbers the
// round-robin marker last_reserved_ip.<ID>.
type Range struct {
	Subnet  netip.Prefix
	Gateway netip.Addr
	ID      int
}

// openStore opens the address store of conf's network where host-local
// keeps it: <ipam.dataDir>/<network>/, created if needed.
func openStore(conf *Config) (*disk.Store, error) {
	s, err := disk.New(conf.Name, conf.IPAM.DataDir)
	if err != nil {
		return nil, fmt.Errorf("open address store: %w", err)
	}
	return s, nil
}

// ErrRequested is returned when a requested address (runtimeConfig ips,
// args.cni.ips, CNI_ARGS IP) cannot be given.
var ErrRequested = errors.New("requested address")

// allocate reserves one address per range for a, all or none: in a range
// holding one of want (the requested addresses), that one, as host-local
// does. An attachment that already holds an address is ErrDuplicate, a
// full range ErrExhausted, a requested address outside every range, the
// gateway, taken or a second one in a range ErrRequested.
func allocate(s *disk.Store, a Attachment, ranges []Range, want []netip.Addr) ([]netip.Prefix, error) {
	held, err := lookup(s, a)
	if err != nil {
		return nil, err
	}
	if len(held) > 0 {
		return nil, fmt.Errorf("allocate for %s/%s: %w (%v); DEL it first", a.ContainerID, a.IfName, ErrDuplicate, held)
	}
	req, err := requestedIn(ranges, want)
	if err != nil {
		return nil, err
	}
	got := make([]netip.Prefix, 0, len(ranges))
	for i, r := range ranges {
		p, err := allocateIn(s, a, r, req[i])
		if err != nil {
			if len(got) > 0 { // a held nothing before: release frees only ours
				err = errors.Join(err, release(s, a))
			}
			return nil, err
		}
		got = append(got, p)
	}
	return got, nil
}

// requestedIn maps each of want to the range that may hold it.
func requestedIn(ranges []Range, want []netip.Addr) ([]netip.Addr, error) {
	req := make([]netip.Addr, len(ranges))
	for _, w := range want {
		i := slices.IndexFunc(ranges, func(r Range) bool { return r.Subnet.Contains(w) })
		if i < 0 {
			subnets := make([]string, len(ranges))
			for j, r := range ranges {
				subnets[j] = r.Subnet.String()
			}
			return nil, fmt.Errorf("%w %s is outside the node subnet (%s)", ErrRequested, w, strings.Join(subnets, ", "))
		}
		r := ranges[i]
		first, last, _ := hostRange(r.Subnet)
		switch {
		case req[i].IsValid():
			return nil, fmt.Errorf("%w %s: %s is requested too, and %s gets one address", ErrRequested, w, req[i], r.Subnet)
		case w == r.Gateway:
			return nil, fmt.Errorf("%w %s is the node subnet's gateway", ErrRequested, w)
		case !inRange(w, first, last):
			return nil, fmt.Errorf("%w %s is not a host address of %s", ErrRequested, w, r.Subnet)
		}
		req[i] = w
	}
	return req, nil
}

// allocateIn reserves one address of r for a, as host-local's allocator
// does and in its files: want if it is valid (and free), else round-robin
// from the address after the last one reserved in r
// (last_reserved_ip.<ID>; from the first if that is outside r), wrapping
// around, each candidate taken by creating its file (O_EXCL, so concurrent
// plugins never share one). Written here rather than using host-local's
// allocator package, which links in the iptables and nftables helpers of
// pkg/ip, whose initialisation every plugin run would pay.
func allocateIn(s *disk.Store, a Attachment, r Range, want netip.Addr) (netip.Prefix, error) {
	first, last, ok := hostRange(r.Subnet.Masked())
	if !ok {
		return netip.Prefix{}, fmt.Errorf("%w in %s", ErrExhausted, r.Subnet.Masked())
	}
	rangeID := strconv.Itoa(r.ID)
	var got netip.Addr
	err := locked(s, func() error {
		if want.IsValid() {
			ok, err := s.Reserve(a.ContainerID, a.IfName, want.AsSlice(), rangeID)
			if err != nil {
				return fmt.Errorf("reserve %s: %w", want, err)
			}
			if !ok {
				return fmt.Errorf("%w %s is reserved already (another pod holds it)", ErrRequested, want)
			}
			got = want
			return nil
		}
		start := first
		if ip, err := s.LastReservedIP(rangeID); err == nil {
			if lr, ok := netip.AddrFromSlice(ip); ok && inRange(lr.Unmap(), first, last) {
				start = nextIn(lr.Unmap(), first, last)
			}
		}
		for cur := start; ; {
			if cur != r.Gateway {
				ok, err := s.Reserve(a.ContainerID, a.IfName, cur.AsSlice(), rangeID)
				if err != nil {
					return fmt.Errorf("reserve %s: %w", cur, err)
				}
				if ok {
					got = cur
					return nil
				}
			}
			if cur = nextIn(cur, first, last); cur == start {
				return fmt.Errorf("%w in %s", ErrExhausted, r.Subnet.Masked())
			}
		}
	})
	if err != nil {
		return netip.Prefix{}, err
	}
	return netip.PrefixFrom(got, r.Subnet.Bits()), nil
}

// hostRange is the first and last address a pod may get in subnet p:
// from the one after the network address to the last one (IPv6) or the one
// before the broadcast address (IPv4). ok is false when there is none.
func hostRange(p netip.Prefix) (first, last netip.Addr, ok bool) {
	first = p.Addr().Next()
	b := p.Addr().AsSlice()
	for i := range b {
		if bit := i * 8; bit+8 > p.Bits() {
			keep := max(p.Bits()-bit, 0)
			b[i] |= byte(0xff >> keep)
		}
	}
	last, _ = netip.AddrFromSlice(b)
	if p.Addr().Is4() {
		last = last.Prev()
	}
	return first, last, first.IsValid() && last.IsValid() && p.Contains(first) && first.Compare(last) <= 0
}

func inRange(a, first, last netip.Addr) bool { return a.Compare(first) >= 0 && a.Compare(last) <= 0 }

// nextIn is the address after a in [first, last], wrapping around.
func nextIn(a, first, last netip.Addr) netip.Addr {
	if a == last {
		return first
	}
	return a.Next()
}

// locked runs f holding the store's lock.
func locked(s *disk.Store, f func() error) error {
	if err := s.Lock(); err != nil {
		return fmt.Errorf("lock address store: %w", err)
	}
	defer s.Unlock()
	return f()
}

// release frees every address of a (also from host-local versions that
// stored only the container ID); an unknown attachment is not an error.
func release(s *disk.Store, a Attachment) error {
	return locked(s, func() error {
		if err := s.ReleaseByID(a.ContainerID, a.IfName); err != nil {
			return fmt.Errorf("release %s/%s: %w", a.ContainerID, a.IfName, err)
		}
		return nil
	})
}

// lookup returns the addresses held by a.
func lookup(s *disk.Store, a Attachment) ([]netip.Addr, error) {
	var addrs []netip.Addr
	err := locked(s, func() error {
		for _, ip := range s.GetByID(a.ContainerID, a.IfName) {
			if addr, ok := netip.AddrFromSlice(ip); ok {
				addrs = append(addrs, addr.Unmap())
			}
		}
		return nil
	})
	return addrs, err
}

// gc releases, by host-local's rules, every reservation in dir (the
// store's directory) whose attachment is not in valid, whoever made it
// (the runtime lists every attachment of the network, also those host-local
// reserved under Flannel's plugin), and returns the attachments that no
// longer hold an address.
func gc(s *disk.Store, dir string, valid []types.GCAttachment) ([]Attachment, error) {
	before, err := holders(s, dir)
	if err != nil {
		return nil, err
	}
	if err := s.GC(valid); err != nil {
		return nil, fmt.Errorf("release stale addresses: %w", err)
	}
	after, err := holders(s, dir)
	if err != nil {
		return nil, err
	}
	var gone []Attachment
	for k := range before {
		if !after[k] {
			id, ifname, _ := strings.Cut(k, disk.LineBreak)
			gone = append(gone, Attachment{ContainerID: id, IfName: ifname})
		}
	}
	return gone, nil
}

// holders returns the content (attachment key) of every reservation file
// in dir.
func holders(s *disk.Store, dir string) (map[string]bool, error) {
	var keys map[string]bool
	err := locked(s, func() error {
		var err error
		keys, err = holdersIn(dir)
		return err
	})
	return keys, err
}

// holdersIn is holders for a caller that holds the store lock. A missing
// directory holds nothing.
func holdersIn(dir string) (map[string]bool, error) {
	keys := map[string]bool{}
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return keys, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list address store: %w", err)
	}
	for _, e := range entries {
		if _, err := netip.ParseAddr(e.Name()); err != nil || !e.Type().IsRegular() {
			continue // lock, last_reserved_ip.*
		}
		if b, err := os.ReadFile(filepath.Join(dir, e.Name())); err == nil {
			keys[strings.TrimSpace(string(b))] = true
		}
	}
	return keys, nil
}
