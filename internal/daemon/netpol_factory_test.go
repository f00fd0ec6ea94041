//go:build !weft_nokube

package daemon

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weft-net/weft/policy"
	"github.com/weft-net/weft/subnet"
)

type recReporter struct{ programmed, cannot chan error }

func (r recReporter) Programmed(err error)    { r.programmed <- err }
func (r recReporter) CannotEnforce(err error) { r.cannot <- err }
func (r recReporter) SourceChecks(error)      {}

// TestPolicyFactoryNeverFails: the causes of the old crash loops. Without
// br_netfilter (an empty procSys) the factory still builds a runner, which
// says why it cannot enforce and runs until the session ends; with the
// bridge settings off it turns them on; a dual-stack and an IPv6-only
// lease get a controller.
func TestPolicyFactoryNeverFails(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	c := &config{kubeSubnetMgr: true, networkPolicy: true, kubeAPIURL: "http://127.0.0.1:1", procSys: t.TempDir()}
	f, err := policyFactory(c, log)
	if err != nil || f == nil {
		t.Fatalf("factory: %v", err)
	}
	dual := subnet.Lease{Subnet: netip.MustParsePrefix("10.244.1.0/24"), IPv6Subnet: netip.MustParsePrefix("fd00:1::/64")}
	rep := recReporter{make(chan error, 10), make(chan error, 10)}
	r, err := f(nil, dual, rep)
	if err != nil {
		t.Fatalf("without br_netfilter: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	select {
	case err := <-rep.cannot:
		if !errors.Is(err, policy.ErrNoBridgeNetfilter) || !strings.Contains(err.Error(), "--network-policy=false") {
			t.Errorf("CannotEnforce(%v)", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no CannotEnforce")
	}
	select {
	case err := <-done:
		t.Fatalf("the runner returned %v before the session ended", err)
	case <-time.After(200 * time.Millisecond):
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}

	bridge := filepath.Join(c.procSys, "net", "bridge")
	if err := os.MkdirAll(bridge, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"bridge-nf-call-iptables", "bridge-nf-call-ip6tables"} {
		if err := os.WriteFile(filepath.Join(bridge, k), []byte("0\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range []subnet.Lease{dual, {IPv6Subnet: dual.IPv6Subnet}} {
		r, err := f(nil, l, rep)
		if err != nil {
			t.Fatalf("lease %v: %v", l, err)
		}
		if _, ok := r.(*policy.Controller); !ok {
			t.Errorf("lease %v %v: runner %T, want a policy controller", l.Subnet, l.IPv6Subnet, r)
		}
	}
	for _, k := range []string{"bridge-nf-call-iptables", "bridge-nf-call-ip6tables"} {
		if b, _ := os.ReadFile(filepath.Join(bridge, k)); strings.TrimSpace(string(b)) != "1" {
			t.Errorf("%s = %q, want 1", k, b)
		}
	}
}
