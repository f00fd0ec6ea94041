package policy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/weft-net/weft/internal/testkit/kubetest"
	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/internal/testkit/plugintest"
	"github.com/weft-net/weft/test/e2e"
)

const (
	netConf = `{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}`
	// the nodes' podCIDRs: /22, so that the server's node holds the
	// 1,000 other pods beside the server
	clientCIDR, serverCIDR = "10.244.0.0/22", "10.244.4.0/22"
	others                 = 1000 // other pods, and other policies, in the "many" condition
	benchNS                = "bench"
	connPort, iperfPort    = 80, 5201
	closedPort             = 81 // nothing listens there; no policy allows it
)

// condition is what the policy table holds while a figure is measured.
type condition int

const (
	none  condition = iota // no policy selects the server
	allow                  // one policy selects the server and allows the client
	many                   // that policy and 1,000 others, each selecting one of 1,000 other pods of the server's node
	off                    // weftd runs with --network-policy=false: no policy table at all
	nConditions
)

func (c condition) String() string {
	return [...]string{"no policy", "allowing policy", "allowing policy + 1,000 others", "enforcement off"}[c]
}

// wantRules is the number of policy rules in the server node's ingress
// chain under c.
func (c condition) wantRules() int { return [...]int{0, 1, 1 + others, 0}[c] }

// policies is the condition whose policies the API holds under c.
func (c condition) policies() condition {
	if c == off {
		return none
	}
	return c
}

// BenchmarkPolicyVXLAN measures on two kernel VXLAN nodes.
func BenchmarkPolicyVXLAN(b *testing.B) { bench(b, "vxlan") }

// BenchmarkPolicyUVXLAN measures on two nodes of weft's userspace VXLAN
// dataplane.
func BenchmarkPolicyUVXLAN(b *testing.B) { bench(b, "uvxlan", "--backend", "uvxlan") }

func bench(b *testing.B, name string, args ...string) {
	e := newEnv(b, args...)
	conns := envInt(b, "WEFT_BENCH_CONNS", 2000)
	secs := envInt(b, "WEFT_BENCH_IPERF_SECONDS", 5)
	var rounds []round
	for i := 0; b.Loop(); i++ {
		r := round{n: i + 1, load: [2]string{loadAvg(b)}}
		for k := range nConditions {
			c := (condition(k) + condition(i)) % nConditions // rotate the order from round to round
			r.order = append(r.order, c)
			e.set(c)
			r.pos[c] = e.rulePosition()
			r.connect[c] = e.connect(conns)
			r.gbps[c] = e.iperf(secs)
			fmt.Printf("%s round %d, %s: %s\n", name, r.n, c, r.line(c))
		}
		r.load[1] = loadAvg(b)
		rounds = append(rounds, r)
	}
	report(b, name, conns, secs, rounds)
}

// env is a real kube-apiserver, two weftd nodes with policy on, a client
// pod on n1 and a server pod on n2, and 1,000 other Pods of n2 in the API.
type env struct {
	b              *testing.B
	ctx            context.Context
	cs             kubernetes.Interface
	c              *e2e.Cluster
	client, server *plugintest.Pod
	cur            condition // the policies in the API (none, allow or many)
	enforcing      bool      // weftd runs with --network-policy
}

func newEnv(b *testing.B, args ...string) *env {
	k := kubetest.Start(b)
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	// a client of its own: the default rate limit (5 requests a second)
	// would make creating 1,000 policies take minutes
	cfg := rest.CopyConfig(k.Admin)
	cfg.QPS, cfg.Burst = 1000, 1000
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		b.Fatal(err)
	}
	conf := filepath.Join(b.TempDir(), "net-conf.json")
	if err := os.WriteFile(conf, []byte(netConf), 0o644); err != nil {
		b.Fatal(err)
	}
	e := &env{b: b, ctx: ctx, cs: cs, c: e2e.NewCluster(b, e2e.Options{Nodes: 0}), enforcing: true}
	apiserver := strings.TrimPrefix(k.Admin.Host, "https://")
	e.c.OnNode = func(n *e2e.Node) { nettest.ForwardLoopback(b, n, apiserver) }
	for _, n := range []struct{ name, cidr string }{{"n1", clientCIDR}, {"n2", serverCIDR}} {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name}, Spec: corev1.NodeSpec{PodCIDR: n.cidr, PodCIDRs: []string{n.cidr}}}
		if _, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		store := filepath.Join(e.c.Dir, n.name, "cni", "weft")
		e.c.AddNode(n.name, append([]string{"--network-policy=true", "--kube-subnet-mgr", "--kubeconfig", k.Kubeconfig(), "--node-name", n.name,
			"--net-config-path", conf, "--pod-address-store", store}, args...)...)
	}
	for _, n := range e.c.Nodes {
		n.WaitReady()
	}
	for _, ns := range append([]string{benchNS}, otherNamespaces()...) {
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		// no controller-manager makes the default ServiceAccount
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "pods", Namespace: ns}}
		if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	e.client = e.c.Nodes[0].CNI.AddPod(b, "client")
	e.server = e.c.Nodes[1].CNI.AddPod(b, "server")
	e.createPod(podObject(benchNS, "client", "n1", map[string]string{"role": "client"}), e.client.IP)
	e.createPod(podObject(benchNS, "server", "n2", map[string]string{"app": "server"}), e.server.IP)
	e.serve()
	var g errgroup.Group
	g.SetLimit(16)
	for i := range others {
		g.Go(func() error { return e.tryCreatePod(otherPod(i)) })
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
	// the first connection from a pod pays for ARP and the peer's FDB
	// entry; not part of any condition
	e2e.Eventually(b, 10*time.Second, "client reaches server", func() error { _, err := e.dial(); return err })
	return e
}

