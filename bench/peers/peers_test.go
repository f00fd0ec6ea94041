// Package peers benchmarks what weftd costs a node with thousands of peers,
// against the kernel: with 5,000 peer leases in etcd (or 5,000 Nodes in a
// real kube-apiserver, kube_test.go), how long weftd takes from start to
// all of them programmed, how fast a new lease turns into a route, and
// what the daemon holds at rest and under churn: its anonymous memory and
// PSS (see measure_test.go) and its CPU. Run it as root:
//
//	go test -run '^$' -bench Peers5000 -benchtime 1x ./bench/peers
//
// It prints the figures; it asserts nothing about them. To compare with
// Flannel, name a flanneld executable (built from
// github.com/flannel-io/flannel) in WEFT_BENCH_FLANNELD: it runs in the
// same rounds, interleaved, with the same etcd, leases and churn, and is
// measured the same way (its routes on flannel.1). To compare with an
// earlier weftd, name it in WEFT_BENCH_BASE_WEFTD. WEFT_BENCH_REPORT names
// a markdown file (bench/peers/README.md) whose report section the run
// rewrites:
//
//	WEFT_BENCH_FLANNELD=/tmp/flannel/flanneld WEFT_BENCH_REPORT=bench/peers/README.md \
//		go test -run '^$' -bench Peers5000 -benchtime 3x -timeout 60m ./bench/peers
package peers

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/weft-net/weft/backend/kernel"
	"github.com/weft-net/weft/internal/testkit/benchreport"
	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/test/e2e"
	"github.com/weft-net/weft/vtep"
)

const config = `{"Network":"10.0.0.0/8","SubnetLen":24,"Backend":{"Type":"vxlan"}}`

const (
	peers  = 5000 // leases in etcd before the daemon starts
	probes = 200  // new leases, one at a time, each timed to its route
	// churnBase is the first peer number the churn adds: beyond the probes.
	churnBase = 6 * peers
)

// fakePeer is peer number i: subnet 10.(n/256).(n%256).0/24 with n = i+1
// (past the first subnet), behind an underlay address in 100.64.0.0/10
// that no traffic is ever sent to.
func fakePeer(i int) (netip.Prefix, netip.Addr) {
	n := i + 1
	sn := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(n >> 8), byte(n), 0}), 24)
	pub := netip.AddrFrom4([4]byte{100, 64 + byte(n>>16), byte(n >> 8), byte(n)})
	return sn, pub
}

// movedPub is the public address the churn gives peer i: in 100.96.0.0/11.
func movedPub(i int) netip.Addr {
	n := i + 1
	return netip.AddrFrom4([4]byte{100, 96 + byte(n>>16), byte(n >> 8), byte(n)})
}

// leaseKey and leaseValue are a vxlan lease of sn behind pub, as flanneld
// writes it.
func leaseKey(sn netip.Prefix) string {
	return e2e.Prefix + "/subnets/" + subnet.MakeKey(sn, netip.Prefix{})
}

func leaseValue(pub netip.Addr) string {
	attrs := subnet.LeaseAttrs{PublicIP: pub, BackendType: "vxlan",
		BackendData: &subnet.VXLANData{VNI: 1, VtepMAC: vtep.DeviceMAC(pub, 1)}}
	v, _ := json.Marshal(attrs)
	return string(v)
}

func fakeLease(i int) (string, string) {
	sn, pub := fakePeer(i)
	return leaseKey(sn), leaseValue(pub)
}

// The goals of issue 15 at 5,000 peers; BenchmarkPeers5000 prints a verdict
// for each (benchreport.Verdicts).
const (
	goalStart  = "start to all programmed, weftd"
	goalFaster = "start to all programmed, flanneld's time over weftd's"
	goalP50    = "new lease to route p50, weftd"
	goalP99    = "new lease to route p99, weftd"
	goalAnon   = "anonymous memory at rest, weftd's over flanneld's"
)

var peersGoals = []benchreport.Goal{
	{Name: goalStart, AtMost: true, Bound: 0.4, Unit: "s"},
	{Name: goalFaster, Bound: 15, Unit: "×"},
	{Name: goalP50, AtMost: true, Bound: 10, Unit: "ms"},
	{Name: goalP99, AtMost: true, Bound: 50, Unit: "ms"},
	{Name: goalAnon, AtMost: true, Bound: 1, Unit: "×"},
}

