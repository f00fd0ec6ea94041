package policy

import (
	"net/netip"
	"slices"
)

// Range is the addresses First..Last, both included, of one family.
type Range struct{ First, Last netip.Addr }

// prefixRange is the range a prefix covers.
func prefixRange(p netip.Prefix) Range {
	p = p.Masked()
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	last, _ := netip.AddrFromSlice(b)
	return Range{p.Addr(), last}
}

// allOf is every address of the family of a.
func allOf(a netip.Addr) Range {
	if a.Is4() {
		return prefixRange(netip.PrefixFrom(netip.IPv4Unspecified(), 0))
	}
	return prefixRange(netip.PrefixFrom(netip.IPv6Unspecified(), 0))
}

// subtract is r without every range of cut (of r's family).
func subtract(r Range, cut []Range) []Range {
	out := []Range{r}
	for _, c := range cut {
		var next []Range
		for _, o := range out {
			if c.Last.Less(o.First) || o.Last.Less(c.First) {
				next = append(next, o)
				continue
			}
			if o.First.Less(c.First) {
				next = append(next, Range{o.First, c.First.Prev()})
			}
			if c.Last.Less(o.Last) {
				next = append(next, Range{c.Last.Next(), o.Last})
			}
		}
		out = next
	}
	return out
}

// merge sorts rs (all of one family) and joins the ranges that overlap or
// touch, as an nftables interval set needs them.
func merge(rs []Range) []Range {
	rs = slices.Clone(rs)
	slices.SortFunc(rs, func(a, b Range) int { return a.First.Compare(b.First) })
	var out []Range
	for _, r := range rs {
		if n := len(out); n > 0 {
			o := &out[n-1]
			end := o.Last.Next() // invalid when o reaches the end of the family
			if !end.IsValid() {
				continue
			}
			if r.First.Compare(end) <= 0 {
				if o.Last.Less(r.Last) {
					o.Last = r.Last
				}
				continue
			}
		}
		out = append(out, r)
	}
	return out
}

// contains reports whether a lies in one of rs.
func contains(rs []Range, a netip.Addr) bool {
	for _, r := range rs {
		if r.First.BitLen() == a.BitLen() && r.First.Compare(a) <= 0 && a.Compare(r.Last) <= 0 {
			return true
		}
	}
	return false
}
