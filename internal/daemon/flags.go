package daemon

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/weft-net/weft/internal/flagenv"
	"github.com/weft-net/weft/subnet"
)

// config is weftd's command line. Every flag falls back to an environment
// variable WEFT_<FLAG> (upper case, dashes as underscores), and then to
// flanneld's FLANNELD_<FLAG>. weftd also takes every flanneld flag (see
// flannel.go); started as flanneld or with --flannel-compat it takes
// flanneld's defaults.
type config struct {
	etcd     flagenv.Etcd
	leaseTTL time.Duration

	kubeSubnetMgr   bool
	kubeconfig      string
	kubeAPIURL      string
	kubeAnnotPrefix string
	netConfPath     string
	nodeName        string
	presenceTTL     time.Duration
	setNodeNetUnav  bool

	ifaces        []string
	ifaceRegexes  []string
	ifaceCanReach string
	publicIP      string
	publicIPv6    string
	subnetFile    string
	ipMasq        bool
	networkPolicy bool
	// vxlanPeerFilter: the vxlan backend admits VXLAN datagrams from
	// peers only.
	vxlanPeerFilter   bool
	flows             bool
	flowLogGroup      int
	flowConntrackAcct bool
	procSys           string // where the sysctls are ("": /proc/sys); tests change it
	addressStore      string
	podBridge         string
	renewMargin       time.Duration
	backend           string
	dataplaneNice     int
	healthAddr        string
	logFormat         string
	logLevel          string
	version           bool

	flannel flannelFlags
	// compat is set when weftd runs as flanneld: started under that name
	// or with --flannel-compat.
	compat bool
	// envApplied names the FLANNELD_* variables that set a flag (names
	// only: a value may be a secret).
	envApplied []string
}

// defaults are the flag defaults that differ between weft and flanneld.
type defaults struct {
	etcdEndpoints string
	ipMasq        bool
	healthAddr    string
	networkPolicy bool
}

var (
	weftDefaults    = defaults{etcdEndpoints: "http://127.0.0.1:2379", ipMasq: true, healthAddr: "127.0.0.1:9470", networkPolicy: true}
	flannelDefaults = defaults{etcdEndpoints: "http://127.0.0.1:4001,http://127.0.0.1:2379", ipMasq: false, healthAddr: "", networkPolicy: false}
)

