package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/client-go/kubernetes"

	"github.com/weft-net/weft/internal/lab"
	"github.com/weft-net/weft/internal/lab/inspect"
	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/subnet/etcd"
	"github.com/weft-net/weft/subnet/kube"
)

// store says where the leases are: etcd (weftd's flags and WEFT_*
// variables), the Kubernetes API (--kubeconfig), or the local lab (--lab).
type store struct {
	endpoints, prefix          string
	caFile, certFile, keyFile  string
	username, password         string
	kubeconfig, netConf, annot string
	lab                        bool
	stateDir                   string
}

func (s *store) register(fs *flag.FlagSet) {
	str := func(p *string, name, def, usage string) { fs.StringVar(p, name, env(name, def), usage) }
	str(&s.endpoints, "etcd-endpoints", "http://127.0.0.1:2379", "comma-separated etcd endpoints (http://, https:// or unix://)")
	str(&s.prefix, "etcd-prefix", "/coreos.com/network", "etcd prefix holding config and subnets/")
	str(&s.caFile, "etcd-cafile", "", "CA certificate for etcd TLS")
	str(&s.certFile, "etcd-certfile", "", "client certificate for etcd TLS")
	str(&s.keyFile, "etcd-keyfile", "", "client key for etcd TLS")
	str(&s.username, "etcd-username", "", "etcd user name")
	str(&s.password, "etcd-password", "", "etcd password")
	str(&s.kubeconfig, "kubeconfig", "", "read leases from the Kubernetes API with this kubeconfig instead of etcd")
	str(&s.netConf, "net-config-path", kube.DefaultConfigFile, "network config file (Kubernetes mode)")
	str(&s.annot, "kube-annotation-prefix", "flannel.alpha.coreos.com", "prefix of the node annotations (Kubernetes mode)")
	fs.BoolVar(&s.lab, "lab", false, "use the local lab (see `weftctl lab up`)")
	fs.StringVar(&s.stateDir, "state-dir", env("lab-state-dir", lab.DefaultStateDir), "state directory of the lab (with --lab)")
}

// env returns WEFT_<NAME> (upper case, dashes as underscores) or def.
func env(name, def string) string {
	if v, ok := os.LookupEnv("WEFT_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))); ok {
		return v
	}
	return def
}

// labState loads the lab's state when --lab is set and points the etcd
// flags at the lab's etcd.
func (s *store) labState() (*lab.State, error) {
	if !s.lab {
		return nil, nil
	}
	st, err := lab.LoadState(s.stateDir)
	if err != nil {
		return nil, fmt.Errorf("--lab: %w (is `weftctl lab up` running?)", err)
	}
	s.endpoints, s.prefix, s.kubeconfig = st.Etcd, st.EtcdPfx, ""
	return st, nil
}

func (s *store) etcdClient() (*clientv3.Client, error) {
	return etcd.NewClient(etcd.ClientConfig{
		Endpoints: strings.Split(s.endpoints, ","),
		CAFile:    s.caFile, CertFile: s.certFile, KeyFile: s.keyFile,
		Username: s.username, Password: s.password,
	})
}

// leases returns every lease and the network config, and a description of
// where they came from.
func (s *store) leases(ctx context.Context, log *slog.Logger) ([]subnet.Lease, *subnet.Config, string, error) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if s.kubeconfig != "" {
		c, err := kube.NewClient(s.kubeconfig)
		if err != nil {
			return nil, nil, "", err
		}
		opts := kube.Options{NodeName: "weftctl", AnnotationPrefix: s.annot, ConfigFile: s.netConf}
		ls, cfg, err := kubeLeases(ctx, c, opts, log)
		return ls, cfg, "Kubernetes API (" + s.kubeconfig + ")", err
	}
	c, err := s.etcdClient()
	if err != nil {
		return nil, nil, "", err
	}
	defer c.Close()
	cfg, err := inspect.EtcdConfig(ctx, c, s.prefix)
	if err != nil {
		return nil, nil, "", fmt.Errorf("etcd %s: %w", s.endpoints, err)
	}
	ls, bad, err := inspect.EtcdLeases(ctx, c, s.prefix)
	if err != nil {
		return nil, nil, "", fmt.Errorf("etcd %s: %w", s.endpoints, err)
	}
	for _, b := range bad {
		log.Warn("skipping an unreadable lease", "err", b)
	}
	return ls, cfg, "etcd " + s.endpoints + " " + s.prefix + "/subnets/", nil
}

// kubeLeases reads the leases from the node objects through the
// Kubernetes registry's watch (its first batch is the current leases).
// opts.NodeName only names the reader: weftctl acquires nothing.
func kubeLeases(ctx context.Context, c kubernetes.Interface, opts kube.Options, log *slog.Logger) ([]subnet.Lease, *subnet.Config, error) {
	r, err := kube.New(c, opts, log)
	if err != nil {
		return nil, nil, err
	}
	cfg, err := r.Config(ctx)
	if err != nil {
		return nil, nil, err
	}
	events := make(chan []subnet.Event, 1)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- r.Watch(wctx, events) }()
	select {
	case batch := <-events:
		ls := make([]subnet.Lease, 0, len(batch))
		for _, e := range batch {
			ls = append(ls, e.Lease)
		}
		inspect.SortLeases(ls)
		return ls, cfg, nil
	case err := <-errc:
		return nil, nil, fmt.Errorf("list nodes: %w", err)
	case <-ctx.Done():
		return nil, nil, errors.New("list nodes: no node publishes a weft or flannel lease (or the API server did not answer)")
	}
}

// logger is weftctl's logger: warnings and errors on stderr.
func logger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// selfPath is the running executable, to find weftd and the plugin next to it.
func selfPath() string {
	p, err := os.Executable()
	if err != nil {
		return ""
	}
	if r, err := filepath.EvalSymlinks(p); err == nil {
		return r
	}
	return p
}
