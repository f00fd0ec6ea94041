package vxlan

import (
	"fmt"
	"maps"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/weft-net/weft/backend/kernel"
	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/vtep"
)

// batchTable is n peers 10.<i/256>.<i%256>.0/24 behind 192.168.<...> with
// MACs that depend on salt, so two tables differ in every MAC.
func batchTable(from, n int, salt byte) vtep.Table {
	t := vtep.Table{}
	for i := from; i < from+n; i++ {
		sn := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(1 + i/256), byte(i), 0}), 24)
		t[sn] = vtep.Peer{MAC: subnet.MAC{0x0a, salt, 0, 0, byte(i >> 8), byte(i)},
			Addr: netip.AddrFrom4([4]byte{100, 64, byte(i >> 8), byte(i)})}
	}
	return t
}

// batchSide is one namespace with a VXLAN device and the overlay on it,
// batched or not.
type batchSide struct {
	ns  *nettest.NS
	o   *kernel.Overlay
	fdb fdb
}

func newBatchSide(t *testing.T, name string, batched bool) *batchSide {
	return newBatchSideTB(t, name, batched)
}

func newBatchSideTB(t testing.TB, name string, batched bool) *batchSide {
	return newBatchSideIn(t, nettest.NewNS(t, name), batched)
}

// newBatchSideIn makes the side in ns, which the caller deletes.
func newBatchSideIn(t testing.TB, ns *nettest.NS, batched bool) *batchSide {
	nettest.MustRun(t, ns, "ip", "link", "add", "vx0", "address", "0a:00:00:00:00:01", "type", "vxlan", "id", "1", "dstport", "8472", "nolearning")
	nettest.MustRun(t, ns, "ip", "link", "set", "vx0", "up")
	l, err := ns.Handle.LinkByName("vx0")
	if err != nil {
		t.Fatal(err)
	}
	idx := l.Attrs().Index
	s := &batchSide{ns: ns, fdb: fdb{h: ns.Handle, link: idx}}
	opts := kernel.OverlayOptions{Family: netlink.FAMILY_V4}
	if batched {
		p := kernel.NewLazyBatchWriter(ns.Handle, ns.Path, idx)
		if p.Get() == nil {
			t.Fatalf("batch: %v", p.Err())
		}
		s.fdb.batch, opts.Batch = p, p
	}
	opts.Step = s.fdb
	s.o = kernel.NewOverlay(ns.Handle, idx, opts)
	return s
}

// dump is the kernel state of the side: routes, neighbours and FDB in
// detail, lines sorted (the neighbour hash order is random per namespace).
func (s *batchSide) dump(t *testing.T) string {
	var out []string
	for _, argv := range [][]string{
		{"ip", "-d", "-4", "route", "show", "table", "all"},
		{"ip", "-d", "-6", "route", "show", "table", "all"},
		{"ip", "-d", "neigh", "show", "dev", "vx0"},
		{"bridge", "-d", "fdb", "show", "dev", "vx0"},
	} {
		lines := strings.Split(strings.TrimSpace(nettest.MustRun(t, s.ns, argv...)), "\n")
		for i, l := range lines {
			lines[i] = strings.TrimRight(l, " ") // ip prints a trailing space on some lines
		}
		// The kernel's local route of the device's IPv6 link-local address
		// comes when duplicate address detection ends, in each namespace on
		// its own time: not part of what was programmed.
		lines = slices.DeleteFunc(lines, func(l string) bool { return strings.HasPrefix(l, "local fe80:") })
		slices.Sort(lines)
		out = append(out, strings.Join(argv, " "), strings.Join(lines, "\n"))
	}
	return strings.Join(out, "\n")
}

// TestBatchedMatchesPerRequest programs the same tables into two
// namespaces, one request at a time in one and batched in the other, and
// compares the kernel state after every step: a first sync of 600 peers,
// a sync that removes half, moves and re-keys others and adds new ones,
// Apply of a difference, and removal of everything.
func TestBatchedMatchesPerRequest(t *testing.T) {
	plain, batched := newBatchSide(t, "bplain", false), newBatchSide(t, "bbatched", true)
	t1 := batchTable(0, 600, 1)
	t2 := batchTable(300, 200, 2) // 300..499 changed MAC, 0..299 and 500..599 removed
	for sn, v := range batchTable(600, 100, 1) {
		t2[sn] = v // and 100 new
	}
	t3 := batchTable(350, 300, 3)
	steps := []struct {
		name string
		do   func(o *kernel.Overlay) (kernel.SyncStats, error)
	}{
		{"sync 600", func(o *kernel.Overlay) (kernel.SyncStats, error) { return o.Sync(t1) }},
		{"sync change", func(o *kernel.Overlay) (kernel.SyncStats, error) { return o.Sync(t2) }},
		{"apply", func(o *kernel.Overlay) (kernel.SyncStats, error) { return o.Apply(t2, t3) }},
		{"sync after apply", func(o *kernel.Overlay) (kernel.SyncStats, error) { return o.Sync(t3) }},
		{"remove all", func(o *kernel.Overlay) (kernel.SyncStats, error) { return o.Sync(vtep.Table{}) }},
	}
	for i, st := range steps {
		a, errA := st.do(plain.o)
		b, errB := st.do(batched.o)
		if errA != nil || errB != nil {
			t.Fatalf("%s: per request: %v, batched: %v", st.name, errA, errB)
		}
		if a != b {
			t.Errorf("%s: stats per request %+v, batched %+v", st.name, a, b)
		}
		if st.name == "sync after apply" && b.Changed() {
			t.Errorf("a sync after the batched apply still changed %+v", b)
		}
		da, db := plain.dump(t), batched.dump(t)
		if da != db {
			t.Fatalf("%s: kernel state differs\nper request:\n%s\nbatched:\n%s", st.name, da, db)
		}
		routes := strings.Count(da, "proto 87")
		if want := []int{600, 300, 300, 300, 0}[i]; routes != want {
			t.Errorf("%s: %d weft routes, want %d", st.name, routes, want)
		}
	}
}

