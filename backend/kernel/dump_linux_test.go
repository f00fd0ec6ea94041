package kernel

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/weft-net/weft/internal/testkit/nettest"
)

// messyNS is a namespace whose overlay link (a VXLAN device, vx0) and
// second link (ve0) hold entries of every kind an overlay's reads must keep
// or skip: permanent and other neighbours, on the link and elsewhere; weft's
// routes on the link and direct ones, the kernel's, other protocols',
// another table's, a blackhole, a multipath and a default route; both
// families.
func messyNS(t *testing.T) (*nettest.NS, int) {
	ns := nettest.NewNS(t, "dump")
	for _, cmd := range [][]string{
		{"ip", "link", "add", "vx0", "address", "0a:00:00:00:00:01", "type", "vxlan", "id", "1", "dstport", "8472", "nolearning"},
		{"ip", "link", "add", "ve0", "type", "veth", "peer", "name", "ve1"},
		{"ip", "link", "set", "vx0", "up"},
		{"ip", "link", "set", "ve0", "up"},
		{"ip", "link", "set", "ve1", "up"},
		{"ip", "addr", "add", "192.168.5.1/24", "dev", "ve0"},
		{"ip", "addr", "add", "fd05::1/64", "dev", "ve0", "nodad"},
		{"ip", "neigh", "add", "10.1.0.0", "lladdr", "0a:00:00:00:01:00", "dev", "vx0", "nud", "permanent"},
		{"ip", "neigh", "add", "10.1.1.0", "lladdr", "0a:00:00:00:01:01", "dev", "vx0", "nud", "reachable"},
		{"ip", "neigh", "add", "fd00:1::", "lladdr", "0a:00:00:00:01:02", "dev", "vx0", "nud", "permanent"},
		{"ip", "neigh", "add", "192.168.5.9", "lladdr", "0a:00:00:00:05:09", "dev", "ve0", "nud", "permanent"},
		{"ip", "route", "add", "10.1.0.0/24", "via", "10.1.0.0", "dev", "vx0", "onlink", "proto", "87", "metric", "5"},
		{"ip", "route", "add", "10.1.3.0/24", "via", "10.1.3.0", "dev", "vx0", "onlink"},
		{"ip", "route", "add", "10.1.4.0/24", "dev", "vx0", "scope", "link"},
		{"ip", "route", "add", "default", "via", "10.1.0.0", "dev", "vx0", "onlink"},
		{"ip", "route", "add", "10.9.0.0/24", "via", "192.168.5.2", "proto", "87"},
		{"ip", "route", "add", "10.8.0.0/24", "via", "192.168.5.3"},
		{"ip", "route", "add", "blackhole", "10.7.0.0/24", "proto", "87"},
		{"ip", "route", "add", "10.6.0.0/24", "proto", "87", "nexthop", "via", "192.168.5.4", "nexthop", "via", "192.168.5.5"},
		{"ip", "route", "add", "10.5.0.0/24", "via", "10.5.0.0", "dev", "vx0", "onlink", "proto", "87", "table", "100"},
		{"ip", "-6", "route", "add", "fd00:1::/64", "via", "fd00:1::", "dev", "vx0", "onlink", "proto", "87"},
		{"ip", "-6", "route", "add", "fd00:9::/64", "via", "fd05::2", "proto", "87", "metric", "7"},
		{"ip", "-6", "route", "add", "fd00:8::/64", "via", "fd05::3"},
	} {
		nettest.MustRun(t, ns, cmd...)
	}
	l, err := ns.Handle.LinkByName("vx0")
	if err != nil {
		t.Fatal(err)
	}
	return ns, l.Attrs().Index
}

// TestDumpsMatchHandle: the overlay state read through the batch writer's dumps is
// what netlink.Handle's lists give, for each family and for a link of
// direct routes only, on a namespace with entries of every kind.
func TestDumpsMatchHandle(t *testing.T) {
	ns, idx := messyNS(t)
	for _, tc := range []struct {
		name string
		opts OverlayOptions
	}{
		{"both families", OverlayOptions{Family: netlink.FAMILY_ALL}},
		{"IPv4", OverlayOptions{Family: netlink.FAMILY_V4}},
		{"IPv6", OverlayOptions{Family: netlink.FAMILY_V6}},
		{"direct only", OverlayOptions{Family: netlink.FAMILY_ALL, DirectRouting: true, DirectOnly: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plain := NewOverlay(ns.Handle, idx, tc.opts)
			pipe := NewLazyBatchWriter(ns.Handle, ns.Path, idx)
			if pipe.Get() == nil {
				t.Fatalf("pipe: %v", pipe.Err())
			}
			tc.opts.Batch = pipe
			dumped := NewOverlay(ns.Handle, idx, tc.opts)
			want, err := plain.Programmed()
			if err != nil {
				t.Fatal(err)
			}
			got, err := dumped.Programmed()
			if err != nil {
				t.Fatal(err)
			}
			sortProgrammed(&want)
			sortProgrammed(&got)
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("through the dumps:\n%+v\nthrough netlink.Handle:\n%+v", got, want)
			}
			if tc.opts.Family == netlink.FAMILY_ALL && !tc.opts.DirectOnly && (len(want.Neighbours) != 2 || len(want.Routes) != 8) {
				t.Fatalf("the fixture gives %d neighbours and %d routes, want 2 and 8: it tests less than it says\n%+v",
					len(want.Neighbours), len(want.Routes), want)
			}
		})
	}
}

