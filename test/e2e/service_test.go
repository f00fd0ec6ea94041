package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"

	"github.com/weft-net/weft/internal/testkit/kubetest"
	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/internal/testkit/plugintest"
)

// svcDataplanes are the dataplanes TestServicesKubeProxy sends Service
// traffic over: the network config of node A (the client's) and of node B
// (the backends'). Adding a dataplane is one line.
var svcDataplanes = []struct {
	name         string
	confA, confB string
}{
	{"vxlan", svcConf(`"Type":"vxlan"`), svcConf(`"Type":"vxlan"`)},
	{"uvxlan-userspace", svcConf(`"Type":"uvxlan","FastPath":false`), svcConf(`"Type":"uvxlan","FastPath":false`)},
	{"uvxlan-fastpath", svcConf(`"Type":"uvxlan"`), svcConf(`"Type":"uvxlan"`)}, // the fast path is on by default
	{"host-gw", svcConf(`"Type":"host-gw"`), svcConf(`"Type":"host-gw"`)},
	{"wireguard", svcConf(`"Type":"wireguard"`), svcConf(`"Type":"wireguard"`)},
	{"vxlan-uvxlan", svcConf(`"Type":"vxlan"`), svcConf(`"Type":"uvxlan"`)},
}

func svcConf(backend string) string {
	return `{"Network":"` + kubetest.ClusterCIDR + `","Backend":{` + backend + `}}`
}

// svcProxies are the kube-proxy configurations every dataplane runs under.
var svcProxies = []struct {
	name    string
	masqAll bool
	args    []string
}{
	{"iptables", false, []string{"--proxy-mode=iptables"}},
	{"iptables-masquerade-all", true, []string{"--proxy-mode=iptables", "--masquerade-all"}},
	{"nftables", false, []string{"--proxy-mode=nftables"}},
	{"nftables-masquerade-all", true, []string{"--proxy-mode=nftables", "--masquerade-all"}},
}

// Service traffic per case.
const (
	svcConns    = 200      // short connections per path, a new one each
	svcTransfer = 50 << 20 // bytes through the Service, sha256 compared
	svcPort     = 8080     // the backends' port
	// svcDialTimeout gives a connection two SYN retransmissions (at 1 s
	// and 3 s, as an HTTP client waits); one that needed any is counted in
	// the table's ≥1s column.
	svcDialTimeout = 5 * time.Second
)

// TestServicesKubeProxy sends Service traffic over weft's dataplanes with
// the real kube-proxy (test/kube/build.sh builds it from the apiserver's
// sources) running in each node's namespace against the real API server,
// as its ServiceAccount bound to system:node-proxier (as kubeadm sets it
// up), with the real EndpointSlice controller. The test plays the kubelet: it
// wires pods with the weft plugin and reports them Running and Ready.
// Per dataplane and kube-proxy configuration (iptables and nftables, with
// defaults and --masquerade-all): a ClusterIP Service from a pod on node A
// to backends on node B only, a NodePort on node A's address from a host
// on the underlay with the backends on node B, and a pod reaching itself
// through its own Service (hairpin); each gets svcConns new connections
// (0 failures) and the first two a transfer of svcTransfer bytes. The
// backends report the source they see, which shows the masquerading each
// configuration must do. kube-proxy runs so that it writes nothing outside
// its namespace; the root namespace's sysctls it could touch are compared
// before and after.
func TestServicesKubeProxy(t *testing.T) {
	nettest.RequireRoot(t)
	proxyBin, err := kubetest.KubeProxyBinary()
	if err != nil {
		t.Fatal(err)
	}
	before := rootSysctls(t)
	t.Cleanup(func() {
		after := rootSysctls(t)
		if d := diffSysctls(before, after); d != "" {
			t.Errorf("kube-proxy changed the root namespace: %s", d)
		}
	})
	start := time.Now()
	k := kubetest.Start(t)
	k.StartControllers(t, "nodeipam", "endpointslice")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	applyManifests(ctx, t, k)
	env := &svcEnv{t: t, ctx: ctx, k: k, proxyBin: proxyBin, stops: map[*Node]func(){},
		weftKubeconfig: saKubeconfig(ctx, t, k, "kube-weft", "weft"), proxyKubeconfig: proxyKubeconfig(ctx, t, k)}
	var table []string
	for _, dp := range svcDataplanes {
		t.Run(dp.name, func(t *testing.T) {
			table = append(table, env.dataplane(t, dp.name, dp.confA, dp.confB)...)
		})
	}
	t.Logf("Service connection setup through kube-proxy (%d connections per path; %s in all):\n%-16s %-24s %-9s %9s %9s %9s %5s %6s %10s\n%s",
		svcConns, time.Since(start).Round(time.Second), "dataplane", "kube-proxy", "path", "p50", "p99", "max", "≥1s", "failed", "50 MiB",
		strings.Join(table, "\n"))
	if !t.Failed() {
		hairpins := 0
		for _, row := range table {
			if strings.Contains(row, " hairpin ") {
				hairpins++
			}
		}
		recordFailure(t, "849", fmt.Sprintf("%d cases (dataplane × kube-proxy configuration), %d new connections from a pod to itself through its Service in each, 0 failed", hairpins, svcConns))
	}
}

