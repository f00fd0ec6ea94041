package e2e

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/testkit/benchreport"
	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/internal/testkit/plugintest"
)

// flanneldBinary is the real flanneld that test/setup.sh builds, named by
// WEFT_FLANNELD (test/run.sh sets it).
func flanneldBinary(t *testing.T) string {
	t.Helper()
	p := os.Getenv("WEFT_FLANNELD")
	if p == "" {
		nettest.CannotRun(t, nettest.SkipTools, "WEFT_FLANNELD is not set: run the tests through test/run.sh, whose setup builds flanneld")
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("WEFT_FLANNELD: %v", err)
	}
	return p
}

// migration is the two-node cluster of TestMigrateNodeFromFlannelAndBack.
type migration struct {
	c        *Cluster
	a, b     *Node
	fa, fb   *plugintest.FlannelNode
	flanneld string // the real one
	asWeft   string // weftd installed as flanneld
	report   []switchReport
}

// switchReport is the ping loss seen across one switch of node a.
type switchReport struct {
	name  string
	took  time.Duration // from stopping the old daemon to a's routes on the new device
	aToB  []PingResult
	bToA  []PingResult
	notes []string
}

// flanneldArgs is the command line of both daemons on n: Flannel's
// defaults but for where etcd is, the underlay device and the subnet
// file (each node's own, inside the test's directory).
func (m *migration) flanneldArgs(n *Node) []string {
	return []string{"--etcd-endpoints=" + m.c.Endpoints(), "--etcd-prefix=" + Prefix,
		"--iface=eth0", "--subnet-file=" + n.SubnetFile}
}

// waitRoutes waits until n routes every other node's subnet through dev
// (flannel.1 or weft.1) and returns how long that took.
func (m *migration) waitRoutes(n *Node, dev string) time.Duration {
	m.c.T.Helper()
	return Eventually(m.c.T, 30*time.Second, fmt.Sprintf("%s routes its peers through %s", n.Label, dev), func() error {
		for _, peer := range m.c.Nodes {
			if peer == n {
				continue
			}
			if _, err := os.Stat(peer.SubnetFile); err != nil {
				return err
			}
			out, err := n.Run("ip", "route", "show", peer.Subnet().String())
			if err != nil {
				return err
			}
			if !strings.Contains(out, "dev "+dev) {
				return fmt.Errorf("route to %s: %q", peer.Subnet(), strings.TrimSpace(out))
			}
		}
		return nil
	})
}

