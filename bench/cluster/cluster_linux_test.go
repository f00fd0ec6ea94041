package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/testkit/benchreport"
	"github.com/weft-net/weft/internal/testkit/kubecluster"
	"github.com/weft-net/weft/internal/testkit/kubetest"
	"github.com/weft-net/weft/test/e2e"
)

// The paths a test is run on: to the server pod's address, and to the
// ClusterIP Service in front of it (kube-proxy's NAT). The bare column has
// only the first, between the node namespaces' underlay addresses.
const (
	toPod     = "pod→pod"
	toService = "pod→Service"
)

var paths = []string{toPod, toService}

// column is one cluster (or the bare underlay) and its figures.
type column struct {
	label  string
	bare   bool
	s      *kubecluster.State
	nodeCG [2]string         // the server's and the client's node cgroups
	cniNS  string            // kube-weft or kube-flannel
	cniCG  []string          // the CNI's DaemonSet pods' cgroups
	addrs  map[string]string // path → address the client reaches
	client func(ctx context.Context, tool string, args []string) *exec.Cmd
	got    map[string][]measurement // by path + "/" + test name
	rest   []atRest
	failed []string // tests that failed twice: "round N path test"
}

// clusterColumn deploys the bench's pods on the cluster in dir.
func clusterColumn(b *testing.B, ctx context.Context, label, dir, kubeBin, tmp, rrArchive, rrRef string) *column {
	s, err := kubecluster.LoadState(dir)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := undeploy(s, kubeBin); err != nil {
			b.Errorf("%s: %v", label, err)
		}
	})
	podIP, svcIP, err := deploy(ctx, s, kubeBin, tmp, rrArchive, rrRef)
	if err != nil {
		b.Fatalf("%s: %v", label, err)
	}
	ns, cgs, err := cniPods(ctx, s, kubeBin)
	if err != nil {
		b.Fatalf("%s: %v", label, err)
	}
	c := &column{label: label, s: s, nodeCG: [2]string{s.Nodes[0].Cgroup, s.Nodes[1].Cgroup},
		cniNS: ns, cniCG: cgs, addrs: map[string]string{toPod: podIP, toService: svcIP}, got: map[string][]measurement{}}
	c.client = func(ctx context.Context, tool string, args []string) *exec.Cmd {
		argv := []string{"--kubeconfig", s.Kubeconfig, "-n", benchNS, "exec", "cli", "-c", tool, "--"}
		if tool == "rr" {
			argv = append(argv, "/rr")
		} else {
			argv = append(argv, tool)
		}
		return exec.CommandContext(ctx, filepath.Join(kubeBin, "kubectl"), append(argv, args...)...)
	}
	return c
}

// inNode is argv run in node n's network namespace with its process in the
// node's cgroup (so that the node's CPU counts it, as it counts a pod's).
func inNode(ctx context.Context, n kubecluster.Node, argv ...string) *exec.Cmd {
	netns := n.NetNS
	if !filepath.IsAbs(netns) {
		netns = filepath.Join("/run/netns", netns)
	}
	script := fmt.Sprintf(`echo $$ > %s/cgroup.procs && echo $$ > %s/cgroup.procs && exec nsenter --net=%s -- "$@"`,
		filepath.Join(cpuacct, n.Cgroup), filepath.Join(cpuCG, n.Cgroup), netns)
	if ctx == nil {
		return exec.Command("sh", append([]string{"-c", script, "sh"}, argv...)...)
	}
	return exec.CommandContext(ctx, "sh", append([]string{"-c", script, "sh"}, argv...)...)
}

