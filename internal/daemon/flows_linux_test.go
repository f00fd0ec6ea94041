package daemon

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/weft-net/weft/flow"
	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/policy"
	"github.com/weft-net/weft/subnet"
)

// TestFlowsServed wires --flows as weftd does (ring, metric, the reader of
// the network's events, /flows and /metrics on the health server's mux) in
// a test node namespace routing between two pods, the second isolated for
// ingress by x/deny with drops logged to the flag's group. A connection
// refused by the policy must show on /flows, filtered by verdict and
// policy, and count in weft_policy_verdicts_total; the ICMP ping the
// table lets through (replies of nothing: a new flow) shows as allowed.
func TestFlowsServed(t *testing.T) {
	node, p1, _ := nettest.RoutedPods(t, "fl", [2]netip.Prefix{netip.MustParsePrefix("10.9.1.0/24"), netip.MustParsePrefix("10.9.2.0/24")})
	nettest.MustRun(t, node, "sysctl", "-qw", "net.netfilter.nf_conntrack_acct=1")
	isolated := netip.MustParseAddr("10.9.2.2")
	if err := policy.Program(node.Path, policy.Plan{IngressIsolated: []netip.Addr{isolated},
		IngressBy: []policy.Isolation{{Policies: []string{"x/deny"}, Addrs: []netip.Addr{isolated}}},
		Rules: []policy.Rule{{Name: "x/ping ingress 0", Local: []netip.Addr{isolated}, AnyPeer: true,
			Ports: []policy.PortEntry{{Addr: policy.Range{First: isolated, Last: isolated}, Proto: unix.IPPROTO_UDP, First: 53, Last: 53}}}},
		LogGroup: 9}); err != nil {
		t.Fatal(err)
	}
	procSys := t.TempDir()
	os.MkdirAll(filepath.Join(procSys, "net/netfilter"), 0o755)
	os.WriteFile(filepath.Join(procSys, "net/netfilter/nf_conntrack_acct"), []byte("1\n"), 0o644)
	c := &config{flows: true, healthAddr: "127.0.0.1:0", kubeSubnetMgr: true, networkPolicy: true, flowLogGroup: 9, procSys: procSys, nodeName: "n1"}
	if g := logGroup(c); g != 9 {
		t.Fatalf("policy log group %d", g)
	}
	reg := prometheus.NewRegistry()
	fl, err := newFlows(c, reg)
	if err != nil {
		t.Fatal(err)
	}
	runner, err := fl.factory(c, slog.New(slog.DiscardHandler))(&subnet.Config{Network: netip.MustParsePrefix("10.9.0.0/16")})
	if err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(node.Path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	r := runner.(*flowRunner) // weftd reads its own namespace; the test, the node's
	if !r.ct.Accounting || r.nflog == nil {
		t.Fatalf("runner: accounting %v, nflog %v", r.ct.Accounting, r.nflog)
	}
	r.ct.NetNS, r.nflog.NetNS = fd, fd
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	hs := NewHealthServer(c.healthAddr, func() bool { return true }, slog.New(slog.DiscardHandler))
	mountMetrics(hs, reg)
	fl.mount(hs, flowNode(c))
	srv := httptest.NewServer(hs.Mux)
	defer srv.Close()

	// Until the readers are bound, a drop is not logged to anyone: try
	// again until one shows.
	var page flow.Page
	for try := 0; len(page.Flows) == 0; try++ {
		if try == 10 {
			t.Fatalf("no drop on /flows: %+v", page)
		}
		if err := p1.Do(func() error {
			if c, err := net.DialTimeout("tcp", "10.9.2.2:9090", 500*time.Millisecond); err == nil {
				c.Close()
				t.Error("the isolated pod took a connection")
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		getJSON(t, srv.URL+"/flows?verdict=dropped&policy=x/deny&port=9090&wait=1", &page)
	}
	f := page.Flows[0]
	if f.Node != "n1" || f.Src.String() != "10.9.1.2" || f.Dst != isolated || f.Direction != flow.DirIngress || !slices.Equal(f.Policies, []string{"x/deny"}) {
		t.Errorf("drop %+v", f)
	}
	getJSON(t, srv.URL+"/flows?verdict=allowed&wait=0", &page)
	if len(page.Flows) != 0 {
		t.Errorf("allowed flows where the policy let nothing through: %+v", page.Flows)
	}
	if r := page.Readers; r == nil || r.ConntrackRate != flowConntrackRate || r.ConntrackPauses != 0 || r.Lost != 0 {
		t.Errorf("readers %+v", r)
	}
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`weft_policy_verdicts_total{direction="ingress",namespace="x",policy="deny",verdict="dropped"}`,
		"weft_flows_suppressed_total 0", "weft_flow_events_lost_total 0",
		"weft_flow_conntrack_pauses_total 0", "weft_flow_conntrack_paused_seconds_total 0"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("no %s in /metrics:\n%s", want, body)
		}
	}
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET %s: %s: %s", url, resp.Status, b)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatal(err)
	}
}

// TestFlowsReadersFailQuietly: readers that cannot open their sockets (here
// a namespace descriptor that is not one) are logged, and the runner
// returns nil so that the node goes on.
func TestFlowsReadersFailQuietly(t *testing.T) {
	notNS, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer notNS.Close()
	fd := int(notNS.Fd())
	r := &flowRunner{f: &flows{ring: flow.NewRing(4, 1, 1)}, log: slog.New(slog.DiscardHandler),
		ct: &flow.Conntrack{NetNS: fd}, nflog: &flow.NFLog{Group: 9, NetNS: fd}}
	if err := r.Run(context.Background()); err != nil {
		t.Errorf("run: %v", err)
	}
	if err := (&flow.Conntrack{NetNS: fd}).Run(context.Background(), func(flow.Flow) {}); err == nil {
		t.Error("conntrack reader in no namespace: no error")
	}
}
