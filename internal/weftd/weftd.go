// Package weftd is weft's node daemon behind its two commands: cmd/weftd,
// the etcd build, and cmd/weftd-kube, the same daemon with the Kubernetes
// client. The Kubernetes client (client-go and the API types) is a fifth
// of a build's packages and a third of its size; a node on etcd never runs
// it, so its weftd does not carry it. Started with --kube-subnet-mgr, the
// etcd build runs weftd-kube from its own directory in its place (the same
// process, arguments and environment).
package weftd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/weft-net/weft/subnet"
)

// Options is what a command wires into the daemon.
type Options struct {
	// Version is printed by --version and logged at start.
	Version string
	// Kube builds the Kubernetes registry. Nil in the etcd build, which
	// then runs KubeExecutable for --kube-subnet-mgr.
	Kube func(ctx context.Context, c KubeConfig, rej *subnet.Rejections, log *slog.Logger) (subnet.Registry, error)
}

// KubeConfig is the command line of Kubernetes mode.
type KubeConfig struct {
	APIURL, Kubeconfig string
	NodeName           string // empty: the node of the pod named by POD_NAMESPACE and POD_NAME
	AnnotationPrefix   string
	NetConfPath        string
}

// KubeExecutable is the name of the build with the Kubernetes client.
const KubeExecutable = "weftd-kube"

// Main is a weftd command's main: it runs weftd with the process's
// arguments until SIGINT or SIGTERM and exits 1 on an error.
func Main(opts Options) {
	tuneGC()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := Run(ctx, os.Args[0], os.Args[1:], opts); err != nil {
		if errors.Is(err, flag.ErrHelp) { // -h, --help: the usage was printed
			return
		}
		fmt.Fprintln(os.Stderr, "weftd:", err)
		stop()
		os.Exit(1)
	}
}

// execKube replaces this process with weftd-kube from the directory of
// this executable (symbolic links resolved), keeping the arguments (also
// the name weftd was started as), the environment and the open files.
func execKube() error {
	self, err := os.Executable()
	if err == nil {
		self, err = filepath.EvalSymlinks(self)
	}
	if err != nil {
		return fmt.Errorf("--kube-subnet-mgr: find this executable: %w", err)
	}
	path := filepath.Join(filepath.Dir(self), KubeExecutable)
	if _, err := os.Stat(path); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("--kube-subnet-mgr needs %s, the build of weftd with the Kubernetes client, next to weftd (%s): "+
				"install it from the release or the image, or build it with `go build ./cmd/%s`", KubeExecutable, path, KubeExecutable)
		}
		return fmt.Errorf("--kube-subnet-mgr: %w", err)
	}
	if err := syscall.Exec(path, os.Args, os.Environ()); err != nil {
		return fmt.Errorf("--kube-subnet-mgr: run %s: %w", path, err)
	}
	return nil // not reached
}
