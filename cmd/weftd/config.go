package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/weft-net/weft/internal/flagenv"
)

// config is weftd's command line. Every flag falls back to an environment
// variable WEFT_<FLAG> (upper case, dashes as underscores).
type config struct {
	etcd     flagenv.Etcd
	leaseTTL time.Duration

	kubeSubnetMgr   bool
	kubeconfig      string
	kubeAnnotPrefix string
	netConfPath     string
	nodeName        string

	iface       string
	ifaceRegex  string
	publicIP    string
	publicIPv6  string
	subnetFile  string
	ipMasq      bool
	renewMargin time.Duration
	backend     string
	healthAddr  string
	logFormat   string
	logLevel    string
	version     bool
}

func parseFlags(args []string, stderr io.Writer) (*config, error) {
	c := &config{}
	fs := flag.NewFlagSet("weftd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	s := &flagenv.Set{FS: fs}
	c.etcd.Register(s)
	s.String(&c.kubeconfig, "kubeconfig", "", "kubeconfig file (Kubernetes mode; in-cluster config when empty)")
	s.String(&c.kubeAnnotPrefix, "kube-annotation-prefix", "flannel.alpha.coreos.com", "prefix of the node annotations")
	s.String(&c.netConfPath, "net-config-path", "/etc/kube-flannel/net-conf.json", "network config file (Kubernetes mode)")
	s.String(&c.nodeName, "node-name", os.Getenv("NODE_NAME"), "this node's name (Kubernetes mode; default $NODE_NAME)")
	s.String(&c.iface, "iface", "", "underlay device, by name or address (default: the default route's device)")
	s.String(&c.ifaceRegex, "iface-regex", "", "regular expression selecting the underlay device by name or address")
	s.String(&c.publicIP, "public-ip", "", "IPv4 address to advertise to other nodes (default: the underlay's)")
	s.String(&c.publicIPv6, "public-ipv6", "", "IPv6 address to advertise to other nodes (default: the underlay's)")
	s.String(&c.subnetFile, "subnet-file", "/run/flannel/subnet.env", "subnet file written for the CNI plugin")
	s.String(&c.backend, "backend", "", "dataplane for this node, overriding the network config: vxlan or uvxlan")
	s.String(&c.healthAddr, "health-addr", "127.0.0.1:9470", "address for /healthz, /readyz and /metrics (empty: off)")
	s.String(&c.logFormat, "log-format", "text", "log format: text or json")
	s.String(&c.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	s.Bool(&c.kubeSubnetMgr, "kube-subnet-mgr", false, "lease the subnet from the Kubernetes API (Node.spec.podCIDR) instead of etcd")
	s.Bool(&c.ipMasq, "ip-masq", true, "masquerade pod traffic that leaves the cluster network")
	s.Bool(&c.version, "version", false, "print the version and exit")
	s.Duration(&c.renewMargin, "subnet-lease-renew-margin", time.Hour, "renew the lease this long before it expires")
	s.Duration(&c.leaseTTL, "subnet-lease-ttl", 24*time.Hour, "lifetime of a new etcd lease")
	if err := s.Err(); err != nil {
		return nil, err
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	return c, c.validate()
}

func (c *config) validate() error {
	if c.iface != "" && c.ifaceRegex != "" {
		return errors.New("--iface and --iface-regex exclude each other")
	}
	switch c.backend {
	case "", "vxlan", "uvxlan":
	default:
		return fmt.Errorf("--backend %q: must be vxlan or uvxlan", c.backend)
	}
	if c.kubeSubnetMgr && c.nodeName == "" {
		return errors.New("--kube-subnet-mgr needs the node name: set NODE_NAME or --node-name")
	}
	if c.renewMargin <= 0 || c.leaseTTL <= 0 {
		return errors.New("--subnet-lease-renew-margin and --subnet-lease-ttl must be positive")
	}
	return nil
}

func newLogger(format, level string, w io.Writer) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: %w", level, err)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: must be text or json", format)
}