func (e *env) createPod(p *corev1.Pod, ip netip.Addr) {
	if err := e.tryCreatePod(p, ip); err != nil {
		e.b.Fatal(err)
	}
}

// tryCreatePod creates p and writes its status as a kubelet would: running,
// with address ip.
func (e *env) tryCreatePod(p *corev1.Pod, ip netip.Addr) error {
	pods := e.cs.CoreV1().Pods(p.Namespace)
	id := p.Namespace + "/" + p.Name
	p, err := pods.Create(e.ctx, p, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create pod %s: %w", id, err)
	}
	p.Status.Phase = corev1.PodRunning
	p.Status.PodIP = ip.String()
	p.Status.PodIPs = []corev1.PodIP{{IP: ip.String()}}
	if _, err := pods.UpdateStatus(e.ctx, p, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("pod %s status: %w", id, err)
	}
	return nil
}

// serve starts, in the server pod, a TCP server on connPort that sends one
// byte to each new connection and closes it, and iperf3 on iperfPort.
func (e *env) serve() {
	b := e.b
	nettest.ServeByte(b, e.server.NS, fmt.Sprintf("0.0.0.0:%d", connPort))
	cmd := e.server.NS.Command(e.ctx, "iperf3", "--server", "--port", fmt.Sprint(iperfPort))
	if err := cmd.Start(); err != nil {
		b.Fatalf("iperf3 server: %v", err)
	}
	b.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
}

// set makes the cluster's policies and weftd's enforcement those of c and
// waits until the server's node has programmed them and the client gets
// through.
func (e *env) set(c condition) {
	if c == off {
		e.setPolicies(none)
		e.enforce(false)
	} else {
		e.enforce(true)
		e.setPolicies(c)
	}
	e2e.Eventually(e.b, 10*time.Second, "client reaches server", func() error { _, err := e.dial(); return err })
	e.checkIsolated(c)
	time.Sleep(time.Second) // let weftd's work on the change end
}

// enforce restarts weftd on both nodes with --network-policy=<on>, unless
// it runs so already, and waits until it is ready (with policy on: its
// first table committed) and n2's table is there (on) or gone (off).
func (e *env) enforce(on bool) {
	if on == e.enforcing {
		return
	}
	for _, n := range e.c.Nodes {
		n.Stop()
		n.Args[0] = fmt.Sprintf("--network-policy=%t", on)
		n.Start()
	}
	for _, n := range e.c.Nodes {
		n.WaitReady()
	}
	e.enforcing = on
	e2e.Eventually(e.b, 30*time.Second, fmt.Sprintf("n2's policy table there: %t", on), func() error {
		_, err := e.c.Nodes[1].NS.Run("nft", "list", "table", "inet", "weft-policy")
		if (err == nil) != on {
			return fmt.Errorf("nft list table: %v", err)
		}
		return nil
	})
}

