package plugin

import (
	"bytes"
	"fmt"
	"net"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// masqTable is the nftables table (one per family) that holds weft's pod
// masquerade rules in the node namespace.
const masqTable = "weft-cni"

// ensureMasq makes chain postrouting of table weft-cni hold exactly the
// rules for rs, one family at a time; it writes only when they differ (a
// changed node subnet replaces the old rule). Each batch is atomic.
func ensureMasq(rs []masqRule) error {
	if len(rs) == 0 {
		return nil
	}
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	for _, r := range rs {
		fam := nftables.TableFamilyIPv4
		if r.src.Addr().Is6() {
			fam = nftables.TableFamilyIPv6
		}
		t := &nftables.Table{Name: masqTable, Family: fam}
		ch := &nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT,
			Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource}
		tag := []byte(fmt.Sprintf("weft: masquerade %s leaving %s", r.src, r.cluster))
		if rules, err := c.GetRules(t, ch); err == nil && len(rules) == 1 && bytes.Equal(rules[0].UserData, tag) {
			continue
		}
		c.AddTable(t)
		c.AddChain(ch)
		c.FlushChain(ch)
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, UserData: tag, Exprs: masqExprs(r)})
		if err := c.Flush(); err != nil {
			return fmt.Errorf("program masquerade for %s: %w", r.src, err)
		}
	}
	return nil
}

// masqExprs: saddr in src, daddr not in cluster, daddr not multicast → masquerade.
func masqExprs(r masqRule) []expr.Any {
	off, size := uint32(12), uint32(4) // IPv4 saddr; daddr follows
	mcast := net.IPNet{IP: net.IPv4(224, 0, 0, 0).To4(), Mask: net.CIDRMask(4, 32)}
	if r.src.Addr().Is6() {
		off, size = 8, 16
		mcast = net.IPNet{IP: net.ParseIP("ff00::"), Mask: net.CIDRMask(8, 128)}
	}
	src, cluster := prefixNet(r.src), prefixNet(r.cluster)
	var e []expr.Any
	e = append(e, match(off, size, src, expr.CmpOpEq)...)
	e = append(e, match(off+size, size, cluster, expr.CmpOpNeq)...)
	e = append(e, match(off+size, size, mcast, expr.CmpOpNeq)...)
	return append(e, &expr.Masq{})
}

func match(off, size uint32, n net.IPNet, op expr.CmpOp) []expr.Any {
	ip := n.IP.To16()
	if size == 4 {
		ip = n.IP.To4()
	}
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: size},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: size, Mask: []byte(n.Mask), Xor: make([]byte, size)},
		&expr.Cmp{Op: op, Register: 1, Data: []byte(ip.Mask(n.Mask))},
	}
}