// BenchmarkPeers5000 runs one round per iteration: this tree's weftd and,
// interleaved with it (the order alternating from round to round), the
// earlier weftd of WEFT_BENCH_BASE_WEFTD and the flanneld of
// WEFT_BENCH_FLANNELD, so that all see the same machine. It prints every
// round's figures with the load average, then the medians and spread.
func BenchmarkPeers5000(b *testing.B) {
	bins := []*daemon{{label: "weftd (this tree)"}}
	if base := os.Getenv("WEFT_BENCH_BASE_WEFTD"); base != "" {
		bins = append(bins, &daemon{label: "weftd " + base, path: base})
	}
	if fl := os.Getenv("WEFT_BENCH_FLANNELD"); fl != "" {
		bins = append(bins, &daemon{label: "flanneld", path: fl, flanneld: true})
	}
	cols := make([]column, len(bins))
	for i := 0; b.Loop(); i++ {
		for k := range bins {
			j := k
			if i%2 == 1 { // alternate which goes first
				j = len(bins) - 1 - k
			}
			r := peersRound(b, bins[j])
			r.round = i + 1
			cols[j].rs = append(cols[j].rs, r)
			fmt.Printf("round %d %s: %s\n", i+1, bins[j].label, r)
		}
	}
	for j, d := range bins {
		cols[j].label = d.label
		if d.flanneld && d.version != "" {
			cols[j].label = "flanneld " + d.version
		}
	}
	w := cols[0]
	b.ReportMetric(w.median(func(r result) float64 { return r.startup.Seconds() }), "startup-s")
	b.ReportMetric(w.median(func(r result) float64 { return ms(r.p99) }), "p99-ms")
	b.ReportMetric(w.median(func(r result) float64 { return r.rest.anon }), "anon-rest-MB")
	b.ReportMetric(w.median(func(r result) float64 { return r.rest.pss }), "pss-rest-MB")
	b.ReportMetric(w.median(func(r result) float64 { return r.churn.anonMax }), "anon-churn-max-MB")

	anonRest := func(r result) float64 { return r.rest.anon }
	startup := func(r result) float64 { return r.startup.Seconds() }
	got := map[string]float64{
		goalStart: w.median(startup),
		goalP50:   w.median(func(r result) float64 { return ms(r.p50) }),
		goalP99:   w.median(func(r result) float64 { return ms(r.p99) }),
	}
	var tail []string
	if f := cols[len(cols)-1]; bins[len(bins)-1].flanneld {
		got[goalFaster] = f.median(startup) / w.median(startup)
		got[goalAnon] = w.median(anonRest) / f.median(anonRest)
		tail = append(tail,
			fmt.Sprintf("Anonymous memory at rest with 5,000 peers: weftd %.1f MB, flanneld %.1f MB.", w.median(anonRest), f.median(anonRest)),
			fmt.Sprintf("Under churn: anonymous memory weftd %.1f MB (at most %.1f), flanneld %.1f MB (at most %.1f); PSS weftd %.1f MB, flanneld %.1f MB; CPU weftd %.2f %%, flanneld %.2f %% of a core.",
				w.median(func(r result) float64 { return r.churn.anon }), w.median(func(r result) float64 { return r.churn.anonMax }),
				f.median(func(r result) float64 { return r.churn.anon }), f.median(func(r result) float64 { return r.churn.anonMax }),
				w.median(func(r result) float64 { return r.churn.pss }), f.median(func(r result) float64 { return r.churn.pss }),
				w.median(func(r result) float64 { return r.churn.cpu }), f.median(func(r result) float64 { return r.churn.cpu })),
			fmt.Sprintf("Start to all programmed: weftd %.2f s, flanneld %.2f s (%.1f× faster; from the daemon's start %.2f and %.2f s).",
				w.median(startup), f.median(startup), f.median(startup)/w.median(startup),
				w.median(func(r result) float64 { return r.fromExec.Seconds() }), f.median(func(r result) float64 { return r.fromExec.Seconds() })))
	} else {
		tail = append(tail, fmt.Sprintf("Anonymous memory at rest with 5,000 peers: weftd %.1f MB; flanneld not run (WEFT_BENCH_FLANNELD unset).", w.median(anonRest)))
	}
	for _, v := range benchreport.Verdicts(peersGoals, got) {
		tail = append(tail, "**"+v+"**")
	}
	intro := []string{
		fmt.Sprintf("%s peer leases in one etcd (in the benchmark's process, over a unix socket); each daemon in a network namespace of its own with a kernel VXLAN device (weftd `weft.1`, flanneld `flannel.1`). "+
			"Start: from the node's creation (and from the daemon's start) to all %s routes on the device. New lease → route: %d leases put one at a time, each timed until its route appears.", thousands(peers), thousands(peers), probes),
		fmt.Sprintf("Memory from /proc/PID/smaps_rollup, sampled every %s: anonymous (`Anonymous`: heap, stacks, runtime data, what the node pays for the daemon) and PSS (`Pss`); file-backed is the resident pages of files, the executable's mostly (Rss − Anonymous), which the kernel shares and can reclaim, apart. "+
			"At rest: over %s, from %s after the last new lease. Under churn: right after, %d lease changes, one a second (in turn: a new lease, an existing peer moved to another public address and VTEP MAC, the deletion of the lease added two seconds before). CPU: the daemon's user and system time over the window. "+
			"Idle: a daemon with no peers, %s after it is ready, over 2 s.", human(sampleEvery), human(restSpan), human(restWait), churnChanges, human(restWait)),
	}
	report(b, section{
		name:  "Peers5000",
		intro: intro,
		cols:  cols,
		figs:  peersFigures,
		perHdr: []string{"start s", "p50 ms", "p99 ms", "anon at rest MB (max)", "PSS at rest MB (max)",
			"anon under churn MB (max)", "PSS under churn MB (max)", "CPU at rest %", "CPU under churn %"},
		perRow: func(r result) []string {
			return []string{fmt.Sprintf("%.2f", r.startup.Seconds()), fmt.Sprintf("%.1f", ms(r.p50)), fmt.Sprintf("%.1f", ms(r.p99)),
				fmt.Sprintf("%.1f (%.1f)", r.rest.anon, r.rest.anonMax), fmt.Sprintf("%.1f (%.1f)", r.rest.pss, r.rest.pssMax),
				fmt.Sprintf("%.1f (%.1f)", r.churn.anon, r.churn.anonMax), fmt.Sprintf("%.1f (%.1f)", r.churn.pss, r.churn.pssMax),
				fmt.Sprintf("%.2f", r.rest.cpu), fmt.Sprintf("%.2f", r.churn.cpu)}
		},
		tail: tail,
	})
}

