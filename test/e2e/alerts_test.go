package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"sigs.k8s.io/yaml"

	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/subnet"
)

// The alerting rules shipped beside the manifests, and their promtool tests.
const (
	rulesFile     = "kube-manifests/alerts/weft-rules.yaml"
	rulesTestFile = "kube-manifests/alerts/weft-rules.test.yaml"
	operatorFile  = "kube-manifests/alerts/weft-prometheusrule.yaml"
)

func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		nettest.CannotRun(t, nettest.SkipTools, "promtool not installed (test/setup.sh installs Debian's prometheus package)")
	}
	return p
}

func runPromtool(t *testing.T, dir string, args ...string) {
	t.Helper()
	cmd := exec.Command(promtool(t), args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// TestAlertRules: the rules file passes promtool check rules and its unit
// tests, and the PrometheusRule holds exactly its groups.
func TestAlertRules(t *testing.T) {
	root := ModuleRootDir(t)
	runPromtool(t, root, "check", "rules", rulesFile)
	runPromtool(t, filepath.Dir(filepath.Join(root, rulesTestFile)), "test", "rules", filepath.Base(rulesTestFile))

	var plain struct {
		Groups any `json:"groups"`
	}
	var op struct {
		APIVersion string         `json:"apiVersion"`
		Kind       string         `json:"kind"`
		Metadata   map[string]any `json:"metadata"`
		Spec       struct {
			Groups any `json:"groups"`
		} `json:"spec"`
	}
	for f, v := range map[string]any{rulesFile: &plain, operatorFile: &op} {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.UnmarshalStrict(b, v); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
	}
	if op.Kind != "PrometheusRule" || plain.Groups == nil {
		t.Fatalf("%s: kind %q; %s: groups %v", operatorFile, op.Kind, rulesFile, plain.Groups)
	}
	if a, b := fmt.Sprint(plain.Groups), fmt.Sprint(op.Spec.Groups); a != b {
		t.Errorf("%s's groups differ from %s's:\n%s\n%s", operatorFile, rulesFile, b, a)
	}
}

// scraper scrapes the weft_* metrics of some nodes once a second and keeps
// every sample, as Prometheus would, plus up (1 when the scrape answered).
type scraper struct {
	mu    sync.Mutex
	ticks int
	// series (promtool notation, with instance and job) → value at each tick
	samples map[string]map[int]float64
	// metric name → label name → values seen, for the name check
	seen map[string]map[string]map[string]bool
}

func (s *scraper) run(ctx context.Context, nodes []*Node) {
	tk := time.NewTicker(time.Second)
	defer tk.Stop()
	for {
		var wg sync.WaitGroup
		got := make([]map[string]*modelFamily, len(nodes))
		for i, n := range nodes {
			wg.Go(func() { got[i] = scrapeWeft(n) })
		}
		wg.Wait()
		s.mu.Lock()
		for i, n := range nodes {
			up := 0.0
			if got[i] != nil {
				up = 1
			}
			s.add(fmt.Sprintf(`up{instance=%q,job="weft"}`, n.Label), up)
			for name, fam := range got[i] {
				for _, m := range fam.metrics {
					labels := map[string]string{"instance": n.Label, "job": "weft"}
					for k, v := range m.labels {
						labels[k] = v
						s.see(name, k, v)
					}
					s.see(name, "", "")
					s.add(seriesString(name, labels), m.value)
				}
			}
		}
		s.ticks++
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-tk.C:
		}
	}
}

func (s *scraper) add(series string, v float64) {
	if s.samples[series] == nil {
		s.samples[series] = map[int]float64{}
	}
	s.samples[series][s.ticks] = v
}

func (s *scraper) see(name, label, value string) {
	if s.seen[name] == nil {
		s.seen[name] = map[string]map[string]bool{}
	}
	if s.seen[name][label] == nil {
		s.seen[name][label] = map[string]bool{}
	}
	s.seen[name][label][value] = true
}

// tick is the index of the last scrape so far: a time in the promtool
// test, where each scrape counts as one minute.
func (s *scraper) tick() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ticks - 1
}

