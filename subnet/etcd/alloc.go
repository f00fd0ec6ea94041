package etcd

import (
	"fmt"
	"math/rand/v2"
	"net/netip"

	"github.com/weft-net/weft/subnet"
)

// pickAmong is how many free subnets, counted from SubnetMin, a new lease is
// picked from at random (as Flannel does): nodes acquiring at the same time
// rarely race for the same one, and the low end of the range fills first.
const pickAmong = 100

// pick chooses the subnets of a new lease: for each family the hint of that
// family if it fits and is free, else a random one among the first free
// ones.
func pick(cfg *subnet.Config, entries []entry, hints ...netip.Prefix) (v4, v6 netip.Prefix, err error) {
	if cfg.EnableIPv4 {
		t := newTaken(cfg.Network, cfg.SubnetLen, entries, false)
		if v4, err = pickFamily(cfg, false, t, hints); err != nil {
			return netip.Prefix{}, netip.Prefix{}, err
		}
	}
	if cfg.EnableIPv6 {
		t := newTaken(cfg.IPv6Network, cfg.IPv6SubnetLen, entries, true)
		if v6, err = pickFamily(cfg, true, t, hints); err != nil {
			return netip.Prefix{}, netip.Prefix{}, err
		}
	}
	return v4, v6, nil
}

func pickFamily(cfg *subnet.Config, v6 bool, t *taken, hints []netip.Prefix) (netip.Prefix, error) {
	for _, hint := range hints {
		if !hint.IsValid() || hint.Addr().Is6() != v6 || !cfg.Fits(hint) {
			continue
		}
		if _, busy := t.overlap(hint); !busy {
			return hint, nil
		}
	}
	l, lo, hi := cfg.SubnetLen, cfg.SubnetMin, cfg.SubnetMax
	if v6 {
		l, lo, hi = cfg.IPv6SubnetLen, cfg.IPv6SubnetMin, cfg.IPv6SubnetMax
	}
	var free []netip.Prefix
	for c := cfg.SubnetAt(v6, 0); c.IsValid() && c.Addr().Compare(hi) <= 0 && len(free) < pickAmong; {
		o, busy := t.overlap(c)
		switch {
		case !busy:
			free = append(free, c)
			c = after(c, l)
		case o.Bits() < l: // an old, wider lease: skip all of it
			c = after(o, l)
		default:
			c = after(c, l)
		}
	}
	if len(free) == 0 {
		return netip.Prefix{}, fmt.Errorf("%w: all %d subnets from %s to %s are taken",
			subnet.ErrExhausted, cfg.SubnetCount(v6), netip.PrefixFrom(lo, l), netip.PrefixFrom(hi, l))
	}
	return free[rand.IntN(len(free))], nil
}

// taken is the set of subnets of one family held by existing keys,
// including keys whose value does not parse (the key exists, so its subnet
// cannot be created). Keys whose subnet is not inside the Network, or is the
// whole Network or wider (a foreign or hostile key such as "0.0.0.0-1"),
// claim nothing: they never make free subnets look taken.
type taken struct {
	exact map[netip.Prefix]bool // keys of the configured subnet length
	other []netip.Prefix        // keys of another length (an older config)
}

func newTaken(network netip.Prefix, l int, entries []entry, v6 bool) *taken {
	t := &taken{exact: make(map[netip.Prefix]bool, len(entries))}
	for _, e := range entries {
		p := e.lease.Subnet
		if v6 {
			p = e.lease.IPv6Subnet
		}
		switch {
		case !p.IsValid(), p.Bits() <= network.Bits(), !network.Contains(p.Addr()):
		case p.Bits() == l:
			t.exact[p] = true
		default:
			t.other = append(t.other, p)
		}
	}
	return t
}

// overlap returns a taken subnet overlapping c.
func (t *taken) overlap(c netip.Prefix) (netip.Prefix, bool) {
	if t.exact[c] {
		return c, true
	}
	for _, o := range t.other {
		if o.Overlaps(c) {
			return o, true
		}
	}
	return netip.Prefix{}, false
}

// after returns the subnet of length l that follows p, or an invalid prefix
// at the end of the address space.
func after(p netip.Prefix, l int) netip.Prefix {
	next := lastAddr(p).Next()
	if !next.IsValid() {
		return netip.Prefix{}
	}
	return netip.PrefixFrom(next, l)
}

// lastAddr returns the last address of p.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := range b {
		switch lo := i * 8; {
		case lo+8 <= p.Bits():
		case lo >= p.Bits():
			b[i] = 0xff
		default:
			b[i] |= 0xff >> (p.Bits() - lo)
		}
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}
