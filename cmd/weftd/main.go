// Command weftd is weft's node daemon: it leases this node's pod subnet from
// etcd or the Kubernetes API, writes the subnet file for the CNI plugin, and
// programs the VXLAN dataplane towards every other node.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

func main() {
	tuneGC()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[0], os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) { // -h, --help: the usage was printed
			return
		}
		fmt.Fprintln(os.Stderr, "weftd:", err)
		os.Exit(1)
	}
}