// BenchmarkSync5000 programs 5,000 peers into an empty device and removes
// them again, one request at a time and batched:
//
//	go test -run '^$' -bench Sync5000 ./backend/vxlan
func BenchmarkSync5000(b *testing.B) {
	for _, batched := range []bool{false, true} {
		name := map[bool]string{false: "per-request", true: "batched"}[batched]
		b.Run(name, func(b *testing.B) {
			s := newBatchSideTB(b, "pbench", batched)
			table := batchTable(0, 5000, 1)
			for b.Loop() {
				if _, err := s.o.Sync(table); err != nil {
					b.Fatal(err)
				}
				if _, err := s.o.Sync(vtep.Table{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestBatchReportsEachFailure writes a batch in which three requests fail (a
// neighbour on a link that does not exist): the first of all, the last of a
// window (the one whose acknowledgement ends it) and one in the middle. The
// others are written and counted, and the error names the first failure.
func TestBatchReportsEachFailure(t *testing.T) {
	s := newBatchSide(t, "pfail", true)
	l, err := s.ns.Handle.LinkByName("vx0")
	if err != nil {
		t.Fatal(err)
	}
	p := kernel.NewLazyBatchWriter(s.ns.Handle, s.ns.Path, l.Attrs().Index).Get()
	if p == nil {
		t.Fatal("no batch")
	}
	// The LazyBatchWriter is garbage now; the BatchWriter in hand must stay open.
	runtime.GC()
	runtime.GC()
	var reqs []*nl.NetlinkRequest
	for i := range 300 {
		n := &netlink.Neigh{LinkIndex: l.Attrs().Index, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
			IP: netip.AddrFrom4([4]byte{10, 9, byte(i >> 8), byte(i)}).AsSlice(), HardwareAddr: subnet.MAC{0x0a, 9, 0, 0, byte(i >> 8), byte(i)}.HardwareAddr()}
		if i == 0 || i == 127 || i == 200 {
			n.LinkIndex = 9999
		}
		reqs = append(reqs, kernel.NeighRequest(n, true))
	}
	done := 0
	err = kernel.WriteBatch(p, reqs, 0, &done, func(i int) string { return fmt.Sprintf("neighbour %d", i) })
	if err == nil || !strings.HasPrefix(err.Error(), "neighbour 0: ") {
		t.Errorf("error %v, want one naming neighbour 0", err)
	}
	if done != 297 {
		t.Errorf("%d written, want 297", done)
	}
	if got := strings.Count(nettest.MustRun(t, s.ns, "ip", "neigh", "show", "dev", "vx0"), "PERMANENT"); got != 297 {
		t.Errorf("%d neighbours in the kernel, want 297", got)
	}
	// The failures themselves, not just the first: each in its place.
	res, err := p.Write(reqs)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range res {
		if fail := i == 0 || i == 127 || i == 200; fail != (e != nil) {
			t.Errorf("request %d: %v", i, e)
		}
	}
	// Deleting what is gone is no error when the caller says so.
	done = 0
	del := []*nl.NetlinkRequest{kernel.NeighRequest(&netlink.Neigh{LinkIndex: l.Attrs().Index, Family: netlink.FAMILY_V4,
		IP: netip.MustParseAddr("10.9.99.99").AsSlice()}, false)}
	if err := kernel.WriteBatch(p, del, unix.ENOENT, &done, func(int) string { return "" }); err != nil || done != 0 {
		t.Errorf("deleting a missing neighbour: %v, %d done", err, done)
	}
}

// TestFDBList: the FDB entries the step reads are the device's permanent
// entries with a remote address (also an all-zero MAC's), not other entries
// or another device's.
func TestFDBList(t *testing.T) {
	s := newBatchSide(t, "fdblist", false)
	nettest.MustRun(t, s.ns, "ip", "link", "add", "vx1", "type", "vxlan", "id", "2", "dstport", "8473", "nolearning")
	for _, cmd := range [][]string{
		{"bridge", "fdb", "append", "0a:00:00:00:00:11", "dst", "100.64.0.1", "dev", "vx0", "self", "permanent"},
		{"bridge", "fdb", "append", "00:00:00:00:00:00", "dst", "100.64.0.3", "dev", "vx0", "self", "permanent"},
		{"bridge", "fdb", "append", "0a:00:00:00:00:14", "dst", "100.64.0.4", "dev", "vx0", "self", "dynamic"},
		{"bridge", "fdb", "append", "0a:00:00:00:00:15", "dst", "100.64.0.5", "dev", "vx1", "self", "permanent"},
	} {
		nettest.MustRun(t, s.ns, cmd...)
	}
	got, err := s.fdb.list()
	if err != nil {
		t.Fatal(err)
	}
	want := map[fdbEntry]bool{
		{MAC: mac("0a:00:00:00:00:11"), Dst: netip.MustParseAddr("100.64.0.1")}: true,
		{MAC: mac("00:00:00:00:00:00"), Dst: netip.MustParseAddr("100.64.0.3")}: true,
	}
	if !maps.Equal(got, want) {
		t.Fatalf("list() = %v, want %v", got, want)
	}
}