// TestMigrateNodeFromFlannelAndBack (issue 29) moves a running node from
// Flannel to weft and back, as the README's migration section tells a
// user to: two nodes, a and b, run the real flanneld (vxlan, Flannel's
// defaults) with kube-flannel.yml's conflist wired by Flannel's chain; a
// has five pods, b one. While every pod of a pings b's pod every 10 ms
// (and b's pod one of a's), a is switched to weftd installed as flanneld
// with the same flags and to weft's plugin installed as "flannel" with the
// same conflist; five more pods are wired, no address twice, and all
// reach b. weft's DEL of a pod Flannel wired frees its address in
// host-local's store. Then a is switched back to flanneld and Flannel's
// chain, and five more pods are wired: still no address twice, and every
// pod reaches b. The ping loss at each switch is logged, and written to
// the report named by WEFT_MIGRATION_REPORT; it is not asserted.
func TestMigrateNodeFromFlannelAndBack(t *testing.T) {
	m := &migration{flanneld: flanneldBinary(t)}
	m.c = NewCluster(t, Options{Nodes: 0})
	m.asWeft = filepath.Join(m.c.Dir, "bin", "flanneld")
	if err := os.MkdirAll(filepath.Dir(m.asWeft), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(m.c.weftd, m.asWeft); err != nil {
		t.Fatal(err)
	}
	m.c.OnNode = func(n *Node) {
		n.Prog, n.OwnArgs, n.Args = m.flanneld, true, m.flanneldArgs(n)
		n.LogFile = strings.TrimSuffix(n.LogFile, "weftd.log") + "daemon.log"
	}
	m.a, m.b = m.c.AddNode("a"), m.c.AddNode("b")
	m.waitRoutes(m.a, "flannel.1")
	m.waitRoutes(m.b, "flannel.1")
	if out, err := exec.Command(m.flanneld, "--version").CombinedOutput(); err == nil {
		t.Logf("flanneld %s", strings.TrimSpace(string(out)))
	}

	weft := nettest.Binary(t, "weft")
	m.fa = plugintest.NewFlannelNode(t, m.a.NS, weft, m.a.SubnetFile, "")
	m.fb = plugintest.NewFlannelNode(t, m.b.NS, weft, m.b.SubnetFile, "")
	old := m.fa.AddPods(t, m.fa.Flannel(t), "a-flannel", 5)
	bpod := m.fb.AddPods(t, m.fb.Flannel(t), "b-flannel", 1)[0]
	m.fa.CheckStore(t, old)
	m.reach(old, bpod)

	// Flannel → weft.
	live := old
	before, _ := m.c.lease(t, m.a.Subnet())
	r := m.startPings("flannel → weft", live, bpod, old[0])
	m.toWeft()
	after, _ := m.c.lease(t, m.a.Subnet())
	r.rep.notes = append(r.rep.notes, fmt.Sprintf("a's lease kept its subnet %s; its VtepMAC was %s under flanneld, %s under weftd", m.a.Subnet(), before.BackendData.VtepMAC, after.BackendData.VtepMAC))
	fresh := m.fa.AddPods(t, m.fa.Weft, "a-weft", 5)
	live = slices.Concat(live, fresh)
	m.fa.CheckStore(t, live)
	m.reach(fresh, bpod)
	m.stopPings(r)
	m.reach(live, bpod)

	gone := old[0]
	if err := m.fa.Weft.Del(gone); err != nil {
		t.Fatalf("weft's DEL of %s, which Flannel's chain wired: %v", gone.ID, err)
	}
	if _, err := os.Stat(filepath.Join(m.fa.Store, gone.IP.String())); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("host-local's reservation of %s (%s) after weft's DEL: %v", gone.IP, gone.ID, err)
	}
	live = slices.DeleteFunc(live, func(p *plugintest.Pod) bool { return p == gone })
	m.fa.CheckStore(t, live)

	// weft → Flannel.
	r = m.startPings("weft → flannel", live, bpod, old[1])
	m.toFlannel()
	again := m.fa.AddPods(t, m.fa.Flannel(t), "a-again", 5)
	live = slices.Concat(live, again)
	m.fa.CheckStore(t, live)
	m.stopPings(r)
	m.reach(live, bpod)

	m.writeReport()
}

// reach checks that every pod reaches dst and dst every pod, with one
// ping each way.
func (m *migration) reach(pods []*plugintest.Pod, dst *plugintest.Pod) {
	m.c.T.Helper()
	for _, p := range pods {
		if err := Ping(p.NS, dst.IP); err != nil {
			m.c.T.Errorf("%s (%s) → %s (%s): %v", p.ID, p.IP, dst.ID, dst.IP, err)
		}
		if err := Ping(dst.NS, p.IP); err != nil {
			m.c.T.Errorf("%s (%s) → %s (%s): %v", dst.ID, dst.IP, p.ID, p.IP, err)
		}
	}
	if m.c.T.Failed() {
		m.c.T.FailNow()
	}
}

// pingRun is the streams of one switch.
type pingRun struct {
	rep        *switchReport
	aToB, bToA []*PingStream
}

// startPings starts a stream from every pod of a to dst (b's pod) and one
// from dst to back (a pod of a), and lets them run a moment before the
// switch.
func (m *migration) startPings(name string, pods []*plugintest.Pod, dst, back *plugintest.Pod) *pingRun {
	m.c.T.Helper()
	m.report = append(m.report, switchReport{name: name})
	r := &pingRun{rep: &m.report[len(m.report)-1]}
	for _, p := range pods {
		r.aToB = append(r.aToB, StartPing(m.c.T, p.ID+" → "+dst.ID, p.NS, dst.IP))
	}
	r.bToA = append(r.bToA, StartPing(m.c.T, dst.ID+" → "+back.ID, dst.NS, back.IP))
	time.Sleep(500 * time.Millisecond)
	return r
}

