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
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/weft-net/weft/internal/flagenv"
	"github.com/weft-net/weft/internal/ops/inspect"
	"github.com/weft-net/weft/internal/ops/lab"
	"github.com/weft-net/weft/internal/ops/web"
	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/subnet/etcd"
	"github.com/weft-net/weft/subnet/kube"
)

// store says where the leases are: etcd (weftd's flags and WEFT_*
// variables), the Kubernetes API (--kubeconfig), or the local lab (--lab).
type store struct {
	etcd                       flagenv.Etcd
	kubeconfig, netConf, annot string
	lab                        bool
	stateDir                   string
}

func (s *store) register(fs *flag.FlagSet) {
	set := &flagenv.Set{FS: fs}
	s.etcd.Register(set)
	set.String(&s.kubeconfig, "kubeconfig", "", "read leases from the Kubernetes API with this kubeconfig instead of etcd")
	set.String(&s.netConf, "net-config-path", kube.DefaultConfigFile, "network config file (Kubernetes mode)")
	set.String(&s.annot, "kube-annotation-prefix", "flannel.alpha.coreos.com", "prefix of the node annotations (Kubernetes mode)")
	fs.BoolVar(&s.lab, "lab", false, "use the local lab (see \"weftctl lab up\")")
	fs.StringVar(&s.stateDir, "state-dir", env("lab-state-dir", lab.DefaultStateDir), "state directory of the lab (with --lab)")
}

// env returns WEFT_<NAME> (upper case, dashes as underscores) or def.
func env(name, def string) string {
	if v, ok := os.LookupEnv(flagenv.Name(name)); ok {
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
	s.etcd.Endpoints, s.etcd.Prefix, s.kubeconfig = st.Etcd, st.EtcdPfx, ""
	return st, nil
}

// kind names the datastore without its address or credentials.
func (s *store) kind() string {
	if s.kubeconfig != "" {
		return "Kubernetes API"
	}
	return "etcd"
}

// secrets are the datastore settings no page may show: credentials,
// key and certificate paths, each endpoint with its host:port, host and
// user information, the kubeconfig path.
func (s *store) secrets() []string {
	e := s.etcd
	return append([]string{e.Password, e.Username, e.KeyFile, e.CertFile, e.CAFile, e.Endpoints, s.kubeconfig},
		web.EndpointSecrets(e.Endpoints)...)
}

func (s *store) etcdClient() (*clientv3.Client, error) {
	return etcd.NewClient(s.etcd.ClientConfig())
}

// leases returns every lease and the network config, and a description of
// where they came from.
func (s *store) leases(ctx context.Context, log *slog.Logger) ([]subnet.Lease, *subnet.Config, string, error) {
	ls, cfg, from, err := s.listed(ctx, log)
	return inspect.Leases(ls), cfg, from, err
}

// listed is leases with the TTL each etcd lease was granted for (none from
// the Kubernetes API).
func (s *store) listed(ctx context.Context, log *slog.Logger) ([]inspect.Listed, *subnet.Config, string, error) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if s.kubeconfig != "" {
		c, err := kube.NewClient(s.kubeconfig)
		if err != nil {
			return nil, nil, "", err
		}
		opts := kube.Options{NodeName: "weftctl", AnnotationPrefix: s.annot, ConfigFile: s.netConf}
		ls, cfg, err := kubeLeases(ctx, c, opts, log)
		listed := make([]inspect.Listed, len(ls))
		for i, l := range ls {
			listed[i] = inspect.Listed{Lease: l}
		}
		return listed, cfg, "Kubernetes API (" + s.kubeconfig + ")", err
	}
	c, err := s.etcdClient()
	if err != nil {
		return nil, nil, "", err
	}
	defer c.Close()
	cfg, err := inspect.EtcdConfig(ctx, c, s.etcd.Prefix)
	if errors.Is(err, context.DeadlineExceeded) {
		return nil, nil, "", fmt.Errorf("etcd %s: %w: no answer; check that etcd listens there, the --etcd-* TLS flags, and a firewall between", s.etcd.Endpoints, err)
	}
	if err != nil {
		return nil, nil, "", fmt.Errorf("etcd %s: %w", s.etcd.Endpoints, err)
	}
	ls, bad, err := inspect.EtcdLeases(ctx, c, s.etcd.Prefix)
	if err != nil {
		return nil, nil, "", fmt.Errorf("etcd %s: %w", s.etcd.Endpoints, err)
	}
	for _, b := range bad {
		log.Warn("skipping an unreadable lease", "err", b)
	}
	return ls, cfg, "etcd " + s.etcd.Endpoints + " " + s.etcd.Prefix + "/subnets/", nil
}

// kubeLeases reads the leases from the node objects through the
// Kubernetes registry's watch (its first batch is the current leases).
// opts.NodeName only names the reader: weftctl acquires nothing.
func kubeLeases(ctx context.Context, c kube.Nodes, opts kube.Options, log *slog.Logger) ([]subnet.Lease, *subnet.Config, error) {
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
