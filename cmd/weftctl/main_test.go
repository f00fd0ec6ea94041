package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/testkit/nettest"
)

func TestRunArguments(t *testing.T) {
	t.Setenv("POD_NAME", "") // "connectivity probe outside a pod"
	tests := []struct {
		name     string
		args     []string
		wantErr  string // substring of the error; "" for success
		wantCode int
	}{
		{"no command", nil, "see usage", 2},
		{"help", []string{"help"}, "", 0},
		{"unknown command", []string{"frobnicate"}, `unknown command "frobnicate"`, 1},
		{"explain needs two addresses", []string{"explain", "10.0.0.1"}, "want 2 arguments, got 1", 1},
		{"explain bad source", []string{"explain", "nonsense", "10.0.0.1"}, "source: ", 1},
		{"leases takes no argument", []string{"leases", "x"}, "want 0 arguments", 1},
		{"leases renew margin not positive", []string{"leases", "--subnet-lease-renew-margin", "0"}, "--subnet-lease-renew-margin 0s: must be positive", 1},
		{"leases renew margin not a duration", []string{"leases", "--subnet-lease-renew-margin", "soon"}, "subnet-lease-renew-margin", 1},
		{"lab without subcommand", []string{"lab"}, "see usage", 2},
		{"lab unknown subcommand", []string{"lab", "sideways"}, `unknown command "sideways"`, 1},
		{"lab exec without command", []string{"lab", "exec", "node1"}, "see usage", 2},
		{"lab up without the plugin", []string{"lab", "up", "--weftd", "/bin/true", "--cni-bin", "/nonexistent"}, "--cni-bin /nonexistent", 1},
		{"flag help", []string{"leases", "-h"}, flag.ErrHelp.Error(), 0},
		{"lab -h", []string{"lab", "-h"}, "", 0},
		{"lab help", []string{"lab", "help"}, "", 0},
		{"lab --help", []string{"lab", "--help"}, "", 0},
		{"lab up --help", []string{"lab", "up", "--help"}, flag.ErrHelp.Error(), 0},
		{"lab down -h", []string{"lab", "down", "-h"}, flag.ErrHelp.Error(), 0},
		{"lab status -h", []string{"lab", "status", "-h"}, flag.ErrHelp.Error(), 0},
		{"lab exec -h", []string{"lab", "exec", "-h"}, flag.ErrHelp.Error(), 0},
		{"peers -h", []string{"peers", "-h"}, flag.ErrHelp.Error(), 0},
		{"explain -h", []string{"explain", "-h"}, flag.ErrHelp.Error(), 0},
		{"doctor -h", []string{"doctor", "-h"}, flag.ErrHelp.Error(), 0},
		{"connectivity -h", []string{"connectivity", "-h"}, flag.ErrHelp.Error(), 0},
		{"help doctor", []string{"help", "doctor"}, flag.ErrHelp.Error(), 0},
		{"connectivity probe -h", []string{"connectivity", "probe", "-h"}, flag.ErrHelp.Error(), 0},
		{"connectivity probe outside a pod", []string{"connectivity", "probe", "--port", "0"}, "POD_NAME, POD_NAMESPACE and NODE_NAME must be set", 1},
		{"connectivity with a missing kubeconfig", []string{"connectivity", "--kubeconfig", "/nonexistent/kubeconfig"}, "kubeconfig /nonexistent/kubeconfig", 1},
		{"--help", []string{"--help"}, "", 0},
		{"--version", []string{"--version"}, "", 0},
		{"version", []string{"version"}, "", 0},
		{"flags after the arguments", []string{"explain", "10.0.0.1", "10.0.0.2", "--etcd-endpoints", "http://127.0.0.1:1", "--etcd-prefix", "/nowhere"}, "etcd http://127.0.0.1:1", 1},
		{"lab up --nodes 0", []string{"lab", "up", "--nodes", "0", "--weftd", "/bin/true", "--cni-bin", "/bin", "--state-dir", "/nonexistent/lab"}, "--nodes 0: must be at least 1", 1},
		{"lab up --pods-per-node -1", []string{"lab", "up", "--pods-per-node", "-1"}, "--pods-per-node -1: must be 0 or more", 1},
		{"doctor bad output", []string{"doctor", "-o", "yaml"}, `-o "yaml"`, 1},
		{"lab status of no lab", []string{"lab", "status", "--state-dir", "/nonexistent/lab"}, "no lab", 1},
		{"web -h", []string{"web", "-h"}, flag.ErrHelp.Error(), 0},
		{"flows -h", []string{"flows", "-h"}, flag.ErrHelp.Error(), 0},
		{"flows bad verdict", []string{"flows", "--verdict", "maybe"}, `--verdict "maybe"`, 1},
		{"flows of no weftd", []string{"flows", "--health-addr", "127.0.0.1:1"}, "node local", 1},
		{"web of no lab", []string{"web", "--lab", "--state-dir", "/nonexistent/lab"}, "no lab", 1},
		{"web --listen without port", []string{"web", "--listen", "127.0.0.1"}, "missing port", 1},
		{"web --interval too short", []string{"web", "--interval", "10ms"}, "--interval 10ms: must be at least 100ms", 1},
	}
	// Cases that wait on an etcd that never answers, which store.listed
	// would give 15 s: their error names the endpoint either way.
	waits := map[string]time.Duration{"flags after the arguments": time.Second}
	for name := range waits {
		found := false
		for _, tt := range tests {
			found = found || tt.name == name
		}
		if !found {
			t.Fatalf("waits names %q, which is no case: a renamed case would wait 15 s again", name)
		}
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			if w, ok := waits[tt.name]; ok {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, w)
				defer cancel()
			}
			var out, errOut bytes.Buffer
			err := run(ctx, tt.args, &out, &errOut)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("err = %v", err)
				}
				if out.Len() == 0 {
					t.Error("nothing printed on stdout")
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want %q", err, tt.wantErr)
			}
			if got := exitCode(err); got != tt.wantCode {
				t.Errorf("exit code %d, want %d", got, tt.wantCode)
			}
		})
	}
	if exitCode(errors.Join(errMismatch)) != 2 {
		t.Error("a mismatch must exit 2")
	}
}

