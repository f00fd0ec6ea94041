package flow

import (
	"math"
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

// roundTrip packs f and checks that it comes back identical (but for the
// time's monotonic reading, which the ring does not keep), and whether it
// was packed rather than kept whole.
func roundTrip(t *testing.T, f Flow, packed bool) {
	t.Helper()
	protos := newProtocols()
	s := pack(f, protos)
	if (s.whole == nil) != packed {
		t.Errorf("%+v: packed %v, want %v", f, s.whole == nil, packed)
	}
	want, got := f, s.unpack(protos)
	want.Time, got.Time = want.Time.Round(0), got.Time.Round(0)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("added %+v\ngot   %+v", want, got)
	}
}

// TestSlotPacks: a flow with every field set comes back the same from its
// slot, packed (not kept whole); so do the zero flow and flows of each
// address family, protocol, event, verdict and direction.
func TestSlotPacks(t *testing.T) {
	f := full()
	v := reflect.ValueOf(f)
	for i := range v.NumField() {
		if name := v.Type().Field(i).Name; name != "Node" && v.Field(i).IsZero() {
			t.Fatalf("full() leaves Flow.%s unset: a new field must be packed by slot and set here", name)
		}
	}
	roundTrip(t, f, true)
	roundTrip(t, Flow{}, true)
	roundTrip(t, Flow{Src: netip.MustParseAddr("::ffff:10.0.0.1"), Dst: netip.MustParseAddr("fd00::2"), Proto: "tcp", Time: time.Unix(0, 1)}, true)
	roundTrip(t, Flow{Service: netip.MustParseAddrPort("10.96.0.1:53"), Policies: []string{}}, true)
	roundTrip(t, Flow{Service: netip.AddrPortFrom(netip.Addr{}, 53)}, true)
	for p := range 256 {
		roundTrip(t, Flow{Proto: ProtoName(uint8(p))}, true)
	}
	for _, e := range eventNames {
		for _, v := range verdictNames {
			for _, d := range dirNames {
				roundTrip(t, Flow{Event: e, Verdict: v, Direction: d}, true)
			}
		}
	}
	if size, flow := unsafe.Sizeof(slot{}), unsafe.Sizeof(Flow{}); size > 144 || size*2 > flow+32 {
		t.Errorf("a slot takes %d bytes, a Flow %d (and its Counts 32): not the half the ring's memory is said to save", size, flow)
	}
}

// TestSlotKeepsWhole: a flow the slot cannot hold exactly is kept whole
// and comes back the same.
func TestSlotKeepsWhole(t *testing.T) {
	for _, change := range []func(*Flow){
		func(f *Flow) { f.Node = "n1" },
		func(f *Flow) { f.Proto = "6" }, // ProtoName(6) is "tcp"
		func(f *Flow) { f.Proto = "006" },
		func(f *Flow) { f.Event = "reset" },
		func(f *Flow) { f.Verdict = "audit" },
		func(f *Flow) { f.Direction = "both" },
		func(f *Flow) { f.Src = netip.MustParseAddr("fe80::1%eth0") },
		func(f *Flow) { f.Time = time.Date(2026, 12, 7, 5, 0, 0, 0, time.FixedZone("X", 3600)) },
		func(f *Flow) { f.Time = f.Time.UTC() },
		func(f *Flow) { f.Time = time.Date(1600, 1, 1, 0, 0, 0, 0, time.Local) },
		func(f *Flow) { f.Time = time.Date(3000, 1, 1, 0, 0, 0, 0, time.Local) },
		func(f *Flow) { f.Time = time.Unix(0, math.MinInt64) },
		func(f *Flow) { f.Time = time.Time{}.In(time.Local) },
		func(f *Flow) { f.MorePolicies = 1 << 40 },
	} {
		f := full()
		change(&f)
		if time.Local == time.UTC && f.Time.Location() == time.UTC && !f.Time.IsZero() {
			continue // the same as Local here
		}
		roundTrip(t, f, false)
	}
}

// TestSameComparesEveryField: same tells apart two flows that differ in
// any one field, so that pack keeps whole what its slot would lose.
func TestSameComparesEveryField(t *testing.T) {
	a := full()
	v := reflect.ValueOf(&a).Elem()
	for i := range v.NumField() {
		b := full()
		b.Time = a.Time
		w := reflect.ValueOf(&b).Elem().Field(i)
		switch w.Kind() {
		case reflect.String:
			w.SetString(w.String() + "x")
		case reflect.Uint16, reflect.Uint64:
			w.SetUint(w.Uint() + 1)
		case reflect.Int:
			w.SetInt(w.Int() + 1)
		case reflect.Bool:
			w.SetBool(!w.Bool())
		case reflect.Slice:
			w.Set(reflect.ValueOf([]string{"other/policy"}))
		case reflect.Pointer:
			w.Set(reflect.ValueOf(&Counts{OrigBytes: 1}))
		default:
			switch x := w.Addr().Interface().(type) {
			case *time.Time:
				*x = x.Add(time.Nanosecond)
			case *netip.Addr:
				*x = x.Next()
			case *netip.AddrPort:
				*x = netip.AddrPortFrom(x.Addr().Next(), x.Port())
			default:
				t.Fatalf("Flow.%s is of a type this test cannot change: teach it, and same", v.Type().Field(i).Name)
			}
		}
		if same(a, b) {
			t.Errorf("same does not compare Flow.%s", v.Type().Field(i).Name)
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

// TestSlotAllocatesNothing: packing a flow and unpacking it allocate
// nothing, whatever its protocol's name.
func TestSlotAllocatesNothing(t *testing.T) {
	protos := newProtocols()
	for _, p := range []uint8{6, 112, 136, 255} {
		f := full()
		f.Proto = ProtoName(p)
		if n := testing.AllocsPerRun(100, func() { s := pack(f, protos); _ = s.unpack(protos) }); n != 0 {
			t.Errorf("protocol %d: %.0f allocations a flow", p, n)
		}
	}
}
