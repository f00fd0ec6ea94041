package flow

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestLogPrefixRoundTrip(t *testing.T) {
	long := make([]string, 12)
	for i := range long {
		long[i] = fmt.Sprintf("namespace-%d/policy-with-a-long-name", i)
	}
	for _, tc := range []struct {
		name     string
		dir      string
		policies []string
		want     string
		keep     int
	}{
		{"one", DirIngress, []string{"shop/db"}, "weft drop ingress shop/db", 1},
		{"two", DirEgress, []string{"a/x", "b/y"}, "weft drop egress a/x b/y", 2},
		{"too many", DirIngress, long, "", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := LogPrefix(tc.dir, tc.policies)
			if len(p) > MaxPrefix {
				t.Fatalf("prefix of %d bytes: %q", len(p), p)
			}
			if tc.want != "" && p != tc.want {
				t.Errorf("prefix %q, want %q", p, tc.want)
			}
			dir, pols, more, ok := ParseLogPrefix(p)
			if !ok || dir != tc.dir || !slices.Equal(pols, tc.policies[:tc.keep]) || more != len(tc.policies)-tc.keep {
				t.Errorf("parse %q: %q %q +%d %v", p, dir, pols, more, ok)
			}
		})
	}
	for _, bad := range []string{"", "weft drop", "weft drop sideways a/b", "other prefix", "weft drop ingress a/b +x"} {
		if _, _, _, ok := ParseLogPrefix(bad); ok {
			t.Errorf("ParseLogPrefix(%q) ok", bad)
		}
	}
}

// TestRingBounds: the ring keeps its last slots flows, turns away what
// exceeds its rate (counted in Suppressed) and takes more as time passes.
func TestRingBounds(t *testing.T) {
	now := time.Unix(1000, 0)
	r := NewRing(4, 10, 5)
	r.now = func() time.Time { return now }
	kept := 0
	for i := range 20 {
		if r.Add(Flow{DstPort: uint16(i)}) {
			kept++
		}
	}
	if st := r.Stats(); kept != 5 || st.Suppressed != 15 || st.Last != 5 {
		t.Fatalf("burst of 20: kept %d, stats %+v", kept, st)
	}
	fs, next := r.Since(0, nil, 0)
	if len(fs) != 4 || fs[0].Seq != 2 || next != 5 {
		t.Errorf("since 0: %d flows from %d, next %d", len(fs), fs[0].Seq, next)
	}
	now = now.Add(time.Second / 2) // 5 more tokens
	for range 6 {
		r.Add(Flow{DstPort: 443})
	}
	if st := r.Stats(); st.Last != 10 || st.Suppressed != 16 {
		t.Errorf("after half a second: %+v", st)
	}
	fs, _ = r.Since(8, Filter{Port: 443}.Match, 1)
	if len(fs) != 1 || fs[0].Seq != 10 {
		t.Errorf("since 8, limit 1: %+v", fs)
	}
}

func TestFilter(t *testing.T) {
	f := Flow{Verdict: Dropped, Src: netip.MustParseAddr("10.0.0.2"), Dst: netip.MustParseAddr("10.0.1.2"),
		SrcPort: 40000, DstPort: 80, Direction: DirIngress, Policies: []string{"shop/db", "ops/deny-all"}}
	for _, tc := range []struct {
		filter Filter
		want   bool
	}{
		{Filter{}, true},
		{Filter{Verdict: Allowed}, false},
		{Filter{Verdict: Dropped, Port: 80}, true},
		{Filter{Port: 81}, false},
		{Filter{Policy: "shop/db"}, true},
		{Filter{Policy: "db"}, true},
		{Filter{Policy: "other/db"}, false},
		{Filter{Namespace: "ops"}, true},
		{Filter{Namespace: "op"}, false},
		{Filter{Addrs: []netip.Addr{netip.MustParseAddr("10.0.1.2")}}, true},
		{Filter{Addrs: []netip.Addr{netip.MustParseAddr("10.0.1.3")}}, false},
	} {
		if got := tc.filter.Match(f); got != tc.want {
			t.Errorf("%+v: %v", tc.filter, got)
		}
	}
	if r := f.Reason(); !strings.Contains(r, "destination pod selected by shop/db, ops/deny-all") {
		t.Errorf("reason %q", r)
	}
}

func TestFromPacket(t *testing.T) {
	v4 := []byte{0x45, 0, 0, 40, 0, 0, 0x40, 0, 64, 6, 0, 0, 10, 0, 0, 2, 10, 0, 1, 2, 0x9c, 0x40, 0, 80}
	var f Flow
	if !fromPacket(&f, v4) || f.Src.String() != "10.0.0.2" || f.Dst.String() != "10.0.1.2" || f.Proto != "tcp" || f.SrcPort != 40000 || f.DstPort != 80 {
		t.Errorf("IPv4 TCP: %+v", f)
	}
	v6 := make([]byte, 48)
	v6[0], v6[6] = 0x60, 17
	copy(v6[8:], netip.MustParseAddr("fd00::2").AsSlice())
	copy(v6[24:], netip.MustParseAddr("fd00:1::2").AsSlice())
	v6[42], v6[43] = 0, 53
	f = Flow{}
	if !fromPacket(&f, v6) || f.Src.String() != "fd00::2" || f.Dst.String() != "fd00:1::2" || f.Proto != "udp" || f.DstPort != 53 {
		t.Errorf("IPv6 UDP: %+v", f)
	}
	for _, bad := range [][]byte{nil, {0x45, 0}, {0x15, 0, 0, 0}} {
		if fromPacket(&Flow{}, bad) {
			t.Errorf("parsed %x", bad)
		}
	}
}

// BenchmarkRingFlood adds drop flows as fast as one core can, as a flood
// of logged drops would if nothing in front of the ring limited it: the
// ring keeps at most its rate (the rest cost one locked token check each,
// and no allocation: allocs/op), so its memory stays its slots. It reports
// the flows kept per second and the share turned away.
func BenchmarkRingFlood(b *testing.B) {
	r := NewRing(4096, 1000, 1000)
	f := Flow{Event: EventDrop, Verdict: Dropped, Proto: "udp", Src: netip.MustParseAddr("10.0.0.2"), Dst: netip.MustParseAddr("10.0.1.2"),
		DstPort: 9, Direction: DirIngress, Policies: []string{"x/iso"}}
	start := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		r.Add(f)
	}
	st := r.Stats()
	b.ReportMetric(float64(st.Last)/time.Since(start).Seconds(), "kept/s")
	b.ReportMetric(float64(st.Suppressed)/float64(b.N), "suppressed/op")
}
