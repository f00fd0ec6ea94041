package flow

import (
	"net/netip"
	"testing"

	"github.com/ti-mo/conntrack"
)

// TestConntrackFlowOf: a pod connection's events become flows, with the
// address the kernel masqueraded it to, the Service address it was sent
// to and the counts of a closed one; others are left out.
func TestConntrackFlowOf(t *testing.T) {
	ip := netip.MustParseAddr
	tuple := func(src, dst string, sport, dport uint16) conntrack.Tuple {
		return conntrack.Tuple{IP: conntrack.IPTuple{SourceAddress: ip(src), DestinationAddress: ip(dst)},
			Proto: conntrack.ProtoTuple{Protocol: 6, SourcePort: sport, DestinationPort: dport}}
	}
	c := &Conntrack{Pods: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}, Accounting: true}
	masq := conntrack.Event{Type: conntrack.EventNew, Flow: &conntrack.Flow{Status: conntrack.StatusSrcNAT | conntrack.StatusConfirmed,
		TupleOrig: tuple("10.244.1.2", "1.1.1.1", 40000, 443), TupleReply: tuple("1.1.1.1", "192.168.1.10", 443, 40000)}}
	f, ok := c.flowOf(masq)
	if !ok || f.Event != EventNew || !f.Masqueraded || f.MasqueradedAs != ip("192.168.1.10") || f.Dst != ip("1.1.1.1") || f.Service.IsValid() {
		t.Errorf("masqueraded: %+v %v", f, ok)
	}
	svc := conntrack.Event{Type: conntrack.EventDestroy, Flow: &conntrack.Flow{Status: conntrack.StatusDstNAT,
		TupleOrig: tuple("10.244.1.2", "10.96.0.10", 40001, 53), TupleReply: tuple("10.244.2.7", "10.244.1.2", 5353, 40001),
		CountersOrig: conntrack.Counter{Packets: 2, Bytes: 120}, CountersReply: conntrack.Counter{Packets: 1, Bytes: 200, Direction: true}}}
	f, ok = c.flowOf(svc)
	if !ok || f.Event != EventClose || f.Service != netip.MustParseAddrPort("10.96.0.10:53") || f.Dst != ip("10.244.2.7") || f.DstPort != 5353 ||
		f.Masqueraded || f.Counts == nil || *f.Counts != (Counts{120, 2, 200, 1}) {
		t.Errorf("to a Service: %+v %+v %v", f, f.Counts, ok)
	}
	host := conntrack.Event{Type: conntrack.EventNew, Flow: &conntrack.Flow{TupleOrig: tuple("192.168.1.10", "192.168.1.11", 1, 22)}}
	if _, ok := c.flowOf(host); ok {
		t.Error("a host connection became a flow")
	}
}