// stopPings lets the streams run a second more, stops them and logs and
// records what each lost. Each stream must have been answered again by
// its end: traffic works after the switch.
func (m *migration) stopPings(r *pingRun) {
	t := m.c.T
	t.Helper()
	time.Sleep(time.Second)
	for _, dir := range []struct {
		streams []*PingStream
		into    *[]PingResult
	}{{r.aToB, &r.rep.aToB}, {r.bToA, &r.rep.bToA}} {
		for _, s := range dir.streams {
			res, err := s.Stop()
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: %s", r.rep.name, res)
			// A second of pings at 10 ms is 100; a stream whose last
			// answer is older than a fifth of that did not recover.
			if res.Tail > 20 {
				t.Errorf("%s: %s: the last %d requests went unanswered", r.rep.name, s.Label, res.Tail)
			}
			*dir.into = append(*dir.into, res)
		}
	}
}

// toWeft switches a from flanneld to weftd installed as flanneld, with
// the same command line; the pods that come next are wired by weft's
// plugin installed as "flannel" (m.fa.Weft), with the same conflist.
func (m *migration) toWeft() {
	t := m.c.T
	t.Helper()
	rep := &m.report[len(m.report)-1]
	start := time.Now()
	m.a.Stop() // SIGTERM to flanneld, by its PID
	m.a.Prog = m.asWeft
	m.a.Start()
	m.waitRoutes(m.a, "weft.1")
	rep.took = time.Since(start)
	if log, _ := os.ReadFile(m.a.LogFile); !strings.Contains(string(log), "flannelCompat=true") {
		t.Errorf("weftd did not run as flanneld:\n%s", tail(string(log), 20))
	}
	if out, err := m.a.Run("ip", "link", "show", "flannel.1"); err == nil {
		t.Errorf("flannel.1 is still there after weftd took the VXLAN port:\n%s", out)
	} else {
		rep.notes = append(rep.notes, "flannel.1 removed by weftd")
	}
	// weftd removes flanneld's chains and tables once it has written its
	// own rules, right after its first pass.
	deadline := time.Now().Add(10 * time.Second)
	left := m.leftovers("FLANNEL")
	for len(left) > 0 && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
		left = m.leftovers("FLANNEL")
	}
	if len(left) > 0 {
		t.Errorf("flanneld's rules left after weftd took over: %v", left)
	} else {
		rep.notes = append(rep.notes, "flanneld's FLANNEL-* chains removed by weftd")
	}
}

// removeWeftRules is step 3 of the README's way back to Flannel: weft's
// masquerade tables, policy tables, VXLAN port filter and forward chain,
// which flanneld leaves alone.
const removeWeftRules = `nft delete table ip weft-ipv4; nft delete table ip6 weft-ipv6
nft delete table inet weft-policy; nft delete table bridge weft-policy
nft delete table inet weft-vxlan; nft delete table inet weft-hostgw
unweft() { $1 -D FORWARD -j WEFT-FWD; $1 -F WEFT-FWD; $1 -X WEFT-FWD; }
nft list table ip filter >/dev/null 2>&1 && unweft iptables-nft
nft list table ip6 filter >/dev/null 2>&1 && unweft ip6tables-nft
grep -qx filter /proc/net/ip_tables_names && unweft iptables-legacy
grep -qx filter /proc/net/ip6_tables_names && unweft ip6tables-legacy
true`

