package vxlan

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/vtep"
)

// bigTable has n IPv4 peers 10.<i/256>.<i%256>.0/24 on distinct MACs.
func bigTable(n int) vtep.Table {
	t := make(vtep.Table, n)
	for i := range n {
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(100 + i/256), byte(i % 256), 0}), 24)
		t[p] = vtep.Peer{
			MAC:  subnet.MAC{0x0a, 0, 0, 0, byte(i >> 8), byte(i)},
			Addr: netip.AddrFrom4([4]byte{192, 168, byte(78 + i/250), byte(1 + i%250)}),
		}
	}
	return t
}

// BenchmarkSync reports how long a sync takes with n peers: programming
// them all from nothing (and removing them again), and a resync that finds
// everything in place (the periodic one). cpu-ms/op is the process's CPU
// time (user and system, so the kernel's work on the dumps and the garbage
// collector's included) per sync:
//
//	go test -run '^$' -bench 'Sync/resync/peers=5000' -benchtime 20x ./backend/vxlan
func BenchmarkSync(b *testing.B) {
	for _, n := range []int{100, 1000, 5000} {
		u := nettest.NewUnderlay(b, ul4, 0)
		h := u.AddHost(b, "bench", "eth0")
		l, err := h.Handle.LinkByName("eth0")
		if err != nil {
			b.Fatal(err)
		}
		be, err := New(Config{Handle: h.Handle, NetNS: h.Path, UnderlayIndex: l.Attrs().Index, Local: h.Addr,
			Subnet: netip.MustParsePrefix("10.244.1.0/24")}, testLoggerTB(b))
		if err != nil {
			b.Fatal(err)
		}
		table := bigTable(n)
		b.Run(fmt.Sprintf("program+remove/peers=%d", n), func(b *testing.B) {
			for b.Loop() {
				be.Desired.Set(table)
				if err := be.reconcile(true); err != nil {
					b.Fatal(err)
				}
				empty := vtep.Table{}
				be.Desired.Set(empty)
				if err := be.reconcile(true); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("resync/peers=%d", n), func(b *testing.B) {
			be.Desired.Set(table)
			if err := be.reconcile(true); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			cpu0 := cpuTime(b)
			for b.Loop() {
				if err := be.reconcile(true); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(time.Millisecond)/float64(b.N), "cpu-ms/op")
		})
	}
}

// cpuTime is the user and system CPU time the process has used so far.
func cpuTime(tb testing.TB) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
