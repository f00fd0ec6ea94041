// Package peers benchmarks weftd's control plane against the kernel: with
// thousands of peer leases in etcd, how long weftd takes from start to all
// of them programmed, how fast a new lease turns into a route, and how much
// memory the daemon holds. Run it as root:
//
//	go test -run '^$' -bench Peers -benchtime 1x ./bench/peers
//
// It prints the figures; it asserts nothing about them. To compare with an
// earlier build, name its weftd in WEFT_BENCH_BASE_WEFTD: every round then
// runs both, interleaved, and the medians of both are printed:
//
//	WEFT_BENCH_BASE_WEFTD=/tmp/old/weftd go test -run '^$' -bench Peers -benchtime 3x ./bench/peers
//
// To compare with Flannel, name a flanneld executable (built from
// github.com/flannel-io/flannel) in WEFT_BENCH_FLANNELD: it runs in the same
// rounds, with the same etcd and leases, and is measured the same way (its
// routes on flannel.1, its RSS).
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

	"github.com/weft-net/weft/backend/kernel"
	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/test/e2e"
	"github.com/weft-net/weft/vtep"
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
		BackendData: &subnet.VXLANData{VNI: 1, VtepMAC: vtep.DeviceMAC(pub, 1)}}
	v, _ := json.Marshal(attrs)
	return e2e.Prefix + "/subnets/" + subnet.MakeKey(sn, netip.Prefix{}), string(v)
}

// result is one round's figures.
type result struct {
	startup, p50, p99, max         time.Duration
	fromExec                       time.Duration // startup without the test node's setup: from the daemon's start
	anon, file, idleAnon, idleFile float64
	restAnon, restFile             float64 // at rest: means over restSpan, from restWait after the last probe
	restMax                        float64 // the most anon+file of any sample over restSpan
	restCPU                        float64 // CPU used over restSpan, in % of a core
	load                           string
}

// BenchmarkPeers5000 runs b.N rounds. With WEFT_BENCH_BASE_WEFTD naming an
// earlier weftd executable, each round runs that one too, interleaved with
// this tree's, so both see the same machine; the figures of both are printed
// with the load average of each round, then the medians.
func BenchmarkPeers5000(b *testing.B) {
	bins := []daemon{{label: "this tree"}}
	if base := os.Getenv("WEFT_BENCH_BASE_WEFTD"); base != "" {
		bins = append(bins, daemon{label: "base " + base, path: base})
	}
	if fl := os.Getenv("WEFT_BENCH_FLANNELD"); fl != "" {
		bins = append(bins, daemon{label: "flanneld " + fl, path: fl, flanneld: true})
	}
	all := make([][]result, len(bins))
	for i := range b.N {
		for j, bin := range bins {
			if i%2 == 1 { // alternate which goes first
				bin = bins[len(bins)-1-j]
				j = len(bins) - 1 - j
			}
			r := peersRound(b, bin)
			all[j] = append(all[j], r)
			fmt.Printf("round %d %s: %s\n", i+1, bin.label, r)
		}
	}
	for j, bin := range bins {
		m := median(all[j])
		fmt.Printf("median of %d %s: %s\n", len(all[j]), bin.label, m)
		if j == 0 {
			b.ReportMetric(m.startup.Seconds(), "startup-s")
			b.ReportMetric(float64(m.p99.Microseconds())/1000, "p99-ms")
			b.ReportMetric(m.anon, "rss-anon-MB")
			b.ReportMetric(m.anon+m.file, "rss-MB")
			b.ReportMetric(m.restAnon+m.restFile, "rss-rest-MB")
			b.ReportMetric(m.restMax, "rss-rest-max-MB")
		}
	}
	if fl := bins[len(bins)-1]; fl.flanneld {
		m, mf := median(all[0]), median(all[len(bins)-1])
		fmt.Printf("start to all programmed: flanneld %s, this tree %s: %.1fx faster (from the daemon's start: %s, %s: %.1fx)\n",
			mf.startup.Round(time.Millisecond), m.startup.Round(time.Millisecond), mf.startup.Seconds()/m.startup.Seconds(),
			mf.fromExec.Round(time.Millisecond), m.fromExec.Round(time.Millisecond), mf.fromExec.Seconds()/m.fromExec.Seconds())
		fmt.Printf("RSS at rest (mean over %s from %s after the last probe): flanneld %.1f MB, this tree %.1f MB (%.0f%%); the most: %.1f and %.1f MB (%.0f%%)\n",
			restSpan, restWait, mf.restAnon+mf.restFile, m.restAnon+m.restFile, 100*(m.restAnon+m.restFile)/(mf.restAnon+mf.restFile),
			mf.restMax, m.restMax, 100*m.restMax/mf.restMax)
		fmt.Printf("CPU at rest over %s: flanneld %.2f%%, this tree %.2f%% of a core\n", restSpan, mf.restCPU, m.restCPU)
	}
	fmt.Printf("goals (issue 15): startup <= 0.4s (>= 15x flanneld), p50 <= 10ms, p99 <= 50ms, RSS anon+file <= 25MB at 5,000 peers (here: the most at rest)\n")
}

// daemon is one executable a round measures: weftd (path empty: this
// tree's) or a real flanneld.
type daemon struct {
	label, path string
	flanneld    bool
}

// device is the VXLAN device whose routes show the daemon's peers.
func (d daemon) device() string {
	if d.flanneld {
		return "flannel.1"
	}
	return "weft.1"
}

