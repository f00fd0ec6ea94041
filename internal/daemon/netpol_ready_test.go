package daemon

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/weft-net/weft/subnet"
)

// availRegistry is the fake registry with the Node condition of the
// Kubernetes registry: it counts SetNetworkAvailable.
type availRegistry struct {
	fakeRegistry
	available atomic.Int32
}

var _ networkAvailabler = (*availRegistry)(nil)

func (r *availRegistry) SetNetworkAvailable(context.Context, string) error {
	r.available.Add(1)
	return nil
}

type recNotifier struct {
	mu     sync.Mutex
	states []string
}

func (n *recNotifier) Notify(s string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.states = append(n.states, s)
	return nil
}

func (n *recNotifier) count() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.states)
}

// policyRunner is a fake policy controller: it runs until the session
// ends; reps has the reporter of each session's controller.
type policyRunner struct {
	running atomic.Bool
	reps    chan PolicyReporter
}

func (p *policyRunner) Run(ctx context.Context) error {
	p.running.Store(true)
	<-ctx.Done()
	p.running.Store(false)
	return nil
}

// startPolicyDaemon runs a daemon whose policy factory hands out its
// reporter; it returns that reporter once the session asked for it.
func startPolicyDaemon(t *testing.T) (*Daemon, *fakeBackend, *availRegistry, *recNotifier, *prometheus.Registry, PolicyReporter, *policyRunner) {
	t.Helper()
	fb := newFakeBackend()
	reg := &availRegistry{fakeRegistry: fakeRegistry{cfg: testConfig(t)}}
	notes := &recNotifier{}
	preg := prometheus.NewRegistry()
	pr := &policyRunner{reps: make(chan PolicyReporter, 4)}
	// An earlier run's subnet file, as a restarted weftd finds it: the
	// CNI plugin would wire pods by it before the new table commits.
	file := filepath.Join(t.TempDir(), "subnet.env")
	if err := os.WriteFile(file, []byte("FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.7.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=false\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := New(Config{
		Registry:      reg,
		Node:          Node{PublicIP: netip.MustParseAddr("192.168.77.1"), UnderlayMTU: 1500},
		SubnetFile:    file,
		RetryInterval: 20 * time.Millisecond,
		Metrics:       NewMetrics(preg),
		Notifier:      notes,
		Factories: Factories{
			Dataplane: func(string, *subnet.Config, subnet.Lease, int) (Dataplane, error) { return Dataplane{Backend: fb}, nil },
			Policy: func(_ *subnet.Config, _ subnet.Lease, rep PolicyReporter) (Runner, error) {
				pr.reps <- rep
				return pr, nil
			},
		},
	}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	select {
	case rep := <-pr.reps:
		return d, fb, reg, notes, preg, rep, pr
	case <-time.After(5 * time.Second):
		t.Fatal("no policy runner built")
		return nil, nil, nil, nil, nil, nil, nil
	}
}

// TestPolicyGatesReadiness: with NetworkPolicy on, a programmed dataplane
// is not enough: /readyz (Ready), weft_ready, READY=1 and the Node's
// network condition wait for the first committed policy transaction, and
// so does the subnet file, without which the CNI plugin wires no pod; a
// failed one makes the daemon not ready (and is counted) until the next
// commits.
func TestPolicyGatesReadiness(t *testing.T) {
	d, fb, reg, notes, preg, rep, _ := startPolicyDaemon(t)
	if gauge(t, preg, "weft_network_policy_enabled") != 1 {
		t.Error("weft_network_policy_enabled is not 1")
	}
	fb.markReady()
	time.Sleep(300 * time.Millisecond)
	if d.Ready() || gauge(t, preg, "weft_ready") != 0 || notes.count() != 0 || reg.available.Load() != 0 {
		t.Fatalf("before any policy transaction: ready %v, weft_ready %v, notified %d, node available %d",
			d.Ready(), gauge(t, preg, "weft_ready"), notes.count(), reg.available.Load())
	}
	noFile := func(when string) {
		t.Helper()
		if _, err := os.Stat(d.cfg.SubnetFile); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s: subnet file there (or %v): the CNI plugin could wire pods before policy is enforced", when, err)
		}
	}
	noFile("before any policy transaction")
	rep.Programmed(errors.New("transaction refused"))
	time.Sleep(100 * time.Millisecond)
	if d.Ready() || notes.count() != 0 || reg.available.Load() != 0 {
		t.Fatal("ready after a failed first transaction")
	}
	noFile("after a failed first transaction")
	rep.Programmed(nil)
	waitFor(t, func() bool {
		return d.Ready() && gauge(t, preg, "weft_ready") == 1 && notes.count() == 1 && reg.available.Load() == 1
	})
	if _, err := subnet.ReadFile(d.cfg.SubnetFile); err != nil {
		t.Errorf("no subnet file after the first commit: %v", err)
	}
	if gauge(t, preg, "weft_network_policy_ready") != 1 {
		t.Error("weft_network_policy_ready is not 1 after a commit")
	}
	rep.SourceChecks(errors.New("bridge table refused"))
	if !d.Ready() || gauge(t, preg, "weft_network_policy_source_checks_degraded") != 1 {
		t.Errorf("source checks off: ready %v (want true), weft_network_policy_source_checks_degraded %v (want 1)",
			d.Ready(), gauge(t, preg, "weft_network_policy_source_checks_degraded"))
	}
	rep.SourceChecks(nil)
	if gauge(t, preg, "weft_network_policy_source_checks_degraded") != 0 {
		t.Error("weft_network_policy_source_checks_degraded stays 1 once the checks are on")
	}
	rep.Programmed(errors.New("transaction refused"))
	if d.Ready() || gauge(t, preg, "weft_ready") != 0 || gauge(t, preg, "weft_network_policy_ready") != 0 {
		t.Error("still ready after a failed transaction")
	}
	if n := gauge(t, preg, "weft_network_policy_program_failures_total"); n != 2 {
		t.Errorf("weft_network_policy_program_failures_total %v, want 2", n)
	}
	rep.Programmed(nil)
	if !d.Ready() || gauge(t, preg, "weft_ready") != 1 {
		t.Error("not ready again after the retry committed")
	}
}

