// Package peers benchmarks weftd's control plane against the kernel: with
// thousands of peer leases in etcd, how long weftd takes from start to all
// of them programmed, how fast a new lease turns into a route, and how much
// memory the daemon holds. Run it as root:
//
//	go test -run '^$' -bench Peers -benchtime 1x ./bench/peers
//
// It prints the figures; it asserts nothing about them.
package peers

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/weft-net/weft/backend"
	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/test/e2e"
)

const config = `{"Network":"10.0.0.0/8","SubnetLen":24,"Backend":{"Type":"vxlan"}}`

// fakeLease is peer number i: subnet 10.(i/256).(i%256).0/24 shifted past
// the first subnet, behind an underlay address in 100.64.0.0/10 that no
// traffic is ever sent to.
func fakeLease(i int) (string, string) {
	n := i + 1
	sn := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(n >> 8), byte(n), 0}), 24)
	pub := netip.AddrFrom4([4]byte{100, 64 + byte(n>>16), byte(n >> 8), byte(n)})
	attrs := subnet.LeaseAttrs{PublicIP: pub, BackendType: "vxlan",
		BackendData: &subnet.VXLANData{VNI: 1, VtepMAC: backend.VTEPMAC(pub, 1)}}
	v, _ := json.Marshal(attrs)
	return e2e.Prefix + "/subnets/" + subnet.MakeKey(sn, netip.Prefix{}), string(v)
}

func BenchmarkPeers5000(b *testing.B) {
	const peers, probes = 5000, 200
	for range b.N {
		c := e2e.NewCluster(b, e2e.Options{Nodes: 0, Config: config})
		ctx := context.Background()
		// The same daemon with no peers, for the memory baseline.
		idle := c.AddNode("n0")
		idle.WaitReady()
		time.Sleep(time.Second)
		idleAnon, idleFile := rssOf(b, idle)
		idle.Stop()
		for i := range peers {
			k, v := fakeLease(i)
			if _, err := c.Client.Put(ctx, k, v); err != nil {
				b.Fatal(err)
			}
		}
		start := time.Now()
		node := c.AddNode("n1")
		h := node.Handle
		// Wait for every route: count them on the overlay device.
		var startup time.Duration
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(5 * time.Millisecond) {
			if n := countRoutes(b, h); n >= peers {
				startup = time.Since(start)
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("only %d of %d routes after 2 minutes", countRoutes(b, h), peers)
			}
		}
		node.WaitReady()

		routes := make(chan netlink.RouteUpdate, 1024)
		done := make(chan struct{})
		defer close(done)
		nsh, err := netns.GetFromPath(node.Path)
		if err != nil {
			b.Fatal(err)
		}
		defer nsh.Close()
		if err := netlink.RouteSubscribeWithOptions(routes, done, netlink.RouteSubscribeOptions{Namespace: &nsh}); err != nil {
			b.Fatal(err)
		}
		lat := make([]time.Duration, 0, probes)
		// Probe subnets lie far beyond the first free ones, where the node
		// took its own.
		for i := 4 * peers; i < 4*peers+probes; i++ {
			k, v := fakeLease(i)
			want, _, _ := subnet.ParseKey(strings.TrimPrefix(k, e2e.Prefix+"/subnets/"))
			t0 := time.Now()
			if _, err := c.Client.Put(ctx, k, v); err != nil {
				b.Fatal(err)
			}
			waitRoute(b, routes, want)
			lat = append(lat, time.Since(t0))
		}
		slices.Sort(lat)
		anon, file := rssOf(b, node)
		fmt.Printf("peers=%d startup_to_all_programmed=%s new_lease_to_route p50=%s p99=%s max=%s weftd_rss anon=%.1fMB file=%.1fMB (idle, no peers: anon=%.1fMB file=%.1fMB)\n",
			peers, startup.Round(time.Millisecond), lat[len(lat)/2].Round(time.Microsecond),
			lat[len(lat)*99/100].Round(time.Microsecond), lat[len(lat)-1].Round(time.Microsecond), anon, file, idleAnon, idleFile)
		fmt.Printf("goals: startup < 1s, p99 < 100ms, RSS < 40MB (file-backed pages are the shared executable)\n")
		if log, err := os.ReadFile(node.LogFile); err == nil && os.Getenv("WEFT_BENCH_LOG") != "" {
			for _, line := range strings.Split(string(log), "\n") {
				if strings.Contains(line, "synced peers") || strings.Contains(line, "resync") || strings.Contains(line, "lease") {
					fmt.Println(line)
				}
			}
		}
		b.ReportMetric(startup.Seconds(), "startup-s")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
		b.ReportMetric(anon, "rss-anon-MB")
		b.ReportMetric(anon+file, "rss-MB")
	}
}

func countRoutes(b *testing.B, h *netlink.Handle) int {
	l, err := h.LinkByName("weft.1")
	if err != nil {
		return 0
	}
	rs, err := h.RouteList(l, netlink.FAMILY_V4)
	if err != nil {
		return 0
	}
	n := 0
	for _, r := range rs {
		if r.Dst != nil && r.Gw != nil {
			n++
		}
	}
	return n
}

func waitRoute(b *testing.B, ch <-chan netlink.RouteUpdate, want netip.Prefix) {
	timeout := time.After(10 * time.Second)
	for {
		select {
		case u := <-ch:
			if u.Type != 24 /* RTM_NEWROUTE */ || u.Dst == nil {
				continue
			}
			ones, _ := u.Dst.Mask.Size()
			if a, ok := netip.AddrFromSlice(u.Dst.IP); ok && netip.PrefixFrom(a.Unmap(), ones) == want {
				return
			}
		case <-timeout:
			b.Fatalf("route to %s never appeared", want)
		}
	}
}

// rssOf reads weftd's resident memory from /proc in MB: anonymous (heap,
// stacks: what the daemon itself holds) and file-backed (pages of its own
// executable that the kernel shares and can reclaim).
func rssOf(b *testing.B, n *e2e.Node) (anon, file float64) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(n.PID()) + "/status")
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.Atoi(f[1])
		switch f[0] {
		case "RssAnon:":
			anon = float64(kb) / 1024
		case "RssFile:":
			file = float64(kb) / 1024
		}
	}
	return anon, file
}