// toFlannel switches a back: weftd stopped, weft.1 deleted, flanneld
// started with the same command line; the pods that come next are wired
// by Flannel's chain. flanneld does not remove weft.1, and fails to start
// while it holds the VXLAN port: that is checked first (the routes through
// weft.1 still carry the traffic then).
func (m *migration) toFlannel() {
	t := m.c.T
	t.Helper()
	rep := &m.report[len(m.report)-1]
	m.a.Stop() // SIGTERM to weftd, by its PID
	m.a.Prog = m.flanneld
	if why := m.flanneldBesideWeft(); why != "" {
		rep.notes = append(rep.notes, why)
	}
	rep.notes = append(rep.notes, m.leftovers("WEFT")...)
	start := time.Now()
	nettest.MustRun(t, m.a, "ip", "link", "delete", "weft.1")
	legacyBefore, _ := m.a.Run("cat", "/proc/net/ip_tables_names", "/proc/net/ip6_tables_names")
	if out, err := m.a.Run("sh", "-c", removeWeftRules); err != nil {
		t.Fatalf("removing weft's rules: %v\n%s", err, out)
	}
	if after, _ := m.a.Run("cat", "/proc/net/ip_tables_names", "/proc/net/ip6_tables_names"); after != legacyBefore {
		t.Errorf("the README's step 3 created iptables-legacy tables: %q, before %q", after, legacyBefore)
	}
	for _, n := range m.leftovers("WEFT") {
		// The plugin's own masquerade table stays while weft's pods run.
		if !strings.Contains(n, "weft-cni") {
			t.Errorf("after the README's step 3: %s", n)
		}
	}
	m.a.Start()
	m.waitRoutes(m.a, "flannel.1")
	rep.took = time.Since(start)
}

// flanneldBesideWeft starts flanneld on a while weft.1 is there and
// returns why it exited; if it keeps running, it is stopped again and the
// test fails: the README's step that deletes weft.1 would be needless.
func (m *migration) flanneldBesideWeft() string {
	t := m.c.T
	t.Helper()
	m.a.Start()
	select {
	case err := <-m.a.done:
		m.a.cmd = nil
		log, _ := os.ReadFile(m.a.LogFile)
		line := findLine(string(log[max(0, len(log)-4096):]), "Error registering network")
		if line == "" {
			t.Fatalf("flanneld beside weft.1 exited (%v) for another reason:\n%s", err, tail(string(log), 20))
		}
		return "flanneld does not start while weft.1 holds the VXLAN port (" + line[strings.Index(line, "Error"):] + "): weft.1 deleted by hand"
	case <-time.After(5 * time.Second):
		m.a.Stop()
		t.Errorf("flanneld started beside weft.1: the step that deletes weft.1 is needless")
		return ""
	}
}

// leftovers lists, as notes, what the other side left on a: iptables
// chains named prefix*, nftables tables whose name holds prefix.
func (m *migration) leftovers(prefix string) []string {
	t := m.c.T
	t.Helper()
	var notes []string
	for _, save := range []string{"iptables-save", "iptables-legacy-save"} {
		out, err := m.a.Run(save)
		if err != nil {
			continue
		}
		var chains []string
		for l := range strings.Lines(out) {
			if strings.HasPrefix(l, ":"+prefix) {
				chains = append(chains, strings.Fields(l[1:])[0])
			}
		}
		if len(chains) > 0 {
			notes = append(notes, fmt.Sprintf("still there: iptables chains %s (%s)", strings.Join(chains, ", "), save))
		}
	}
	out, _ := m.a.Run("nft", "list", "tables")
	for l := range strings.Lines(out) {
		if strings.Contains(strings.ToLower(l), strings.ToLower(prefix)) {
			notes = append(notes, "still there: nftables "+strings.TrimSpace(l))
		}
	}
	for _, n := range notes {
		t.Log(n)
	}
	return notes
}