// waitTicks waits until n more scrapes are done.
func (s *scraper) waitTicks(n int) int {
	end := s.tick() + n
	for s.tick() < end {
		time.Sleep(100 * time.Millisecond)
	}
	return end
}

type modelFamily struct {
	metrics []modelSample
}

type modelSample struct {
	labels map[string]string
	value  float64
}

// scrapeWeft returns the weft_* counters and gauges of n's /metrics, nil
// when it does not answer.
func scrapeWeft(n *Node) map[string]*modelFamily {
	code, body, err := n.HTTPGet("http://127.0.0.1:9470/metrics")
	if err != nil || code != 200 {
		return nil
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		return nil
	}
	out := map[string]*modelFamily{}
	for name, fam := range fams {
		if !strings.HasPrefix(name, "weft_") {
			continue
		}
		f := &modelFamily{}
		for _, m := range fam.GetMetric() {
			var v float64
			switch {
			case m.Counter != nil:
				v = m.GetCounter().GetValue()
			case m.Gauge != nil:
				v = m.GetGauge().GetValue()
			default:
				continue // histograms: no rule reads them
			}
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			f.metrics = append(f.metrics, modelSample{l, v})
		}
		out[name] = f
	}
	return out
}

func seriesString(name string, labels map[string]string) string {
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%s=%q", k, labels[k])
	}
	return name + "{" + b.String() + "}"
}

// promtoolTest writes a promtool test file that feeds every scraped sample,
// one scrape a minute, and expects each alert firing at its time.
func (s *scraper) promtoolTest(rules string, checks []alertCheck) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "rule_files: [%q]\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n", rules)
	names := make([]string, 0, len(s.samples))
	for k := range s.samples {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, name := range names {
		vals := make([]string, s.ticks)
		for i := range vals {
			if v, ok := s.samples[name][i]; ok {
				vals[i] = strconv.FormatFloat(v, 'g', -1, 64)
			} else {
				vals[i] = "_"
			}
		}
		fmt.Fprintf(&b, "      - series: '%s'\n        values: '%s'\n", name, strings.Join(vals, " "))
	}
	b.WriteString("    promql_expr_test:\n")
	for _, c := range checks {
		if c.alert == "" { // nothing firing
			fmt.Fprintf(&b, "      - expr: ALERTS{alertstate=\"firing\"}\n        eval_time: %dm\n", c.tick)
			continue
		}
		fmt.Fprintf(&b, "      - expr: 'max by (alertname, instance) (ALERTS{alertstate=\"firing\",alertname=%q,instance=%q})'\n", c.alert, c.instance)
		fmt.Fprintf(&b, "        eval_time: %dm\n        exp_samples:\n          - labels: '{alertname=%q,instance=%q}'\n            value: 1\n", c.tick, c.alert, c.instance)
	}
	return b.String()
}

// alertCheck: alert fires for instance at scrape tick (alert empty: no
// alert fires at all then).
type alertCheck struct {
	alert, instance string
	tick            int
	cause           string
}

var (
	selectorRE = regexp.MustCompile(`(weft_[a-z_]+)(\{([^}]*)\})?`)
	matcherRE  = regexp.MustCompile(`([a-z_]+)\s*(=~|=)\s*"([^"]*)"`)
)

// checkRuleNames checks that every weft_ metric the rules read, and every
// label value they match on one, is in what the nodes served.
func (s *scraper) checkRuleNames(t *testing.T, rules string) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, m := range selectorRE.FindAllStringSubmatch(rules, -1) {
		name := m[1]
		if s.seen[name] == nil {
			t.Errorf("the rules read %s, which no weftd served", name)
			continue
		}
		n++
		for _, lm := range matcherRE.FindAllStringSubmatch(m[3], -1) {
			vals := []string{lm[3]}
			if lm[2] == "=~" {
				vals = strings.Split(lm[3], "|")
			}
			for _, v := range vals {
				if !s.seen[name][lm[1]][v] {
					t.Errorf("the rules match %s{%s=%q}, which no weftd served (it served %v)", name, lm[1], v, slices.Sorted(mapKeys(s.seen[name][lm[1]])))
				}
			}
		}
	}
	if n < 10 {
		t.Errorf("found only %d metric selectors in the rules", n)
	}
}