// use makes c start d on every new node.
func (d daemon) use(c *e2e.Cluster) {
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
func (d daemon) waitReady(b *testing.B, n *e2e.Node) {
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

func (r result) String() string {
	return fmt.Sprintf("peers=5000 startup_to_all_programmed=%s (from the daemon's start: %s) new_lease_to_route p50=%s p99=%s max=%s "+
		"rss anon=%.1fMB file=%.1fMB total=%.1fMB (at rest, from %s later, over %s: mean anon=%.1fMB file=%.1fMB total=%.1fMB, most %.1fMB; CPU %.2f%% of a core) "+
		"(idle, no peers, %s after ready: anon=%.1fMB file=%.1fMB) load=%s",
		r.startup.Round(time.Millisecond), r.fromExec.Round(time.Millisecond), r.p50.Round(time.Microsecond), r.p99.Round(time.Microsecond),
		r.max.Round(time.Microsecond), r.anon, r.file, r.anon+r.file, restWait, restSpan, r.restAnon, r.restFile, r.restAnon+r.restFile,
		r.restMax, r.restCPU, restWait, r.idleAnon, r.idleFile, r.load)
}

// median takes each figure's median over rs on its own.
func median(rs []result) result {
	pick := func(f func(result) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	d := func(f func(result) time.Duration) time.Duration {
		return time.Duration(pick(func(r result) float64 { return float64(f(r)) }))
	}
	return result{
		startup:  d(func(r result) time.Duration { return r.startup }),
		fromExec: d(func(r result) time.Duration { return r.fromExec }),
		p50:      d(func(r result) time.Duration { return r.p50 }),
		p99:      d(func(r result) time.Duration { return r.p99 }),
		max:      d(func(r result) time.Duration { return r.max }),
		anon:     pick(func(r result) float64 { return r.anon }), file: pick(func(r result) float64 { return r.file }),
		idleAnon: pick(func(r result) float64 { return r.idleAnon }), idleFile: pick(func(r result) float64 { return r.idleFile }),
		restAnon: pick(func(r result) float64 { return r.restAnon }), restFile: pick(func(r result) float64 { return r.restFile }),
		restMax: pick(func(r result) float64 { return r.restMax }),
		restCPU: pick(func(r result) float64 { return r.restCPU }),
		load:    "-",
	}
}

// peersRound starts an idle weftd (for the memory baseline), then puts
// 5,000 leases into etcd and measures a second weftd: start to every route
// programmed, then 200 new leases one by one, each to its route.
func peersRound(b *testing.B, d daemon) result {
	const peers, probes = 5000, 200
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
	}()
	ctx := context.Background()
	var r result
	idle := c.AddNode("n0")
	d.waitReady(b, idle)
	time.Sleep(restWait) // let the idle daemon come to rest: a memory figure, not a synchronisation
	r.idleAnon, r.idleFile = rssOf(b, idle)
	idle.Stop()
	for i := range peers {
		k, v := fakeLease(i)
		if _, err := c.Client.Put(ctx, k, v); err != nil {
			b.Fatal(err)
		}
	}
	r.load = loadAvg()
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
	// Probe subnets lie far beyond the first free ones, where the node
	// took its own.
	lat := probeLatency(b, node, probes, func(i int) netip.Prefix {
		k, v := fakeLease(4*peers + i)
		want, _, _ := subnet.ParseKey(strings.TrimPrefix(k, e2e.Prefix+"/subnets/"))
		if _, err := c.Client.Put(ctx, k, v); err != nil {
			b.Fatal(err)
		}
		return want
	})
	r.p50, r.p99, r.max = lat[len(lat)/2], lat[len(lat)*99/100], lat[len(lat)-1]
	r.anon, r.file = rssOf(b, node)
	time.Sleep(restWait) // a memory figure at rest, not a synchronisation
	cpu0 := cpuOf(b, node)
	r.restAnon, r.restFile, r.restMax = rssOver(b, node, restSpan)
	r.restCPU = 100 * (cpuOf(b, node) - cpu0).Seconds() / restSpan.Seconds()
	if log, err := os.ReadFile(node.LogFile); err == nil && os.Getenv("WEFT_BENCH_LOG") != "" {
		for _, line := range strings.Split(string(log), "\n") {
			if strings.Contains(line, "synced peers") || strings.Contains(line, "resync") || strings.Contains(line, "lease") {
				fmt.Println(line)
			}
		}
	}
	return r
}

// restSpan is how long the memory and CPU at rest are sampled: longer than
// the period of weftd's full resync, whose garbage, code and CPU come and
// go, so that the figures are not read in a lucky moment between two.
const restSpan = kernel.DefaultResync + 2*time.Second

// rssOver samples n's RSS every 200 ms for span and returns the mean
// anonymous and file-backed parts and the most anon+file of any sample.
func rssOver(b *testing.B, n *e2e.Node, span time.Duration) (anon, file, most float64) {
	samples := 0
	for end := time.Now().Add(span); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		a, f := rssOf(b, n)
		anon, file, most, samples = anon+a, file+f, max(most, a+f), samples+1
	}
	return anon / float64(samples), file / float64(samples), most
}

// cpuOf is the CPU time n's process has used so far (user and system).
func cpuOf(b *testing.B, n *e2e.Node) time.Duration {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(n.PID()) + "/stat")
	if err != nil {
		b.Fatal(err)
	}
	// The fields after the command name, which is in parentheses.
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	if len(f) < 13 {
		b.Fatalf("short /proc/%d/stat", n.PID())
	}
	utime, _ := strconv.Atoi(f[11])
	stime, _ := strconv.Atoi(f[12])
	return time.Duration(utime+stime) * time.Second / 100 // USER_HZ
}

// restWait is how long after the last probe the memory at rest is read:
// weftd returns its free heap to the OS after a quiet interval (2 s).
const restWait = 5 * time.Second

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

// loadAvg is the machine's 1-minute load average, to print with a figure.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], "/")
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
