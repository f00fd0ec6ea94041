package daemon

import (
	"path/filepath"
	"slices"
	"strings"

	"github.com/weft-net/weft/internal/flagenv"
)

// flannelFlags are flanneld's flags that weft has under another name or not
// at all. weftd accepts every flanneld flag, with flanneld's names, units and
// values, so that a unit file or DaemonSet written for flanneld runs weftd
// unchanged; the ones with no meaning for weft are logged as ignored.
type flannelFlags struct {
	kubeconfigFile    string
	healthzIP         string
	healthzPort       int
	blackholeRoute    bool
	forwardRules      bool
	resyncSeconds     int
	masqRandomDisable bool
	verbosity         int
	vmodule           string
	backtraceAt       string
	compatSwitch      bool
}

func (f *flannelFlags) register(s *flagenv.Set, c *config) {
	s.Bool(&f.compatSwitch, "flannel-compat", false, "run as flanneld: take flanneld's defaults (as when started under the name flanneld)")
	s.String(&f.kubeconfigFile, "kubeconfig-file", "", "flanneld's name for --kubeconfig")
	s.String(&c.kubeAPIURL, "kube-api-url", "", "Kubernetes API server URL (default: from the kubeconfig or the pod's service account)")
	s.Bool(&c.setNodeNetUnav, "set-node-network-unavailable", true, "set the node condition NetworkUnavailable=False once the dataplane is programmed (Kubernetes mode)")
	s.String(&f.healthzIP, "healthz-ip", "0.0.0.0", "flanneld's health address; with --healthz-port it replaces --health-addr")
	s.Int(&f.healthzPort, "healthz-port", 0, "serve /healthz, /readyz and /metrics on --healthz-ip and this port (0: use --health-addr)")
	s.Bool(&f.blackholeRoute, "ip-blackhole-route", false, "add a blackhole route for this node's pod subnet, so its unused addresses are never routed elsewhere")
	s.Bool(&f.forwardRules, "iptables-forward-rules", true, "accept traffic to and from the cluster network in the iptables FORWARD chains (chain WEFT-FWD), whatever --ip-masq says; false removes them")
	s.Int(&f.resyncSeconds, "iptables-resync", 5, "seconds between checks of the iptables-legacy forward rules (nftables rules are checked on every change the kernel notifies)")
	s.Bool(&f.masqRandomDisable, "ip-masq-fully-random-disable", false, "with --ip-masq, masquerade without fully-random source ports, so that a flow keeps its source port when it is free (NAT traversal from pods)")
	s.Int(&f.verbosity, "v", 0, "flanneld's (klog's) verbosity: 2 or more means --log-level debug")
	s.String(&f.vmodule, "vmodule", "", "flanneld's (klog's) per-file verbosity (ignored by weft)")
	s.String(&f.backtraceAt, "log_backtrace_at", "", "flanneld's (klog's) backtrace location (ignored by weft)")
}

// apply folds flanneld's spellings into weft's settings; given holds the
// flags set on the command line or by FLANNELD_* variables.
func (f *flannelFlags) apply(c *config, given map[string]bool) {
	c.compat = c.compat || f.compatSwitch
	if f.kubeconfigFile != "" && c.kubeconfig == "" {
		c.kubeconfig = f.kubeconfigFile
	}
	if f.healthzPort > 0 {
		c.healthAddr = healthzAddr(f.healthzIP, f.healthzPort)
	}
	if f.verbosity >= 2 && !given["log-level"] {
		c.logLevel = "debug"
	}
}

// ignoredFlag is a flanneld flag weftd accepted but does not act on.
type ignoredFlag struct{ flag, reason string }

// ignored lists the flanneld settings in c that weft does not act on, so
// that weftd logs each instead of dropping it silently.
func (c *config) ignored() []ignoredFlag {
	f := c.flannel
	var out []ignoredFlag
	if f.vmodule != "" {
		out = append(out, ignoredFlag{"--vmodule", "weft has no per-file log verbosity; use --log-level"})
	}
	if f.backtraceAt != "" && f.backtraceAt != ":0" {
		out = append(out, ignoredFlag{"--log_backtrace_at", "weft logs no backtraces"})
	}
	if f.masqRandomDisable && !c.ipMasq {
		out = append(out, ignoredFlag{"--ip-masq-fully-random-disable", "used only with --ip-masq"})
	}
	if c.kubeAPIURL != "" && !c.kubeSubnetMgr {
		out = append(out, ignoredFlag{"--kube-api-url", "used only with --kube-subnet-mgr"})
	}
	return out
}

// wantsCompat reports whether weftd runs as flanneld: started under that
// name (for example as /opt/bin/flanneld, the path in Flannel's manifest),
// or with --flannel-compat on the command line or in WEFT_FLANNEL_COMPAT.
func wantsCompat(prog string, args []string) bool {
	if strings.TrimSuffix(filepath.Base(prog), ".exe") == "flanneld" {
		return true
	}
	i := slices.Index(args, "--")
	if i >= 0 {
		args = args[:i]
	}
	for _, a := range args {
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || name != "flannel-compat" {
			continue
		}
		return !hasVal || isTrue(val)
	}
	return isTrue(flagenv.Lookup("flannel-compat"))
}

func isTrue(s string) bool {
	switch strings.ToLower(s) {
	case "1", "t", "true":
		return true
	}
	return false
}