// memFigures are the memory and CPU rows every section has.
var memFigures = []figure{
	{"anonymous memory at rest, mean MB", 1, func(r result) float64 { return r.rest.anon }},
	{"anonymous memory at rest, most MB", 1, func(r result) float64 { return r.rest.anonMax }},
	{"PSS at rest, mean MB", 1, func(r result) float64 { return r.rest.pss }},
	{"PSS at rest, most MB", 1, func(r result) float64 { return r.rest.pssMax }},
	{"file-backed resident at rest, mean MB (shared, reclaimable; not in anonymous)", 1, func(r result) float64 { return r.rest.file }},
	{"CPU at rest, % of a core", 2, func(r result) float64 { return r.rest.cpu }},
	{"anonymous memory under churn, mean MB", 1, func(r result) float64 { return r.churn.anon }},
	{"anonymous memory under churn, most MB", 1, func(r result) float64 { return r.churn.anonMax }},
	{"PSS under churn, mean MB", 1, func(r result) float64 { return r.churn.pss }},
	{"PSS under churn, most MB", 1, func(r result) float64 { return r.churn.pssMax }},
	{"CPU under churn, % of a core", 2, func(r result) float64 { return r.churn.cpu }},
}

// goFigures say where weftd's anonymous memory goes, from its Go runtime
// at the end of the rest window.
var goFigures = []figure{
	{"weftd's Go heap at the end of the rest window: objects (live and not yet collected) MB", 1, func(r result) float64 { return orNaN(r.gomem.heapLive, r.gomem.ok) }},
	{"… heap spans in use MB", 1, func(r result) float64 { return orNaN(r.gomem.heapInuse, r.gomem.ok) }},
	{"… free heap spans not returned to the kernel MB", 1, func(r result) float64 { return orNaN(r.gomem.heapIdle, r.gomem.ok) }},
	{"… goroutine stacks MB", 1, func(r result) float64 { return orNaN(r.gomem.stacks, r.gomem.ok) }},
	{"… runtime metadata (spans, caches, GC; as mapped) MB", 1, func(r result) float64 { return orNaN(r.gomem.meta, r.gomem.ok) }},
	{"… next GC at heap MB", 1, func(r result) float64 { return orNaN(r.gomem.nextGC, r.gomem.ok) }},
	{"… goroutines", 0, func(r result) float64 { return orNaN(r.gomem.goroutines, r.gomem.ok) }},
}