// writeReport writes the report to WEFT_MIGRATION_REPORT, if set.
func (m *migration) writeReport() {
	t := m.c.T
	path := os.Getenv("WEFT_MIGRATION_REPORT")
	if path == "" {
		return
	}
	if !filepath.IsAbs(path) { // go test runs in the package's directory
		path = filepath.Join(ModuleRootDir(t), path)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# Moving a running node from Flannel to weft and back: ping loss\n\n")
	root := ModuleRootDir(t)
	st := benchreport.NewStamp(root, "migration", "WEFT_MIGRATION_REPORT=docs/migration-report.md go test -count=1 -run TestMigrateNodeFromFlannelAndBack ./test/e2e",
		"cmd/weftd", "cmd/weft", "internal/daemon", "subnet", "backend/vxlan", "backend/kernel", "plugin")
	stamp, err := st.Markdown(root)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(&b, "%s\nWritten by `TestMigrateNodeFromFlannelAndBack` (test/e2e/migrate_test.go)", stamp)
	if out, err := exec.Command(m.flanneld, "--version").CombinedOutput(); err == nil {
		fmt.Fprintf(&b, ", flanneld %s", strings.TrimSpace(string(out)))
	}
	if load, err := os.ReadFile("/proc/loadavg"); err == nil {
		fmt.Fprintf(&b, ", load %s", strings.Join(strings.Fields(string(load))[:3], " "))
	}
	fmt.Fprintf(&b, ", after `sudo test/setup.sh`:\n\n    . test/versions.env\n"+
		"    sudo WEFT_CNI_BIN=$WEFT_CACHE/cni-plugins-$CNI_PLUGINS_VERSION WEFT_FLANNELD=$WEFT_CACHE/flanneld-$FLANNEL_VERSION/flanneld \\\n"+
		"      WEFT_MIGRATION_REPORT=docs/migration-report.md go test -count=1 -run TestMigrateNodeFromFlannelAndBack ./test/e2e\n\n")
	fmt.Fprintf(&b, "Two nodes in network namespaces on a veth underlay, real etcd, real flanneld on node b throughout. "+
		"Pings every %s from each pod of node a to b's pod, and from b's pod to one pod of a, while a switches daemon and CNI plugin. "+
		"Lost pings × %s is the outage, with a verdict for each switch below the table. Lost pings do not tell the whole outage: requests sent while a route was missing may wait in a neighbour queue and be answered late, so the longest silence between two replies is given too. Switch time: from stopping flanneld (to weft) or deleting weft.1 (back to Flannel) to a's routes through the new device.\n\n", PingInterval, PingInterval)
	fmt.Fprintf(&b, "| switch | switch time | a → b: lost pings of each pod's stream | a → b: worst loss × %s, longest silence | b → a: lost pings | b → a: loss × %s, longest silence |\n|---|---|---|---|---|---|\n", PingInterval, PingInterval)
	for _, r := range m.report {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s |\n", r.name, r.took.Round(time.Millisecond),
			lostList(r.aToB), worst(r.aToB), lostList(r.bToA), worst(r.bToA))
	}
	fmt.Fprintln(&b)
	for _, v := range migrationVerdicts(m.report) {
		fmt.Fprintf(&b, "- %s\n", v)
	}
	fmt.Fprintf(&b, "\nWhat each switch found on node a:\n\n")
	for _, r := range m.report {
		notes := r.notes
		if len(notes) == 0 {
			notes = []string{"nothing"}
		}
		fmt.Fprintf(&b, "- %s: %s\n", r.name, strings.Join(notes, "; "))
	}
	fmt.Fprintf(&b, "\nEach switch is also checked, not only measured: every stream answered again by its end, every pod reaches b's pod and back, no address held twice.\n")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Errorf("write the report: %v", err)
	}
}

func lostList(rs []PingResult) string {
	var l []string
	for _, r := range rs {
		l = append(l, fmt.Sprint(r.Lost))
	}
	return strings.Join(l, ", ")
}

// migrationVerdicts is a verdict for each switch on the goal of an outage
// (the worst stream's lost pings × the interval, either way) under 1 s.
func migrationVerdicts(rs []switchReport) []string {
	var goals []benchreport.Goal
	got := map[string]float64{}
	for _, r := range rs {
		g := benchreport.Goal{Name: r.name + ": outage, the worst stream's lost pings × " + PingInterval.String(), AtMost: true, Bound: 1000, Unit: "ms"}
		goals = append(goals, g)
		var outage time.Duration
		for _, p := range append(slices.Clone(r.aToB), r.bToA...) {
			outage = max(outage, p.Outage())
		}
		got[g.Name] = float64(outage.Milliseconds())
	}
	return benchreport.Verdicts(goals, got)
}

// worst is the largest loss and the longest silence of rs.
func worst(rs []PingResult) string {
	var w PingResult
	for _, r := range rs {
		w.Lost, w.Silence = max(w.Lost, r.Lost), max(w.Silence, r.Silence)
	}
	return fmt.Sprintf("%s, %s", w.Outage(), w.Silence.Round(time.Millisecond))
}