// setPolicies makes the policies in the API those of c (none, allow or
// many) and, with enforcement on, waits until n2's ingress chain has
// their rules.
func (e *env) setPolicies(c condition) {
	b := e.b
	if c == e.cur {
		return
	}
	nps := func(ns string) error {
		return e.cs.NetworkingV1().NetworkPolicies(ns).DeleteCollection(e.ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
	}
	var g errgroup.Group
	g.SetLimit(16)
	switch {
	case c == none:
		for _, ns := range append([]string{benchNS}, otherNamespaces()...) {
			g.Go(func() error { return nps(ns) })
		}
	case c == allow && e.cur == many:
		for _, ns := range otherNamespaces() {
			g.Go(func() error { return nps(ns) })
		}
	default:
		if e.cur == none {
			g.Go(func() error { return e.createPolicy(allowPolicy()) })
		}
		if c == many {
			for i := range others {
				g.Go(func() error { return e.createPolicy(otherPolicy(i)) })
			}
		}
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
	e.cur = c
	if !e.enforcing {
		return
	}
	e2e.Eventually(b, 2*time.Minute, fmt.Sprintf("%d policy rules on n2", c.wantRules()), func() error {
		rules, _, err := e.ingressRules()
		if err != nil {
			return err
		}
		if rules != c.wantRules() {
			return fmt.Errorf("%d rules", rules)
		}
		return nil
	})
}

// checkIsolated fails the benchmark unless the server is isolated exactly
// when c has a policy selecting it: the client's connection to a port the
// policy does not allow, where nothing listens, is refused by the server's
// kernel without a policy and dropped (no answer) with one.
func (e *env) checkIsolated(c condition) {
	var err error
	if derr := e.client.NS.Do(func() error {
		var conn net.Conn
		conn, err = net.DialTimeout("tcp4", netip.AddrPortFrom(e.server.IP, closedPort).String(), 500*time.Millisecond)
		if err == nil {
			conn.Close()
		}
		return nil
	}); derr != nil {
		e.b.Fatal(derr)
	}
	var ne net.Error
	dropped := errors.As(err, &ne) && ne.Timeout()
	refused := errors.Is(err, syscall.ECONNREFUSED)
	if isolated := c == allow || c == many; isolated != dropped || dropped == refused {
		e.b.Fatalf("%s: client → server port %d: %v (want %s)", c, closedPort, err, map[bool]string{true: "no answer", false: "refused"}[isolated])
	}
}

func (e *env) createPolicy(p *networkingv1.NetworkPolicy) error {
	if _, err := e.cs.NetworkingV1().NetworkPolicies(p.Namespace).Create(e.ctx, p, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create policy %s/%s: %w", p.Namespace, p.Name, err)
	}
	return nil
}

// ingressRules counts the policy rules of n2's IPv4 ingress chain (not
// the default deny at its end, nor the jump to the drop log before it)
// and says where (1-based) the allowing policy's rule is among them (0: not
// there). The controller lists policies in its informer's order, so the
// position changes from one table to the next.
func (e *env) ingressRules() (rules, pos int, err error) {
	out, err := e.c.Nodes[1].NS.Run("nft", "list", "chain", "inet", "weft-policy", "ingress")
	if err != nil {
		if strings.Contains(out, "No such file") {
			return 0, 0, nil // no table yet
		}
		return 0, 0, err
	}
	for _, l := range strings.Split(out, "\n") {
		if !strings.Contains(l, `comment "weft: `) || strings.Contains(l, "no policy allows it") || strings.Contains(l, "weft: log drops") {
			continue
		}
		rules++
		if strings.Contains(l, benchNS+"/allow-client ingress") {
			pos = rules
		}
	}
	return rules, pos, nil
}

func (e *env) rulePosition() int {
	_, pos, err := e.ingressRules()
	if err != nil {
		e.b.Fatal(err)
	}
	return pos
}

// dial opens a connection from the client to the server and waits for its
// first byte; it returns the time that took.
func (e *env) dial() (time.Duration, error) {
	var took time.Duration
	err := e.client.NS.Do(func() error {
		var err error
		took, err = dialOnce(netip.AddrPortFrom(e.server.IP, connPort))
		return err
	})
	return took, err
}

func dialOnce(to netip.AddrPort) (time.Duration, error) {
	start := time.Now()
	c, err := net.DialTimeout("tcp4", to.String(), 2*time.Second)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	c.SetDeadline(start.Add(2 * time.Second))
	buf := make([]byte, 1)
	if _, err := c.Read(buf); err != nil {
		return 0, fmt.Errorf("first byte: %w", err)
	}
	return time.Since(start), nil
}

// connect makes n connections one after the other from the client pod
// (one OS thread in its namespace) and returns their setup times.
func (e *env) connect(n int) connStats {
	var s connStats
	to := netip.AddrPortFrom(e.server.IP, connPort)
	if err := e.client.NS.Do(func() error {
		for range n {
			d, err := dialOnce(to)
			if err != nil {
				s.failed++
				continue
			}
			s.times = append(s.times, d)
		}
		return nil
	}); err != nil {
		e.b.Fatal(err)
	}
	slices.Sort(s.times)
	return s
}

// iperf runs one iperf3 stream from the client to the server for secs
// seconds and returns what the server received, in Gbit/s.
func (e *env) iperf(secs int) float64 {
	b := e.b
	ctx, cancel := context.WithTimeout(e.ctx, time.Duration(secs+30)*time.Second)
	defer cancel()
	cmd := e.client.NS.Command(ctx, "iperf3", "--client", e.server.IP.String(), "--port", fmt.Sprint(iperfPort),
		"--time", fmt.Sprint(secs), "--json")
	out, err := cmd.Output()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		err = fmt.Errorf("%w: %s", err, ee.Stderr)
	}
	if err != nil {
		b.Fatalf("iperf3: %v: %s", err, out)
	}
	var res struct {
		End struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
		Error string `json:"error"`
	}
	if err := json.Unmarshal(out, &res); err != nil || res.Error != "" {
		b.Fatalf("iperf3 output: %v %s", err, res.Error)
	}
	return res.End.SumReceived.BitsPerSecond / 1e9
}

func envInt(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	var n int
	if _, err := fmt.Sscan(v, &n); err != nil || n <= 0 {
		b.Fatalf("%s=%q: want a positive whole number", name, v)
	}
	return n
}

func loadAvg(b *testing.B) string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		b.Fatal(err)
	}
	return strings.Join(strings.Fields(string(raw))[:3], " ")
}