var peersFigures = slices.Concat([]figure{
	{"start to all 5,000 routes, s", 2, func(r result) float64 { return r.startup.Seconds() }},
	{"… from the daemon's start, s", 2, func(r result) float64 { return r.fromExec.Seconds() }},
	{"new lease → route p50, ms", 1, func(r result) float64 { return ms(r.p50) }},
	{"new lease → route p99, ms", 1, func(r result) float64 { return ms(r.p99) }},
}, memFigures, []figure{
	{"idle, no peers: anonymous memory MB", 1, func(r result) float64 { return r.idle.anon }},
	{"idle, no peers: PSS MB", 1, func(r result) float64 { return r.idle.pss }},
}, goFigures)

// daemon is one executable a round measures: weftd (path empty: this
// tree's) or a real flanneld.
type daemon struct {
	label, path string
	flanneld    bool
	version     string // flanneld --version, once a round has run it
}

// device is the VXLAN device whose routes show the daemon's peers.
func (d *daemon) device() string {
	if d.flanneld {
		return "flannel.1"
	}
	return "weft.1"
}

// use makes c start d on every new node.
func (d *daemon) use(c *e2e.Cluster) {
	if !d.flanneld {
		return
	}
	c.OnNode = func(n *e2e.Node) {
		n.Prog, n.OwnArgs = d.path, true
		n.Args = []string{"--etcd-endpoints", c.Endpoints(), "--etcd-prefix", e2e.Prefix, "--iface", "eth0",
			"--subnet-file", n.SubnetFile, "--iptables-forward-rules=false", "--ip-masq=false"}
	}
}

// waitReady waits until d on n holds its lease: weftd's readiness, or
// flanneld's subnet file.
func (d *daemon) waitReady(b *testing.B, n *e2e.Node) {
	if !d.flanneld {
		n.WaitReady()
		return
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(n.SubnetFile); err == nil {
			return
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(n.LogFile)
			b.Fatalf("flanneld wrote no subnet file within 30 s:\n%s", log)
		}
	}
}

// readVersion asks flanneld for its version, inside n's namespace.
func (d *daemon) readVersion(n *e2e.Node) {
	if !d.flanneld || d.version != "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if out, err := n.Command(ctx, d.path, "--version").CombinedOutput(); err == nil {
		d.version = strings.TrimSpace(string(out))
	}
}

// restWait is how long after the last change the rest window starts, and
// after its readiness the idle daemon is read; restSpan is how long the
// rest window lasts: longer than weftd's full resync period, so that the
// resync's garbage and CPU always fall inside it.
const (
	restWait = 5 * time.Second
	restSpan = kernel.DefaultResync + 2*time.Second
)