func sortProgrammed(p *Programmed) {
	slices.SortFunc(p.Neighbours, func(a, b Neighbour) int { return a.IP.Compare(b.IP) })
	slices.SortFunc(p.Routes, func(a, b Route) int {
		return cmp.Or(a.Dst.Addr().Compare(b.Dst.Addr()), a.Dst.Bits()-b.Dst.Bits(), a.Gw.Compare(b.Gw), a.Priority-b.Priority)
	})
}

// TestReadAnswer: the messages of a dump's answer are handed over in
// order, others' skipped, an interruption and the dump's end noticed, and
// an error in NLMSG_DONE or NLMSG_ERROR returned.
func TestReadAnswer(t *testing.T) {
	msg := func(typ, flags uint16, seq uint32, payload ...byte) []byte {
		b := make([]byte, unix.NLMSG_HDRLEN, nlmAlign(unix.NLMSG_HDRLEN+len(payload)))
		binary.NativeEndian.PutUint32(b[0:4], uint32(unix.NLMSG_HDRLEN+len(payload)))
		binary.NativeEndian.PutUint16(b[4:6], typ)
		binary.NativeEndian.PutUint16(b[6:8], flags)
		binary.NativeEndian.PutUint32(b[8:12], seq)
		b = append(b, payload...)
		return append(b, make([]byte, cap(b)-len(b))...)
	}
	errno := func(e unix.Errno) []byte {
		return binary.NativeEndian.AppendUint32(nil, uint32(-int32(e)))
	}
	for _, tc := range []struct {
		name              string
		answer            []byte
		got               string
		done, intr, isErr bool
	}{
		{"part", slices.Concat(msg(unix.RTM_NEWROUTE, unix.NLM_F_MULTI, 7, 1), msg(unix.RTM_NEWROUTE, unix.NLM_F_MULTI, 7, 2, 3)),
			"[1][2 3]", false, false, false},
		{"others skipped", slices.Concat(msg(unix.RTM_NEWROUTE, 0, 6, 9), msg(unix.RTM_NEWNEIGH, 0, 7, 8), msg(unix.RTM_NEWROUTE, 0, 7, 1)),
			"[1]", false, false, false},
		{"interrupted and done", slices.Concat(msg(unix.RTM_NEWROUTE, unix.NLM_F_DUMP_INTR, 7, 1), msg(unix.NLMSG_DONE, 0, 7, 0, 0, 0, 0)),
			"[1]", true, true, false},
		{"done without payload", msg(unix.NLMSG_DONE, 0, 7), "", true, false, false},
		{"done with an error", msg(unix.NLMSG_DONE, 0, 7, errno(unix.EINVAL)...), "", true, false, true},
		{"error", msg(unix.NLMSG_ERROR, 0, 7, errno(unix.EPERM)...), "", true, false, true},
		{"another request's error", slices.Concat(msg(unix.NLMSG_ERROR, 0, 6, errno(unix.EPERM)...), msg(unix.NLMSG_DONE, 0, 7)),
			"", true, false, false},
		{"cut short", msg(unix.RTM_NEWROUTE, 0, 7, 1, 2, 3, 4, 5)[:unix.NLMSG_HDRLEN+2], "", false, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := ""
			done, intr, err := readAnswer(tc.answer, 7, unix.RTM_NEWROUTE, func(m []byte) { got += fmt.Sprint(m) })
			if got != tc.got || done != tc.done || intr != tc.intr || (err != nil) != tc.isErr {
				t.Fatalf("got %s done %v interrupted %v err %v; want %s %v %v error %v", got, done, intr, err, tc.got, tc.done, tc.intr, tc.isErr)
			}
		})
	}
}
