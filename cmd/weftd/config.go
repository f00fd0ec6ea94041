package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"
)

// config is weftd's command line. Every flag falls back to an environment
// variable WEFT_<FLAG> (upper case, dashes as underscores).
type config struct {
	etcdEndpoints string
	etcdPrefix    string
	etcdCAFile    string
	etcdCertFile  string
	etcdKeyFile   string
	etcdUsername  string
	etcdPassword  string
	leaseTTL      time.Duration

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
	str := func(p *string, name, def, usage string) { fs.StringVar(p, name, env(name, def), usage) }
	str(&c.etcdEndpoints, "etcd-endpoints", "http://127.0.0.1:2379", "comma-separated etcd endpoints (http://, https:// or unix://)")
	str(&c.etcdPrefix, "etcd-prefix", "/coreos.com/network", "etcd prefix holding config and subnets/")
	str(&c.etcdCAFile, "etcd-cafile", "", "CA certificate for etcd TLS")
	str(&c.etcdCertFile, "etcd-certfile", "", "client certificate for etcd TLS")
	str(&c.etcdKeyFile, "etcd-keyfile", "", "client key for etcd TLS")
	str(&c.etcdUsername, "etcd-username", "", "etcd user name")
	str(&c.etcdPassword, "etcd-password", "", "etcd password")
	str(&c.kubeconfig, "kubeconfig", "", "kubeconfig file (Kubernetes mode; in-cluster config when empty)")
	str(&c.kubeAnnotPrefix, "kube-annotation-prefix", "flannel.alpha.coreos.com", "prefix of the node annotations")
	str(&c.netConfPath, "net-config-path", "/etc/kube-flannel/net-conf.json", "network config file (Kubernetes mode)")
	str(&c.nodeName, "node-name", os.Getenv("NODE_NAME"), "this node's name (Kubernetes mode; default $NODE_NAME)")
	str(&c.iface, "iface", "", "underlay device, by name or address (default: the default route's device)")
	str(&c.ifaceRegex, "iface-regex", "", "regular expression selecting the underlay device by name or address")
	str(&c.publicIP, "public-ip", "", "IPv4 address to advertise to other nodes (default: the underlay's)")
	str(&c.publicIPv6, "public-ipv6", "", "IPv6 address to advertise to other nodes (default: the underlay's)")
	str(&c.subnetFile, "subnet-file", "/run/flannel/subnet.env", "subnet file written for the CNI plugin")
	str(&c.backend, "backend", "", "dataplane for this node, overriding the network config: vxlan or uvxlan")
	str(&c.healthAddr, "health-addr", "127.0.0.1:9470", "address for /healthz, /readyz and /metrics (empty: off)")
	str(&c.logFormat, "log-format", "text", "log format: text or json")
	str(&c.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	boolFlag := func(p *bool, name string, def bool, usage string) error {
		v, err := envBool(name, def)
		fs.BoolVar(p, name, v, usage)
		return err
	}
	durFlag := func(p *time.Duration, name string, def time.Duration, usage string) error {
		v, err := envDuration(name, def)
		fs.DurationVar(p, name, v, usage)
		return err
	}
	errs := []error{
		boolFlag(&c.kubeSubnetMgr, "kube-subnet-mgr", false, "lease the subnet from the Kubernetes API (Node.spec.podCIDR) instead of etcd"),
		boolFlag(&c.ipMasq, "ip-masq", true, "masquerade pod traffic that leaves the cluster network"),
		boolFlag(&c.version, "version", false, "print the version and exit"),
		durFlag(&c.renewMargin, "subnet-lease-renew-margin", time.Hour, "renew the lease this long before it expires"),
		durFlag(&c.leaseTTL, "subnet-lease-ttl", 24*time.Hour, "lifetime of a new etcd lease"),
	}
	if err := errors.Join(errs...); err != nil {
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

func env(flagName, def string) string {
	if v, ok := os.LookupEnv(envName(flagName)); ok {
		return v
	}
	return def
}

func envName(flagName string) string {
	return "WEFT_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

func envBool(flagName string, def bool) (bool, error) {
	s, ok := os.LookupEnv(envName(flagName))
	if !ok {
		return def, nil
	}
	v, err := strconv.ParseBool(s)
	if err != nil {
		return def, fmt.Errorf("%s=%q: not a boolean", envName(flagName), s)
	}
	return v, nil
}

func envDuration(flagName string, def time.Duration) (time.Duration, error) {
	s, ok := os.LookupEnv(envName(flagName))
	if !ok {
		return def, nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return def, fmt.Errorf("%s=%q: not a duration", envName(flagName), s)
	}
	return v, nil
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