// bareColumn runs the same tools between the node namespaces of the
// cluster in dir, over its underlay: the limit every column shares.
func bareColumn(b *testing.B, dir, rrBin string) *column {
	s, err := kubecluster.LoadState(dir)
	if err != nil {
		b.Fatal(err)
	}
	iperf3, err := exec.LookPath("iperf3")
	if err != nil {
		b.Fatal("the bare column runs the machine's iperf3 (Debian's, as the image's): ", err)
	}
	srv, cli := s.Nodes[0], s.Nodes[1]
	for _, argv := range [][]string{{iperf3, "-s"}, {rrBin, "server", "-addr", fmt.Sprintf(":%d", rrPort)}} {
		cmd := inNode(nil, srv, argv...)
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	}
	time.Sleep(time.Second) // the servers listen
	c := &column{label: "bare underlay", bare: true, s: s, nodeCG: [2]string{srv.Cgroup, cli.Cgroup},
		addrs: map[string]string{toPod: srv.IP}, got: map[string][]measurement{}}
	c.client = func(ctx context.Context, tool string, args []string) *exec.Cmd {
		if tool == "rr" {
			return inNode(ctx, cli, append([]string{rrBin}, args...)...)
		}
		return inNode(ctx, cli, append([]string{iperf3}, args...)...)
	}
	return c
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// BenchmarkCluster runs one round per iteration over every column of
// WEFT_BENCH_CLUSTERS ("label=state-dir,…", clusters up.sh brought up with
// at least 2 nodes) and the bare underlay of the first: the CNI pods at
// rest, then each test on each path, the columns taking turns test by test
// (the order rotating from round to round).
func BenchmarkCluster(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Fatal("bench/cluster needs root (node namespaces and cgroups)")
	}
	spec := os.Getenv("WEFT_BENCH_CLUSTERS")
	if spec == "" {
		b.Fatal("WEFT_BENCH_CLUSTERS names no cluster: label=state-dir,… (test/cluster/up.sh -nodes 2 with WEFT_CLUSTER_NAME and WEFT_CLUSTER_DIR)")
	}
	if _, err := os.Stat(iperfArchive()); err != nil {
		b.Fatalf("no iperf3 image: %v (test/cluster/images.sh iperf3 builds it)", err)
	}
	secs, restSecs := envInt("WEFT_BENCH_SECONDS", 8), envInt("WEFT_BENCH_REST_SECONDS", 20)
	perf := perfDir(b)
	if perf != "" && benchreport.Path(e2e.ModuleRootDir(b)) != "" {
		b.Fatal("WEFT_BENCH_PERF with WEFT_BENCH_REPORT: perf's sampling costs every column, so a profile run writes no report")
	}
	root := e2e.ModuleRootDir(b)
	kubeBin, err := kubetest.BinDir()
	if err != nil {
		b.Fatal(err)
	}
	tmp := b.TempDir()
	rrBin, rrArchive, rrRef, err := buildRR(root, tmp)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Hour)
	defer cancel()
	var cols []*column
	for i, item := range strings.Split(spec, ",") {
		label, dir, ok := strings.Cut(item, "=")
		if !ok {
			b.Fatalf("WEFT_BENCH_CLUSTERS: %q is not label=state-dir", item)
		}
		if i == 0 {
			cols = append(cols, bareColumn(b, dir, rrBin))
		}
		cols = append(cols, clusterColumn(b, ctx, label, dir, kubeBin, tmp, rrArchive, rrRef))
	}
	cni := cols[1:]
	for i := 0; b.Loop(); i++ {
		rest, err := restWindow(ctx, cni, time.Duration(restSecs)*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		for c, r := range rest {
			r.round = i + 1
			c.rest = append(c.rest, r)
			fmt.Printf("round %d %s at rest: %s cpu=%.1fm mem=%.1fMiB (shmem %.1f) load=%s\n", i+1, c.label, c.cniNS, r.cpu, r.mem, r.shmem, benchreport.LoadAvg(" "))
		}
		round(b, ctx, cols, i, secs, perf)
	}
	report(b, cols, secs, restSecs)
}

// round runs every test on every path once per column, recording a
// profile of each into perf when it names a directory.
func round(b *testing.B, ctx context.Context, cols []*column, i, secs int, perf string) {
	for _, p := range paths {
		for _, t := range tests {
			for k := range cols {
				c := cols[(k+i)%len(cols)]
				addr, ok := c.addrs[p]
				if !ok {
					continue
				}
				prof := profilePath(perf, c.label, p, t.name, i+1)
				m, err := c.run(ctx, t, addr, secs, prof)
				if err != nil {
					// One failed test (an iperf3 server that gave up under
					// a UDP flood, say) is tried once more, then left out
					// of the medians and counted in the report.
					fmt.Printf("round %d %s %s %s: failed, trying again: %v\n", i+1, c.label, p, t.name, err)
					time.Sleep(10 * time.Second) // a restarted container is back
					if m, err = c.run(ctx, t, addr, secs, prof); err != nil {
						fmt.Printf("round %d %s %s %s: failed: %v\n", i+1, c.label, p, t.name, err)
						c.failed = append(c.failed, fmt.Sprintf("round %d %s %s", i+1, p, t.name))
						continue
					}
				}
				m.round = i + 1
				c.got[p+"/"+t.name] = append(c.got[p+"/"+t.name], m)
				fmt.Printf("round %d %s %s %s: %s\n", i+1, c.label, p, t.name, m)
			}
		}
	}
}

// perfDir is WEFT_BENCH_PERF as an absolute path, created when missing,
// or "" when it is not set; it fails b when perf cannot run.
func perfDir(b *testing.B) string {
	dir := os.Getenv("WEFT_BENCH_PERF")
	if dir == "" {
		return ""
	}
	if _, err := exec.LookPath("perf"); err != nil {
		b.Fatalf("WEFT_BENCH_PERF: %v", err)
	}
	dir, err := filepath.Abs(dir)
	if err == nil {
		err = os.MkdirAll(dir, 0o755)
	}
	if err != nil {
		b.Fatalf("WEFT_BENCH_PERF: %v", err)
	}
	return dir
}

// profilePath is the file in dir perf records a test's CPU window into,
// <label>-<path>-<test>-r<round>.data with the spaces and arrows of the
// names as dashes; "" when dir is.
func profilePath(dir, label, path, test string, round int) string {
	if dir == "" {
		return ""
	}
	name := strings.NewReplacer(" ", "-", "→", "-to-").Replace(fmt.Sprintf("%s-%s-%s-r%d.data", label, path, test, round))
	return filepath.Join(dir, name)
}

func (m measurement) String() string {
	var b strings.Builder
	if m.rate > 0 {
		fmt.Fprintf(&b, "rate=%.0f/s p50=%.0fµs p99=%.0fµs", m.rate, m.p50, m.p99)
	} else {
		fmt.Fprintf(&b, "%.2f Gb/s loss=%.2f%% retrans=%.0f/s", m.gbps, m.lossPct, m.retrans)
	}
	fmt.Fprintf(&b, " cpu server node=%.2f client node=%.2f s/s load=%s", m.cpuSrv, m.cpuCli, m.load)
	return b.String()
}
