package flow

import (
	"net/netip"
	"reflect"
	"runtime"
	"testing"
	"time"
	"unsafe"
)

// full is a flow with every field set but Node (which the ring never
// holds: Handler sets it on the way out).
func full() Flow {
	return Flow{Seq: 7, Time: time.Now(), Event: EventClose, Verdict: Dropped, Proto: "sctp",
		Src: netip.MustParseAddr("10.244.1.2"), Dst: netip.MustParseAddr("fd00::1:2"), SrcPort: 40000, DstPort: 5432,
		Direction: DirEgress, Policies: []string{"a/b", "c/d"}, MorePolicies: 3,
		Masqueraded: true, MasqueradedAs: netip.MustParseAddr("192.0.2.1"), Service: netip.MustParseAddrPort("[fd00:96::10]:443"),
		Counts: &Counts{OrigBytes: 1, OrigPackets: 2, ReplyBytes: 3, ReplyPackets: 4}}
}

// TestSlotPacks: a flow with every field set comes back the same from its
// slot, packed (not kept whole); so do the zero flow and one of each
// address family, protocol number and name.
func TestSlotPacks(t *testing.T) {
	f := full()
	v := reflect.ValueOf(f)
	for i := range v.NumField() {
		if name := v.Type().Field(i).Name; name != "Node" && v.Field(i).IsZero() {
			t.Fatalf("full() leaves Flow.%s unset: a new field must be packed by slot and set here", name)
		}
	}
	flows := []Flow{f, {}, {Src: netip.MustParseAddr("::ffff:10.0.0.1"), Proto: "tcp"}, {Proto: "253", Service: netip.MustParseAddrPort("10.96.0.1:53")}}
	for _, p := range knownProtos {
		flows = append(flows, Flow{Proto: ProtoName(p), Event: EventNew, Verdict: Allowed, Direction: DirIngress})
	}
	for _, f := range flows {
		s := pack(f)
		if s.whole != nil {
			t.Errorf("%+v: kept whole, not packed", f)
		}
		if got := s.unpack(); !same(got, f) {
			t.Errorf("packed %+v\nunpacked %+v", f, got)
		}
	}
	if size, flow := unsafe.Sizeof(slot{}), unsafe.Sizeof(Flow{}); size > 144 || size*2 > flow+32 {
		t.Errorf("a slot takes %d bytes, a Flow %d (and its Counts 32): not the half the ring's memory is said to save", size, flow)
	}
}

// TestSlotKeepsWhole: a flow the codes cannot hold exactly is kept whole
// and comes back the same.
func TestSlotKeepsWhole(t *testing.T) {
	for _, change := range []func(*Flow){
		func(f *Flow) { f.Node = "n1" },
		func(f *Flow) { f.Proto = "6" }, // ProtoName(6) is "tcp"
		func(f *Flow) { f.Event = "reset" },
		func(f *Flow) { f.Verdict = "audit" },
		func(f *Flow) { f.Direction = "both" },
		func(f *Flow) { f.Src = netip.MustParseAddr("fe80::1%eth0") },
		func(f *Flow) { f.Time = time.Date(2026, 12, 7, 5, 0, 0, 0, time.FixedZone("X", 3600)) },
		func(f *Flow) { f.MorePolicies = 1 << 40 },
	} {
		f := full()
		change(&f)
		s := pack(f)
		if s.whole == nil {
			t.Errorf("%+v: packed, though it does not unpack the same", f)
		}
		if got := s.unpack(); !same(got, f) {
			t.Errorf("kept %+v\nunpacked %+v", f, got)
		}
	}
}

// BenchmarkRingHeld reports the live heap a full ring of 4,096 closed
// connections holds (each with its counts, as conntrack's destroy events
// bring them), against the same flows held as a slice of Flow, measured
// in the same run: "ring-MB" and "flows-MB" after a collection.
func BenchmarkRingHeld(b *testing.B) {
	const size = 4096
	flows := func() []Flow {
		out := make([]Flow, size)
		for i := range out {
			out[i] = Flow{Time: time.Now(), Event: EventClose, Verdict: Allowed, Proto: "tcp",
				Src: netip.AddrFrom4([4]byte{10, 244, 1, byte(i)}), Dst: netip.AddrFrom4([4]byte{10, 244, 2, byte(i >> 8)}),
				SrcPort: uint16(30000 + i), DstPort: 80, Counts: &Counts{OrigBytes: 600, OrigPackets: 6, ReplyBytes: 900, ReplyPackets: 5}}
		}
		return out
	}
	held := func(build func() any) float64 {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		v := build()
		runtime.GC()
		runtime.ReadMemStats(&after)
		runtime.KeepAlive(v)
		return float64(after.HeapAlloc-before.HeapAlloc) / 1e6
	}
	var ring, slice float64
	for b.Loop() {
		ring = held(func() any {
			r := NewRing(size, size, size)
			for _, f := range flows() {
				r.Add(f)
			}
			return r
		})
		slice = held(func() any { return flows() })
	}
	b.ReportMetric(ring, "ring-MB")
	b.ReportMetric(slice, "flows-MB")
}