// peersRound measures d: first idle, with no peers; then, with 5,000
// leases in etcd, start to every route programmed, the probes, the rest
// window and the churn.
func peersRound(b *testing.B, d *daemon) result {
	opts := e2e.Options{Nodes: 0, Config: config}
	if !d.flanneld {
		opts.Weftd = d.path
	}
	c := e2e.NewCluster(b, opts)
	d.use(c)
	var exec time.Time // when the harness starts the daemon, after it built the node
	onNode := c.OnNode
	c.OnNode = func(n *e2e.Node) {
		if onNode != nil {
			onNode(n)
		}
		exec = time.Now()
	}
	defer func() {
		for _, n := range c.Nodes {
			n.Stop()
		}
		// This round's etcd, which would otherwise run (and compact) in
		// the benchmark's process through the later rounds.
		c.Client.Close()
		c.Etcd.Close()
	}()
	ctx := context.Background()
	var r result
	idle := c.AddNode("n0")
	d.waitReady(b, idle)
	time.Sleep(restWait) // let the idle daemon come to rest: a memory figure, not a synchronisation
	r.idle = sample(b, idle.PID(), 2*time.Second, nil)
	idle.Stop()
	for i := range peers {
		k, v := fakeLease(i)
		if _, err := c.Client.Put(ctx, k, v); err != nil {
			b.Fatal(err)
		}
	}
	r.loadStart = benchreport.LoadAvg("/")
	start := time.Now()
	node := c.AddNode("n1")
	h := node.Handle
	// Wait for every route: count them on the overlay device.
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(5 * time.Millisecond) {
		if n := countRoutes(b, h, d.device()); n >= peers {
			r.startup, r.fromExec = time.Since(start), time.Since(exec)
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("only %d of %d routes after 2 minutes", countRoutes(b, h, d.device()), peers)
		}
	}
	d.waitReady(b, node)
	d.readVersion(node)
	// Probe subnets lie far beyond the first free ones, where the node
	// took its own.
	lat := probeLatency(b, node, probes, func(i int) netip.Prefix {
		k, v := fakeLease(4*peers + i)
		want, _ := fakePeer(4*peers + i)
		if _, err := c.Client.Put(ctx, k, v); err != nil {
			b.Fatal(err)
		}
		return want
	})
	r.p50, r.p99, r.max = lat[len(lat)/2], lat[len(lat)*99/100], lat[len(lat)-1]
	time.Sleep(restWait) // a memory figure at rest, not a synchronisation
	r.rest = sample(b, node.PID(), restSpan, nil)
	r.gomem = readGoMem(node)
	routes := countRoutes(b, h, d.device())
	var moved int // the last peer the churn moved
	r.churn = churn(b, node.PID(), func(i int) {
		var err error
		switch i % 3 {
		case 0:
			k, v := fakeLease(churnBase + i/3)
			_, err = c.Client.Put(ctx, k, v)
		case 1:
			moved = (i / 3) % peers
			sn, _ := fakePeer(moved)
			_, err = c.Client.Put(ctx, leaseKey(sn), leaseValue(movedPub(moved)))
		case 2:
			k, _ := fakeLease(churnBase + i/3)
			_, err = c.Client.Delete(ctx, k)
		}
		if err != nil {
			b.Fatal(err)
		}
	})
	// The churn was applied: as many routes as before it, and the last
	// peer moved has its new VTEP MAC.
	sn, _ := fakePeer(moved)
	mac := vtep.DeviceMAC(movedPub(moved), 1)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		n := countRoutes(b, h, d.device())
		has := hasNeigh(h, d.device(), sn.Addr(), mac)
		if n == routes && has {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("after the churn: %d routes (before: %d), neighbour %s → %s: %v", n, routes, sn.Addr(), mac, has)
		}
	}
	r.loadEnd = benchreport.LoadAvg("/")
	if log, err := os.ReadFile(node.LogFile); err == nil && os.Getenv("WEFT_BENCH_LOG") != "" {
		for _, line := range strings.Split(string(log), "\n") {
			if strings.Contains(line, "synced peers") || strings.Contains(line, "resync") || strings.Contains(line, "lease") {
				fmt.Println(line)
			}
		}
	}
	return r
}

// hasNeigh reports whether dev on h has the neighbour ip at mac.
func hasNeigh(h *netlink.Handle, dev string, ip netip.Addr, mac subnet.MAC) bool {
	l, err := h.LinkByName(dev)
	if err != nil {
		return false
	}
	ns, err := h.NeighList(l.Attrs().Index, netlink.FAMILY_V4)
	if err != nil {
		return false
	}
	for _, n := range ns {
		if a, ok := netip.AddrFromSlice(n.IP); ok && a.Unmap() == ip && n.HardwareAddr.String() == mac.String() {
			return true
		}
	}
	return false
}

// probeLatency makes probes new leases one at a time with add (which
// returns the lease's subnet) and returns, sorted, how long each took to
// show up as a route on node.
func probeLatency(b *testing.B, node *e2e.Node, probes int, add func(i int) netip.Prefix) []time.Duration {
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
	for i := range probes {
		t0 := time.Now()
		want := add(i)
		waitRoute(b, routes, want)
		lat = append(lat, time.Since(t0))
	}
	slices.Sort(lat)
	return lat
}

func countRoutes(b *testing.B, h *netlink.Handle, dev string) int {
	l, err := h.LinkByName(dev)
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
