// Command weftctl inspects weft: the leases in the datastore, what a node
// has programmed on its overlay device, the path between two pod addresses,
// and it runs a complete multi-node lab on one machine (`weftctl lab up`).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"syscall"

	"github.com/weft-net/weft/subnet/kube"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	kube.LogClientGo(logger(os.Stderr)) // client-go's klog errors as weftctl's warnings are
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		code := exitCode(err)
		var exit *exec.ExitError // lab exec: the command's own status, already explained by it
		var doc errDoctor        // doctor: its report says why
		if !errors.As(err, &exit) && !errors.As(err, &doc) && !errors.Is(err, errUsage) && !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "weftctl:", err)
		}
		os.Exit(code)
	}
}

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

const usage = `usage: weftctl <command> [flags]

Commands for a cluster (etcd flags or WEFT_ETCD_* variables; --kubeconfig for
the Kubernetes API; --lab for the local lab):
  leases                     the leases: subnet, node IP, VTEP MAC, backend, TTL left, renewal (--stale: overdue only)
  peers                      what this node programmed on its overlay device, against the leases
  explain <src-ip> <dst-ip>  the hops a packet takes, from live state
  doctor                     check this node for what breaks an overlay; probe every peer
  connectivity               pod-to-pod and node-to-node matrix: loss, round trip, TCP
                             (Kubernetes: through probe DaemonSets it creates and deletes)
  flows [--follow]           recent flows and NetworkPolicy verdicts (drops name the policy), from every node
  web [--listen 127.0.0.1:9471]  a live page of the overlay and a packet's path (read-only)

A plain Docker host:
  docker-opts [-f subnet-file] [-d env-file] [-daemon-json file]   dockerd's --bip, --mtu, --ip-masq

The local lab (network namespaces on this machine, removed by "lab down"):
  lab up [--nodes N] [--pods-per-node M] [--backend vxlan|uvxlan|mixed] [--web]
  lab status | lab down | lab exec <node|pod> -- <command…>

Run "weftctl <command> -h" for the flags of a command; "weftctl version" for the version.
`

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errUsage
	}
	cmds := map[string]func(context.Context, []string, io.Writer, io.Writer) error{
		"leases":       runLeases,
		"peers":        runPeers,
		"explain":      runExplain,
		"lab":          runLab,
		"doctor":       runDoctor,
		"connectivity": runConnectivity,
		"web":          runWeb,
		"flows":        runFlows,
	}
	cmds["docker-opts"] = runDockerOpts
	switch args[0] {
	case "-h", "-help", "--help", "help":
		if len(args) > 1 && cmds[args[1]] != nil { // "help leases" is "leases -h"
			return cmds[args[1]](ctx, []string{"-h"}, stdout, stderr)
		}
		fmt.Fprint(stdout, usage)
		return nil
	case "-version", "--version", "version":
		fmt.Fprintln(stdout, "weftctl", version)
		return nil
	}
	f, ok := cmds[args[0]]
	if !ok {
		fmt.Fprint(stderr, usage)
		return fmt.Errorf("unknown command %q", args[0])
	}
	return f(ctx, args[1:], stdout, stderr)
}