type svcEnv struct {
	t               *testing.T
	ctx             context.Context
	k               *kubetest.Cluster
	proxyBin        string
	weftKubeconfig  string
	proxyKubeconfig string
	stops           map[*Node]func() // each node's running kube-proxy
}

// svcSetup is one dataplane's nodes, pods and Services.
type svcSetup struct {
	a, b      *Node
	client    *nettest.Host
	pod       *plugintest.Pod // on a; it also backs the hairpin Service
	backends  []*plugintest.Pod
	clusterIP netip.Addr
	hairpinIP netip.Addr
	nodePort  int
}

// dataplane builds two weftd nodes (A with confA, B with confB) and a
// client host, and runs every kube-proxy configuration over them. It
// returns the rows of the timing table.
func (e *svcEnv) dataplane(t *testing.T, name, confA, confB string) []string {
	k := e.k
	c := NewCluster(t, Options{Nodes: 0})
	apiserver := strings.TrimPrefix(k.Admin.Host, "https://")
	c.OnNode = func(n *Node) {
		nettest.ForwardLoopback(t, n, apiserver)
		// Each node its own WireGuard key, in the test's directory.
		n.Env = []string{"WIREGUARD_KEY_FILE=" + filepath.Join(c.Dir, n.Label, "wgkey")}
	}
	s := &svcSetup{}
	dir := t.TempDir()
	for i, conf := range []string{confA, confB} {
		label := string(rune('a' + i))
		nodeName := name + "-" + label
		path := filepath.Join(dir, label+".json")
		if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
		// The kubelet registers its Node with its address.
		addr := c.Underlay.Prefix.Addr()
		for range len(c.Nodes) + 1 {
			addr = addr.Next()
		}
		e.registerNode(t, nodeName, addr)
		n := c.AddNode(nodeName, "--kube-subnet-mgr", "--kubeconfig", e.weftKubeconfig, "--node-name", nodeName, "--net-config-path", path)
		if n.Addr != addr {
			t.Fatalf("%s has %s, registered %s", nodeName, n.Addr, addr)
		}
	}
	s.a, s.b = c.Nodes[0], c.Nodes[1]
	s.a.WaitReady()
	s.b.WaitReady()
	s.client = c.Underlay.AddHost(t, "uclient", "eth0")

	ns := "svc-" + name
	e.kubeObjects(t, ns, s)

	var rows []string
	for _, px := range svcProxies {
		t.Run(px.name, func(t *testing.T) {
			rows = append(rows, e.proxyCase(t, s, name, px.name, px.masqAll, px.args)...)
		})
	}
	return rows
}

// registerNode creates the Node name with its address addr, as its kubelet
// would.
func (e *svcEnv) registerNode(t *testing.T, name string, addr netip.Addr) {
	ctx, k := e.ctx, e.k
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}}}
	if _, err := k.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The node IPAM controller writes the Node too.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := k.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		cur.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: addr.String()}}
		_, err = k.Client.CoreV1().Nodes().UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Client.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
}