func TestUsageTexts(t *testing.T) {
	var out, errOut bytes.Buffer
	run(context.Background(), []string{"leases", "-h"}, &out, &errOut)
	if strings.Contains(errOut.String(), "-lab weftctl") || !strings.Contains(errOut.String(), "  -lab\n") {
		t.Errorf("--lab must read as a switch, not as taking a value:\n%s", errOut.String())
	}
	out.Reset()
	run(context.Background(), []string{"version"}, &out, &errOut)
	if !strings.HasPrefix(out.String(), "weftctl ") {
		t.Errorf("version: %q", out.String())
	}
	out.Reset()
	run(context.Background(), []string{"lab", "help"}, &out, &errOut)
	for _, sub := range []string{"up", "down", "status", "exec"} {
		if !strings.Contains(out.String(), "  "+sub+" ") {
			t.Errorf("lab help lacks %q:\n%s", sub, out.String())
		}
	}
}

// TestBinaryHelp runs the binary: help exits 0 without an error line.
func TestBinaryHelp(t *testing.T) {
	bin := nettest.Binary(t, "weftctl")
	for _, args := range [][]string{{"leases", "-h"}, {"lab", "up", "--help"}, {"doctor", "--help"}, {"lab", "help"}, {"--version"}} {
		out, err := exec.Command(bin, args...).CombinedOutput()
		if err != nil || strings.Contains(string(out), "help requested") || strings.Contains(string(out), "weftctl: ") {
			t.Errorf("weftctl %v: %v:\n%s", args, err, out)
		}
	}
}

// TestWebListenFromEnvironment: WEFT_WEB_LISTEN may move the page to
// another loopback port, never to a non-local address; that takes
// --listen on the command line.
func TestWebListenFromEnvironment(t *testing.T) {
	// 192.0.2.1 (TEST-NET-1) is no address of this host: should the check
	// let it through, listening fails instead of opening a port.
	t.Setenv("WEFT_WEB_LISTEN", "192.0.2.1:9471")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var out, errOut bytes.Buffer
	err := run(ctx, []string{"web"}, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "not a loopback address") {
		t.Errorf("web with WEFT_WEB_LISTEN=192.0.2.1:9471: %v, want a refusal", err)
	}
}
