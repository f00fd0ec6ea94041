package policy

import (
	"cmp"
	"net/netip"
	"slices"
)

// Range is the IPv4 addresses First..Last, both included.
type Range struct{ First, Last netip.Addr }

// prefixRange is the range a prefix covers.
func prefixRange(p netip.Prefix) Range {
	p = p.Masked()
	a := p.Addr().As4()
	host := uint32(1)<<(32-p.Bits()) - 1
	if p.Bits() == 0 {
		host = ^uint32(0)
	}
	v := be32(a) | host
	return Range{p.Addr(), netip.AddrFrom4(put32(v))}
}

func be32(a [4]byte) uint32 {
	return uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
}
func put32(v uint32) [4]byte {
	return [4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}
}

func u32(a netip.Addr) uint32  { return be32(a.As4()) }
func addr(v uint32) netip.Addr { return netip.AddrFrom4(put32(v)) }

// subtract is r without every range of cut.
func subtract(r Range, cut []Range) []Range {
	out := []Range{r}
	for _, c := range cut {
		var next []Range
		for _, o := range out {
			lo, hi, clo, chi := u32(o.First), u32(o.Last), u32(c.First), u32(c.Last)
			if chi < lo || clo > hi {
				next = append(next, o)
				continue
			}
			if clo > lo {
				next = append(next, Range{o.First, addr(clo - 1)})
			}
			if chi < hi {
				next = append(next, Range{addr(chi + 1), o.Last})
			}
		}
		out = next
	}
	return out
}

// merge sorts rs and joins the ranges that overlap or touch, as an
// nftables interval set needs them.
func merge(rs []Range) []Range {
	rs = slices.Clone(rs)
	slices.SortFunc(rs, func(a, b Range) int { return cmp.Compare(u32(a.First), u32(b.First)) })
	var out []Range
	for _, r := range rs {
		if n := len(out); n > 0 && u32(out[n-1].Last) != ^uint32(0) && u32(r.First) <= u32(out[n-1].Last)+1 {
			if u32(r.Last) > u32(out[n-1].Last) {
				out[n-1].Last = r.Last
			}
			continue
		}
		if n := len(out); n > 0 && u32(out[n-1].Last) == ^uint32(0) {
			continue // the previous range reaches the end
		}
		out = append(out, r)
	}
	return out
}

// contains reports whether a lies in one of rs.
func contains(rs []Range, a netip.Addr) bool {
	v := u32(a)
	for _, r := range rs {
		if u32(r.First) <= v && v <= u32(r.Last) {
			return true
		}
	}
	return false
}