// kubeObjects creates the namespace, the pods (playing the kubelet: wired
// by the weft plugin, serving in the test process, reported Ready) and the
// Services, and waits for their EndpointSlices.
func (e *svcEnv) kubeObjects(t *testing.T, ns string, s *svcSetup) {
	ctx, k := e.ctx, e.k
	if _, err := k.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The ServiceAccount controller would create it; pods need it.
	if _, err := k.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s.pod = s.a.CNI.AddPod(t, "sa")
	e.runPod(t, ns, "client", "hairpin", s.a, s.pod)
	for i := range 2 {
		p := s.b.CNI.AddPod(t, fmt.Sprintf("sb%d", i))
		e.runPod(t, ns, fmt.Sprintf("backend-%d", i), "backend", s.b, p)
		s.backends = append(s.backends, p)
	}
	svc := func(name, app string, typ corev1.ServiceType) *corev1.Service {
		out, err := k.Client.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.ServiceSpec{Type: typ, Selector: map[string]string{"app": app},
				Ports: []corev1.ServicePort{{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(svcPort)}}}},
			metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	backend, hairpin := svc("backend", "backend", corev1.ServiceTypeNodePort), svc("hairpin", "hairpin", corev1.ServiceTypeClusterIP)
	s.clusterIP = netip.MustParseAddr(backend.Spec.ClusterIP)
	s.hairpinIP = netip.MustParseAddr(hairpin.Spec.ClusterIP)
	s.nodePort = int(backend.Spec.Ports[0].NodePort)
	want := map[string]int{"backend": 2, "hairpin": 1}
	Eventually(t, 30*time.Second, "EndpointSlices with the ready pods", func() error {
		for svcName, n := range want {
			l, err := k.Client.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=" + svcName})
			if err != nil {
				return err
			}
			ready := 0
			for _, sl := range l.Items {
				for _, ep := range sl.Endpoints {
					if ep.Conditions.Ready != nil && *ep.Conditions.Ready {
						ready++
					}
				}
			}
			if ready != n {
				return fmt.Errorf("%s: %d ready endpoints, want %d", svcName, ready, n)
			}
		}
		return nil
	})
}

// runPod creates the pod on node n, serves svcPort in its namespace from
// the test process, and reports it Running and Ready with its IP.
func (e *svcEnv) runPod(t *testing.T, ns, name, app string, n *Node, p *plugintest.Pod) {
	ctx, k := e.ctx, e.k
	no := false
	pod, err := k.Client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": app}},
		Spec: corev1.PodSpec{NodeName: n.Label, AutomountServiceAccountToken: &no,
			Containers: []corev1.Container{{Name: "c", Image: "weft:e2e", Ports: []corev1.ContainerPort{{ContainerPort: svcPort}}}}}},
		metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := p.NS.Listen("tcp", ":"+strconv.Itoa(svcPort))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go serveSvc(ln, name)
	now := metav1.Now()
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, HostIP: n.Addr.String(), HostIPs: []corev1.HostIP{{IP: n.Addr.String()}},
		PodIP: p.IP.String(), PodIPs: []corev1.PodIP{{IP: p.IP.String()}}, StartTime: &now}
	for _, c := range []corev1.PodConditionType{corev1.PodScheduled, corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady} {
		pod.Status.Conditions = append(pod.Status.Conditions, corev1.PodCondition{Type: c, Status: corev1.ConditionTrue, LastTransitionTime: now})
	}
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "c", Image: "weft:e2e", ImageID: "e2e://weft", ContainerID: "e2e://" + name,
		Ready: true, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}}}
	if _, err := k.Client.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// svcPath is one way to a Service: from where, to which address.
type svcPath struct {
	name string
	from *nettest.NS
	to   string // host:port
	// srcOK checks the source address the backend saw.
	srcOK func(netip.Addr) error
	// backends are the pod names that may answer.
	backends []string
	transfer bool
	diag     func() string // what the namespaces on the way hold, for a failure
	// settle runs once the path works, before the connections are counted.
	settle func()
}