// TestPolicyCannotEnforceKeepsRunning: a node where policy cannot be
// enforced keeps its dataplane and its session (no exit, so no crash
// loop) and stays not ready, on every channel.
func TestPolicyCannotEnforceKeepsRunning(t *testing.T) {
	d, fb, reg, notes, preg, rep, pr := startPolicyDaemon(t)
	fb.markReady()
	rep.CannotEnforce(errors.New("br_netfilter is not loaded"))
	rep.CannotEnforce(errors.New("br_netfilter is not loaded"))
	time.Sleep(500 * time.Millisecond)
	if d.Ready() || gauge(t, preg, "weft_ready") != 0 || gauge(t, preg, "weft_network_policy_ready") != 0 || notes.count() != 0 || reg.available.Load() != 0 {
		t.Errorf("cannot enforce: ready %v, weft_ready %v, policy ready %v, notified %d, node available %d", d.Ready(),
			gauge(t, preg, "weft_ready"), gauge(t, preg, "weft_network_policy_ready"), notes.count(), reg.available.Load())
	}
	if d.Lease() == nil || !pr.running.Load() {
		t.Error("the session stopped")
	}
}

// TestPolicyReadinessAfterLostLease: the session of a lost lease ends and
// the next one starts with a new controller, which has committed nothing
// yet: the daemon is not ready until that controller commits, whatever
// the old one did (the review found the new session ready at once on the
// old controller's commit).
func TestPolicyReadinessAfterLostLease(t *testing.T) {
	d, fb, reg, _, preg, rep, pr := startPolicyDaemon(t)
	fb.markReady()
	rep.Programmed(nil)
	waitFor(t, func() bool { return d.Ready() })
	self := *d.Lease()
	reg.send(t, subnet.Event{Type: subnet.EventRemoved, Lease: self})
	var rep2 PolicyReporter
	select {
	case rep2 = <-pr.reps:
	case <-time.After(5 * time.Second):
		t.Fatal("no new session after the lease was lost")
	}
	time.Sleep(300 * time.Millisecond)
	if d.Ready() || gauge(t, preg, "weft_ready") != 0 || gauge(t, preg, "weft_network_policy_ready") != 0 {
		t.Fatalf("new session before its controller committed: ready %v, weft_ready %v, weft_network_policy_ready %v",
			d.Ready(), gauge(t, preg, "weft_ready"), gauge(t, preg, "weft_network_policy_ready"))
	}
	rep2.Programmed(nil)
	waitFor(t, func() bool { return d.Ready() && gauge(t, preg, "weft_ready") == 1 })
}