// parseFlags parses the command line of a weftd started as prog.
func parseFlags(prog string, args []string, stderr io.Writer) (*config, error) {
	c := &config{compat: wantsCompat(prog, args)}
	def := weftDefaults
	if c.compat {
		def = flannelDefaults
	}
	fs := flag.NewFlagSet("weftd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	s := &flagenv.Set{FS: fs}
	c.etcd.DefaultEndpoints = def.etcdEndpoints
	c.etcd.Register(s)
	s.String(&c.kubeconfig, "kubeconfig", "", "kubeconfig file (Kubernetes mode; in-cluster config when empty)")
	s.String(&c.kubeAnnotPrefix, "kube-annotation-prefix", "flannel.alpha.coreos.com", "prefix of the node annotations")
	s.String(&c.netConfPath, "net-config-path", "/etc/kube-flannel/net-conf.json", "network config file (Kubernetes mode)")
	s.String(&c.nodeName, "node-name", os.Getenv("NODE_NAME"), "this node's name (default $NODE_NAME; with etcd the host name when unset: it names the record that this node advertises its public IP)")
	s.Strings(&c.ifaces, "iface", "underlay device, by name or address; repeat to try several in order (default: the default route's device)")
	s.Strings(&c.ifaceRegexes, "iface-regex", "regular expression selecting the underlay device by name or address; repeatable, tried after --iface")
	s.String(&c.ifaceCanReach, "iface-can-reach", "", "pick the underlay device and address the kernel would use to reach this IP")
	s.String(&c.publicIP, "public-ip", "", "IPv4 address to advertise to other nodes (default: the underlay's)")
	s.String(&c.publicIPv6, "public-ipv6", "", "IPv6 address to advertise to other nodes (default: the underlay's)")
	s.String(&c.subnetFile, "subnet-file", "/run/flannel/subnet.env", "subnet file written for the CNI plugin")
	s.String(&c.backend, "backend", "", "dataplane for this node, overriding the network config: vxlan, uvxlan, host-gw, wireguard, extension or alloc (vxlan given here fails where the kernel has no VXLAN driver; a vxlan network config falls back to uvxlan)")
	s.Int(&c.dataplaneNice, "dataplane-nice", 0, "nice value of weftd's threads while it forwards packets itself (uvxlan), for example -10 so that busy pods cannot starve the dataplane as they cannot starve the kernel's (needs CAP_SYS_NICE); 0 leaves it")
	s.String(&c.healthAddr, "health-addr", def.healthAddr, "address for /healthz, /readyz and /metrics (empty: off)")
	s.String(&c.logFormat, "log-format", "text", "log format: text or json")
	s.String(&c.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	s.Bool(&c.kubeSubnetMgr, "kube-subnet-mgr", false, "lease the subnet from the Kubernetes API (Node.spec.podCIDR) instead of etcd")
	s.Bool(&c.ipMasq, "ip-masq", def.ipMasq, "masquerade pod traffic that leaves the cluster network")
	s.Bool(&c.networkPolicy, "network-policy", def.networkPolicy, "enforce Kubernetes NetworkPolicy for this node's pods in nftables (with --kube-subnet-mgr; default on, off when run as flanneld)")
	s.Bool(&c.vxlanPeerFilter, "vxlan-peer-filter", true, "vxlan backend: accept VXLAN datagrams only from the current peers' public addresses and drop frames from the overlay with a source outside the cluster network (nftables table inet weft-vxlan); false leaves the port open to any host, as Flannel does")
	s.String(&c.podBridge, "pod-bridge", "cni0", "the CNI plugin's bridge (its bridge setting): with --network-policy, IPv6 link-local traffic between pods on it is dropped while a pod of the node is isolated (other bridges are left alone); with uvxlan's fast path, a program on its egress hands the pods' super-packets to their ports whole")
	s.Bool(&c.flows, "flows", true, "keep the node's recent flows and policy verdicts in memory (bounded) and serve them read-only on /flows of --health-addr")
	s.Int(&c.flowLogGroup, "flow-log-group", 2357, "NFLOG group the policy table logs its drops to, rate-limited, for --flows (1 to 65535)")
	s.Bool(&c.flowConntrackAcct, "flow-conntrack-acct", false, "turn on net.netfilter.nf_conntrack_acct in weftd's network namespace so closed flows carry byte and packet counts (a setting for every connection of the host's namespace: opt-in)")
	s.String(&c.addressStore, "pod-address-store", "/var/lib/cni/networks/weft", "weft CNI plugin's address store (<ipam.dataDir>/<network name>), read by --network-policy to tie each pod address to its bridge port and drop frames with another source address; empty: no source checks")
	s.Bool(&c.version, "version", false, "print the version and exit")
	s.Minutes(&c.renewMargin, "subnet-lease-renew-margin", time.Hour, "renew the lease this long before it expires: minutes (flanneld's unit) or a duration")
	s.Duration(&c.leaseTTL, "subnet-lease-ttl", 24*time.Hour, "lifetime of a new etcd lease")
	s.Duration(&c.presenceTTL, "presence-ttl", 60*time.Second, "etcd: how long the record that this node advertises its public IP outlives a weftd that stopped without deleting it (at least 5s)")
	c.flannel.register(s, c)
	if err := s.Err(); err != nil {
		return nil, err
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	applied, err := flagenv.ApplyPrefixed(fs, "FLANNELD")
	if err != nil {
		return nil, err
	}
	c.envApplied = applied
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	c.flannel.apply(c, given)
	if given["network-policy"] && c.networkPolicy && !c.kubeSubnetMgr {
		return nil, errors.New("--network-policy needs --kube-subnet-mgr: NetworkPolicies live in the Kubernetes API")
	}
	return c, c.validate()
}

func (c *config) validate() error {
	if c.backend != "" {
		if err := subnet.CheckBackendType(c.backend); err != nil {
			return fmt.Errorf("--backend: %w", err)
		}
	}
	if c.dataplaneNice < -20 || c.dataplaneNice > 19 {
		return fmt.Errorf("--dataplane-nice %d: must be -20..19", c.dataplaneNice)
	}
	if c.ifaceCanReach != "" {
		if _, err := netip.ParseAddr(c.ifaceCanReach); err != nil {
			return fmt.Errorf("--iface-can-reach %q: not an IP address", c.ifaceCanReach)
		}
	}
	if c.kubeSubnetMgr && c.nodeName == "" && !podNamed() {
		return errors.New("--kube-subnet-mgr needs the node name: set NODE_NAME or --node-name (or POD_NAME and POD_NAMESPACE, as Flannel's manifest does)")
	}
	if c.renewMargin <= 0 || c.leaseTTL <= 0 {
		return errors.New("--subnet-lease-renew-margin and --subnet-lease-ttl must be positive")
	}
	if c.compat && c.renewMargin >= 24*time.Hour {
		return fmt.Errorf("--subnet-lease-renew-margin %s: flanneld takes 1 to 1439 minutes", c.renewMargin)
	}
	if c.flowLogGroup < 1 || c.flowLogGroup > 65535 {
		return fmt.Errorf("--flow-log-group %d: must be between 1 and 65535", c.flowLogGroup)
	}
	if c.flannel.resyncSeconds < 1 {
		return fmt.Errorf("--iptables-resync %d: must be at least 1 (seconds)", c.flannel.resyncSeconds)
	}
	if p := c.flannel.healthzPort; p < 0 || p > 65535 {
		return fmt.Errorf("--healthz-port %d: must be between 0 and 65535", p)
	}
	return nil
}

// healthzAddr is flanneld's health address, from --healthz-ip and
// --healthz-port.
func healthzAddr(ip string, port int) string { return net.JoinHostPort(ip, strconv.Itoa(port)) }

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

// podNamed reports whether weftd runs in a pod that names itself through
// POD_NAME and POD_NAMESPACE (Flannel's manifest), from which the node name
// is read in the Kubernetes API.
func podNamed() bool { return os.Getenv("POD_NAME") != "" && os.Getenv("POD_NAMESPACE") != "" }
