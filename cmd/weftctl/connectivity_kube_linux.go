package main

import (
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/weft-net/weft/internal/ops/connectivity"
	"github.com/weft-net/weft/internal/ops/connectivity/kubeprobe"
)

// kubeFlags are connectivity's flags in Kubernetes mode.
type kubeFlags struct {
	namespace, image string
	port             int
}

func (k *kubeFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&k.namespace, "namespace", env("connectivity-namespace", "weft-connectivity"), "with --kubeconfig: the namespace of the probe DaemonSet (kube-manifests/weft-connectivity.yml)")
	fs.StringVar(&k.image, "image", env("connectivity-image", defaultImage()), "with --kubeconfig: the probes' image, with weftctl on its PATH")
	fs.IntVar(&k.port, "port", connectivity.DefaultTCPPort, "with --kubeconfig: the probes' TCP echo port")
}

// defaultImage is the image kube-manifests/kube-weft.yml runs.
func defaultImage() string { return "ghcr.io/weft-net/weft:latest" }

// kube measures the pod network of a Kubernetes cluster with a probe
// DaemonSet that it creates and deletes.
func (c *connFlags) kube(ctx context.Context, w, stderr io.Writer) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", c.s.kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig %s: %w", c.s.kubeconfig, err)
	}
	cli, err := kubeprobe.NewClient(cfg, c.k.namespace)
	if err != nil {
		return err
	}
	spec := kubeprobe.Spec{Run: runID(), Image: c.k.image, Port: c.k.port, Count: c.count, Timeout: c.timeout.String()}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	res, err := kubeprobe.Run(ctx, cli, kubeprobe.Options{Spec: spec, Wait: c.wait, Timeout: c.timeout, Log: log})
	if res != nil {
		if rerr := res.Render(w); rerr != nil {
			return rerr
		}
	}
	if err != nil && ctx.Err() != nil {
		return errors.New("interrupted (probe DaemonSets deleted, unless a warning above says otherwise)")
	}
	if err != nil {
		return err
	}
	if res.Failures() > 0 {
		return errDoctor{2}
	}
	return nil
}

// runID is a short random name for one run, valid in a DNS label.
func runID() string {
	const letters = "bcdfghjklmnpqrstvwxz2456789"
	b := make([]byte, 6)
	rand.Read(b)
	for i := range b {
		b[i] = letters[int(b[i])%len(letters)]
	}
	return string(b)
}

const probeUsage = `usage: weftctl connectivity probe [flags]

The program of the probe DaemonSets' pods (weftctl connectivity --kubeconfig
creates them): it answers TCP exchanges on --port (with --host, on the node's
network, on the node's VTEP address, which it writes on its own pod), waits
for the list of the other probes on its own pod, measures them, writes its
results on its own pod and serves until the pod is deleted. It reads POD_NAME, POD_NAMESPACE and
NODE_NAME, and the pod's service account (or --kubeconfig).
`

func runProbe(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("weftctl connectivity probe", flag.ContinueOnError)
	fs.SetOutput(stderr)
	port := fs.Int("port", connectivity.DefaultTCPPort, "TCP echo port")
	count := fs.Int("count", 3, "echo requests per peer")
	timeout := fs.Duration("timeout", time.Second, "wait for each reply and TCP exchange")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig (default: the pod's service account)")
	host := fs.Bool("host", false, "on the node's network: listen on the node's VTEP address and measure the others' (node to node)")
	fs.Usage = func() { fmt.Fprint(stderr, probeUsage); fs.PrintDefaults() }
	if err := parse(fs, args, 0); err != nil {
		return err
	}
	pod, ns, node := os.Getenv("POD_NAME"), os.Getenv("POD_NAMESPACE"), os.Getenv("NODE_NAME")
	if pod == "" || ns == "" || node == "" {
		return errors.New("connectivity probe: POD_NAME, POD_NAMESPACE and NODE_NAME must be set (the DaemonSet sets them)")
	}
	var cfg *rest.Config
	var err error
	if *kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", *kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return fmt.Errorf("connectivity probe: kubernetes client config: %w", err)
	}
	cli, err := kubeprobe.NewClient(cfg, ns)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	return kubeprobe.Probe(ctx, cli, kubeprobe.ProbeConfig{Pod: pod, Node: node, Port: *port, Host: *host,
		Options: connectivity.Options{Count: *count, Timeout: *timeout}, Log: log})
}
