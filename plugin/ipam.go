package plugin

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

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

func (a Attachment) key() string { return strings.TrimSpace(a.ContainerID) + "\r\n" + a.IfName }

// Range is one family's pool: every host address of Subnet except the
// network, the last address and Gateway. ID names its round-robin marker.
type Range struct {
	Subnet  netip.Prefix
	Gateway netip.Addr
	ID      string
}

const (
	lockName   = "lock"
	lastPrefix = "last_reserved_ip."
)

// Store is a directory of address reservations in host-local's format, one
// file per address named by it, guarded by an flock on dir/lock so that
// concurrent plugin processes serialise. Methods lock for their duration.
type Store struct {
	dir  string
	lock *os.File
}

// OpenStore creates dir if needed and opens its lock file.
func OpenStore(dir string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("open address store: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, lockName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open address store lock: %w", err)
	}
	return &Store{dir: dir, lock: f}, nil
}

// Close releases the lock file.
func (s *Store) Close() error { return s.lock.Close() }

func (s *Store) locked(f func() error) error {
	if err := unix.Flock(int(s.lock.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("lock address store %s: %w", s.dir, err)
	}
	defer unix.Flock(int(s.lock.Fd()), unix.LOCK_UN)
	return f()
}

// Allocate reserves one address per range for a, all or none. An
// attachment that already holds an address is ErrDuplicate.
func (s *Store) Allocate(a Attachment, ranges []Range) ([]netip.Prefix, error) {
	var got []netip.Prefix
	err := s.locked(func() error {
		owners, err := s.scan()
		if err != nil {
			return err
		}
		for addr, o := range owners {
			if o == a.key() {
				return fmt.Errorf("allocate for %s/%s: %w (%s); DEL it first", a.ContainerID, a.IfName, ErrDuplicate, addr)
			}
		}
		for _, r := range ranges {
			addr, err := s.reserve(a, r, owners)
			if err != nil {
				s.release(a)
				return err
			}
			got = append(got, netip.PrefixFrom(addr, r.Subnet.Bits()))
		}
		return nil
	})
	return got, err
}

// reserve takes the first free address after the range's last reserved one.
func (s *Store) reserve(a Attachment, r Range, used map[netip.Addr]string) (netip.Addr, error) {
	first, last := hostBounds(r.Subnet)
	start := first
	if b, err := os.ReadFile(filepath.Join(s.dir, lastPrefix+r.ID)); err == nil {
		if prev, err := netip.ParseAddr(strings.TrimSpace(string(b))); err == nil && prev.Compare(first) >= 0 && prev.Compare(last) < 0 {
			start = prev.Next()
		}
	}
	addr := start
	for {
		if _, taken := used[addr]; !taken && addr != r.Gateway {
			ok, err := s.create(addr, a)
			if err != nil {
				return netip.Addr{}, err
			}
			if ok {
				os.WriteFile(filepath.Join(s.dir, lastPrefix+r.ID), []byte(addr.String()), 0o600)
				return addr, nil
			}
		}
		if addr == last {
			addr = first
		} else {
			addr = addr.Next()
		}
		if addr == start {
			return netip.Addr{}, fmt.Errorf("allocate in %s: %w (%d in use)", r.Subnet.Masked(), ErrExhausted, len(used))
		}
	}
}

func (s *Store) create(addr netip.Addr, a Attachment) (bool, error) {
	f, err := os.OpenFile(filepath.Join(s.dir, addr.String()), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("reserve %s: %w", addr, err)
	}
	_, err = f.WriteString(a.key())
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
		return false, fmt.Errorf("reserve %s: %w", addr, err)
	}
	return true, nil
}

// hostBounds returns the first and last assignable addresses of p: the
// network address and the last address (broadcast) are excluded.
func hostBounds(p netip.Prefix) (netip.Addr, netip.Addr) {
	p = p.Masked()
	b := p.Addr().AsSlice()
	host := p.Addr().BitLen() - p.Bits()
	for i := len(b) - 1; i >= 0 && host > 0; i-- {
		n := min(host, 8)
		b[i] |= byte(1<<n - 1)
		host -= n
	}
	end, _ := netip.AddrFromSlice(b)
	return p.Addr().Next(), end.Prev()
}

// Release frees every address of a; an unknown attachment is not an error.
func (s *Store) Release(a Attachment) ([]netip.Addr, error) {
	var freed []netip.Addr
	err := s.locked(func() error {
		var err error
		freed, err = s.release(a)
		return err
	})
	return freed, err
}

func (s *Store) release(a Attachment) ([]netip.Addr, error) {
	owners, err := s.scan()
	if err != nil {
		return nil, err
	}
	var freed []netip.Addr
	for addr, o := range owners {
		// Files from old host-local versions hold only the container ID.
		if o == a.key() || o == strings.TrimSpace(a.ContainerID) {
			if err := os.Remove(filepath.Join(s.dir, addr.String())); err != nil && !errors.Is(err, os.ErrNotExist) {
				return freed, fmt.Errorf("release %s: %w", addr, err)
			}
			freed = append(freed, addr)
		}
	}
	return freed, nil
}

// Lookup returns the addresses held by a.
func (s *Store) Lookup(a Attachment) ([]netip.Addr, error) {
	var addrs []netip.Addr
	err := s.locked(func() error {
		owners, err := s.scan()
		for addr, o := range owners {
			if o == a.key() {
				addrs = append(addrs, addr)
			}
		}
		return err
	})
	return addrs, err
}

// GC releases every reservation whose attachment is not in valid and
// returns the attachments it released.
func (s *Store) GC(valid []Attachment) ([]Attachment, error) {
	keep := make(map[string]bool, 2*len(valid))
	for _, a := range valid {
		keep[a.key()] = true
		keep[strings.TrimSpace(a.ContainerID)] = true
	}
	var gone []Attachment
	err := s.locked(func() error {
		owners, err := s.scan()
		if err != nil {
			return err
		}
		var errs []error
		for addr, o := range owners {
			if keep[o] {
				continue
			}
			if err := os.Remove(filepath.Join(s.dir, addr.String())); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, fmt.Errorf("release %s: %w", addr, err))
				continue
			}
			id, ifname, _ := strings.Cut(o, "\r\n")
			gone = append(gone, Attachment{ContainerID: id, IfName: ifname})
		}
		return errors.Join(errs...)
	})
	return gone, err
}

// scan maps every reserved address to the key stored in its file.
func (s *Store) scan() (map[netip.Addr]string, error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("scan address store: %w", err)
	}
	owners := make(map[netip.Addr]string, len(entries))
	for _, e := range entries {
		addr, err := netip.ParseAddr(e.Name())
		if err != nil || !e.Type().IsRegular() {
			continue // lock, last_reserved_ip.*, temporary files
		}
		b, err := os.ReadFile(filepath.Join(s.dir, e.Name()))
		if err != nil {
			continue // released meanwhile
		}
		owners[addr] = strings.TrimSpace(string(b))
	}
	return owners, nil
}
