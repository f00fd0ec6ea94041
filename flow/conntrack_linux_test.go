package flow

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/mdlayher/netlink"
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

// TestEventSocketParse: a datagram's netlink messages are taken whole, in
// order; a datagram with a bad message adds none of its messages.
func TestEventSocketParse(t *testing.T) {
	msg := func(typ uint16, data string) []byte {
		h := netlink.Header{Length: uint32(16+len(data)+3) &^ 3, Type: netlink.HeaderType(typ)}
		b, err := (netlink.Message{Header: h, Data: []byte(data)}).MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		binary.NativeEndian.PutUint32(b, uint32(16+len(data))) // the length before padding, as the kernel writes it
		return b
	}
	s := &eventSocket{}
	if err := s.parse(append(msg(1, "abcde"), msg(2, "xy")...)); err != nil {
		t.Fatal(err)
	}
	if len(s.msgs) != 2 || s.msgs[0].Header.Type != 1 || string(s.msgs[0].Data) != "abcde" || string(s.msgs[1].Data) != "xy" {
		t.Fatalf("got %+v", s.msgs)
	}
	for name, b := range map[string][]byte{
		"trailing bytes":  append(msg(3, "ok"), 1, 2, 3),
		"a length of 8":   append(msg(3, "ok"), 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
		"a length beyond": append(msg(3, "ok"), msg(4, "toolong")[:20]...),
	} {
		if err := s.parse(b); err == nil || len(s.msgs) != 2 {
			t.Errorf("%s: err %v, %d messages", name, err, len(s.msgs))
		}
	}
}