// proxyCase runs kube-proxy with args on both nodes and sends the traffic.
func (e *svcEnv) proxyCase(t *testing.T, s *svcSetup, dpName, pxName string, masqAll bool, args []string) []string {
	for _, n := range []*Node{s.a, s.b} {
		e.startKubeProxy(t, n, args)
	}
	podIP, clientIP := s.pod.IP, s.client.Addr
	notFrom := func(what string, a netip.Addr) func(netip.Addr) error {
		return func(src netip.Addr) error {
			if src == a {
				return fmt.Errorf("backend saw the %s's own address %s: not masqueraded", what, src)
			}
			return nil
		}
	}
	from := func(what string, a netip.Addr) func(netip.Addr) error {
		return func(src netip.Addr) error {
			if src != a {
				return fmt.Errorf("backend saw %s, want the %s's address %s", src, what, a)
			}
			return nil
		}
	}
	clusterSrc := from("client pod", podIP)
	if masqAll {
		clusterSrc = notFrom("client pod", podIP)
	}
	port80 := func(a netip.Addr) string { return net.JoinHostPort(a.String(), "80") }
	paths := []svcPath{
		{name: "ClusterIP", from: s.pod.NS, to: port80(s.clusterIP), srcOK: clusterSrc, backends: []string{"backend-0", "backend-1"}, transfer: true},
		{name: "NodePort", from: s.client.NS, to: net.JoinHostPort(s.a.Addr.String(), strconv.Itoa(s.nodePort)),
			srcOK: notFrom("underlay host", clientIP), backends: []string{"backend-0", "backend-1"}, transfer: true},
		// kube-proxy masquerades a pod's connection to itself in every mode.
		{name: "hairpin", from: s.pod.NS, to: port80(s.hairpinIP), srcOK: notFrom("pod", podIP), backends: []string{"client"}},
	}
	// The attempts made while kube-proxy was still writing its rules left
	// conntrack entries without NAT (their SYN went to the default route);
	// a counted connection that reused one's source port would follow it
	// instead of the rules ("no route to host"). Once the path works, the
	// nodes' tables (their own namespaces) are cleared.
	flush := func() {
		for _, n := range []*Node{s.a, s.b} {
			if out, err := n.Run("conntrack", "-F"); err != nil {
				t.Errorf("conntrack -F on %s: %v\n%s", n.Label, err, out)
			}
		}
	}
	var rows []string
	for _, p := range paths {
		p.diag = func() string { return svcDiag(p.from, s.a.NS, s.b.NS) }
		p.settle = flush
		rows = append(rows, fmt.Sprintf("%-16s %-24s %-9s %s", dpName, pxName, p.name, runPath(t, p)))
	}
	for _, n := range []*Node{s.a, s.b} {
		e.stopKubeProxy(t, n)
	}
	// With kube-proxy's rules gone, the Service is unreachable: what the
	// next case sees, its own kube-proxy programmed.
	if _, _, _, err := svcWho(s.pod.NS, port80(s.clusterIP), time.Second); err == nil {
		t.Errorf("ClusterIP %s still answers after kube-proxy --cleanup", s.clusterIP)
	}
	// That attempt left a conntrack entry without NAT (the SYN went to the
	// default route). A connection of the next case that happened to reuse
	// its source port would follow it instead of the new rules and fail
	// ("no route to host"): clear the nodes' tables (their own namespaces).
	for _, n := range []*Node{s.a, s.b} {
		if out, err := n.Run("conntrack", "-F"); err != nil {
			t.Errorf("conntrack -F on %s: %v\n%s", n.Label, err, out)
		}
	}
	return rows
}

// runPath waits until the path works, then opens svcConns connections
// through it, each answered by one of its backends seeing an allowed
// source, and sends the transfer. It returns the columns of its table row.
func runPath(t *testing.T, p svcPath) string {
	Eventually(t, 30*time.Second, p.name+" through kube-proxy", func() error {
		_, _, _, err := svcWho(p.from, p.to, svcDialTimeout)
		return err
	})
	if p.settle != nil {
		p.settle()
	}
	var setup []time.Duration
	var failures []string
	slow := 0
	seen := map[string]int{}
	for range svcConns {
		took, who, src, err := svcWho(p.from, p.to, svcDialTimeout)
		if err == nil && !slices.Contains(p.backends, who) {
			err = fmt.Errorf("answered by %s, want one of %v", who, p.backends)
		}
		if err == nil {
			err = p.srcOK(src)
		}
		if err != nil {
			failures = append(failures, err.Error())
			if len(failures) == 1 {
				t.Logf("%s: first failure at %s: %v; state now:\n%s", p.name, time.Now().Format("15:04:05.000"), err, p.diag())
			}
			continue
		}
		seen[who]++
		setup = append(setup, took)
		if took >= time.Second { // a SYN retransmitted: the stall of a dropped packet
			slow++
		}
	}
	if len(failures) > 0 {
		t.Errorf("%s: %d of %d connections failed; first: %s", p.name, len(failures), svcConns, failures[0])
	}
	if len(p.backends) > 1 && len(seen) < len(p.backends) {
		t.Errorf("%s: answered only by %v, want every backend of %v", p.name, seen, p.backends)
	}
	rate := "-"
	if p.transfer {
		r, err := svcSum(p.from, p.to, svcTransfer)
		if err != nil {
			t.Errorf("%s: %d MiB through the Service: %v", p.name, svcTransfer>>20, err)
		} else {
			rate = fmt.Sprintf("%.2f Gb/s", r*8/1e9)
		}
	}
	p50, p99, pmax := percentile(setup, 50), percentile(setup, 99), percentile(setup, 100)
	return fmt.Sprintf("%9s %9s %9s %5d %6d %10s", p50, p99, pmax, slow, len(failures), rate)
}