func mapKeys(m map[string]bool) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// TestAlertsFireOnProvokedCauses runs three weftd nodes, scrapes their
// /metrics every second from the start, provokes the cause of each alert
// in turn, and then has promtool evaluate the shipped rules over exactly
// the scraped samples (each scrape counted as one minute, so that the
// rules' windows and for: durations fit in a minute-long run): each alert
// must fire for the node whose cause was provoked, and none on the healthy
// cluster before. It also checks that every metric and label value the
// rules use is one weftd really serves.
//
// The nodes: n1 runs the kernel vxlan backend; f1 uvxlan with the fast
// path; f2 uvxlan with the fast path asked for but without CAP_BPF and
// CAP_SYS_ADMIN (as the DaemonSet runs it without BPF added).
func TestAlertsFireOnProvokedCauses(t *testing.T) {
	pt := promtool(t)
	root := ModuleRootDir(t)
	rulesPath := filepath.Join(root, rulesFile)
	rules, err := os.ReadFile(rulesPath)
	if err != nil {
		t.Fatal(err)
	}
	lease := []string{"--subnet-lease-ttl", "30s", "--subnet-lease-renew-margin", "25s"}
	c := NewCluster(t, Options{Nodes: 0, NoConfig: true, EtcdOnUnderlay: true})
	c.OnNode = func(n *Node) {
		if n.Label != "f2" {
			return
		}
		n.Prog, n.OwnArgs = "setpriv", true
		n.Args = append([]string{"--bounding-set", "-bpf,-sys_admin,-perfmon", "--", c.weftd,
			"--etcd-endpoints", c.Endpoints(), "--subnet-file", n.SubnetFile, "--iface", "eth0",
			"--health-addr", "127.0.0.1:9470", "--log-level", "debug"}, lease...)
	}
	n1 := c.AddNode("n1", append([]string{"--backend", "vxlan"}, lease...)...)
	f1 := c.AddNode("f1", lease...)
	f2 := c.AddNode("f2")
	nodes := []*Node{n1, f1, f2}

	s := &scraper{samples: map[string]map[int]float64{}, seen: map[string]map[string]map[string]bool{}}
	ctx, stop := context.WithCancel(context.Background())
	scraped := make(chan struct{})
	go func() { s.run(ctx, nodes); close(scraped) }()
	defer func() { stop(); <-scraped }()

	var checks []alertCheck
	expect := func(alert, cause string, tick int, instances ...string) {
		for _, in := range instances {
			checks = append(checks, alertCheck{alert, in, tick, cause})
		}
	}

	// Not ready: no network config yet.
	end := s.waitTicks(8)
	expect("WeftdNotReady", "no network config in etcd for 8 scrapes", end, "n1", "f1", "f2")
	c.Put(Prefix+"/config", `{"Network": "10.244.0.0/16", "Backend": {"Type": "uvxlan"}}`) // the fast path on by default
	for _, n := range nodes {
		n.WaitReady()
	}
	end = s.waitTicks(3)
	checks = append(checks, alertCheck{tick: end, cause: "healthy cluster: nothing fires"})

	// Rejected peers, repairs looping, drops rising and a peer left to the
	// userspace path, together for 20 scrapes.
	start := s.tick()
	c.Put(Prefix+"/subnets/"+subnet.MakeKey(netip.MustParsePrefix("10.99.0.0/24"), netip.Prefix{}),
		`{"PublicIP":"192.168.77.99","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"0a:00:00:00:00:99"}}`)
	pingCtx, pingStop := context.WithTimeout(context.Background(), 25*time.Second)
	defer pingStop()
	// Broadcasts out of the VXLAN device find no FDB entry: the kernel
	// drops each and counts it in the device's tx_dropped.
	// One ping sends about 100 a second here (1.6/s per compressed
	// minute, the rule's threshold is 1/s): three for a margin.
	var pings []*exec.Cmd
	for range 3 {
		ping := n1.Command(pingCtx, "ping", "-q", "-b", "-i", "0.002", "-I", device, "255.255.255.255")
		if err := ping.Start(); err != nil {
			t.Fatal(err)
		}
		pings = append(pings, ping)
	}
	pf1, pf2 := f1.CNI.AddPod(t, "a"), f2.CNI.AddPod(t, "b")
	// f2 runs the userspace path, which sends TCP with UDP GSO: the
	// super-packets make f1's fast path leave f2 to its userspace path.
	if _, err := Transfer(pf2.NS, pf1.NS, pf1.IP, 8<<20); err != nil {
		t.Fatalf("transfer f2 → f1: %v", err)
	}
	expect("WeftFastPathPeersOnUserspacePath", "f2's super-packets reach f1", s.waitTicks(2), "f1")
	deleted := 0
	for s.tick() < start+20 {
		// Something keeps deleting n1's route to f1's pods.
		if err := exec.Command("ip", "-n", n1.Name, "route", "del", f1.Subnet().String(), "dev", device).Run(); err == nil {
			deleted++
		}
		time.Sleep(time.Second)
	}
	pingStop()
	for _, p := range pings {
		p.Wait()
	}
	end = s.tick()
	t.Logf("deleted n1's route to f1 %d times", deleted)
	expect("WeftLeasesRejected", "a lease for 10.99.0.0/24, outside the Network", end, "n1", "f1", "f2")
	expect("WeftRepairsLooping", "n1's route to f1 deleted every second", end, "n1")
	expect("WeftDataplaneDropsRising", "about 300 broadcasts a second out of n1's VXLAN device", end, "n1")
	expect("WeftFastPathUnavailable", "f2 runs without CAP_BPF", end, "f2")

	// Lease renewals failing: etcd unreachable for 22 scrapes (the leases,
	// 30 s, outlive it).
	renewedBefore := renewals(n1)
	c.EtcdHost.Proxy.Pause()
	end = s.waitTicks(22)
	c.EtcdHost.Proxy.Resume()
	expect("WeftLeaseRenewalFailing", "etcd unreachable", end, "n1", "f1", "f2")
	Eventually(t, 30*time.Second, "a renewal on n1 after etcd is back", func() error {
		if renewals(n1) <= renewedBefore {
			return fmt.Errorf("no renewal")
		}
		return nil
	})

	// Lease lost: n1's lease deleted; weftd down: f2 stopped.
	if _, err := c.Client.Delete(t.Context(), Prefix+"/subnets/"+subnet.MakeKey(n1.Subnet(), netip.Prefix{})); err != nil {
		t.Fatal(err)
	}
	f2.Stop()
	end = s.waitTicks(7)
	expect("WeftLeaseLost", "n1's lease deleted in etcd", end, "n1")
	expect("WeftdDown", "f2's weftd stopped", end, "f2")
	stop()
	<-scraped

	s.checkRuleNames(t, string(rules))
	dir := t.TempDir()
	test := filepath.Join(dir, "provoked.test.yaml")
	if err := os.WriteFile(test, []byte(s.promtoolTest(rulesPath, checks)), 0o644); err != nil {
		t.Fatal(err)
	}
	if keep := os.Getenv("WEFT_ALERTS_KEEP"); keep != "" { // to look at the series
		os.WriteFile(keep, []byte(s.promtoolTest(rulesPath, checks)), 0o644)
	}
	out, err := exec.Command(pt, "test", "rules", test).CombinedOutput()
	for _, ch := range checks {
		if ch.alert == "" {
			t.Logf("scrape %3d: nothing fires (%s)", ch.tick, ch.cause)
		} else {
			t.Logf("scrape %3d: %s on %s (%s)", ch.tick, ch.alert, ch.instance, ch.cause)
		}
	}
	if err != nil {
		t.Fatalf("promtool test rules on the scraped series: %v\n%s", err, tail(string(out), 80))
	}
}
