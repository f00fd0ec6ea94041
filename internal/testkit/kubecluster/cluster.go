// Package kubecluster runs a real multi-node Kubernetes cluster on one
// machine for weft's tests and for anyone who wants to try weft on real
// kubelets: a control plane (etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler) in a network namespace of its own, and worker nodes, each
// a network namespace with private mount and UTS namespaces running
// containerd, kubelet and kube-proxy. All of them hang off one underlay
// bridge in a further namespace. The admin reaches the API server through
// a forwarder listening on the machine's loopback only.
//
// Up leaves the cluster running after the calling process exits (its
// processes are detached and recorded in a state file); Down stops it and
// removes everything Up made: namespaces, cgroups, mounts, processes and
// the state directory, and restores the three machine-wide sysctls kubelet
// writes. Leftovers reports whatever a cluster left behind.
//
// It never changes the root network namespace, and it does not install
// weft: callers apply weft's manifest with kubectl, as users do.
package kubecluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/weft-net/weft/internal/ops/lab"
)

// Prefix starts every namespace and cgroup name of every cluster, followed
// by the cluster's name and a dash. It is not namespace.NamePrefix:
// test/run.sh sweeps those at its start, and a cluster brought up by hand
// must survive that.
const Prefix = "weftkc-"

// NamePrefix is the prefix of the namespaces and cgroups of the cluster
// called name.
func NamePrefix(name string) string { return Prefix + name + "-" }

// Network layout.
var (
	underlayNet  = netip.MustParsePrefix("172.29.0.0/24")
	underlayGW   = netip.MustParseAddr("172.29.0.1") // the bridge in the underlay namespace
	apiserverIP  = netip.MustParseAddr("172.29.0.2")
	firstNodeIP  = netip.MustParseAddr("172.29.0.11")
	serviceCIDR  = "10.96.0.0/16"
	kubernetesIP = "10.96.0.1"
	// ClusterDNS is the Service address kubelet gives pods as their
	// resolver; a DNS Deployment's Service must take it.
	ClusterDNS = "10.96.0.10"
	// ClusterCIDR is the pod network the controller-manager cuts podCIDRs
	// (/24) from; weft's net-conf.json Network must match it.
	ClusterCIDR = "10.244.0.0/16"
)

const apiserverPort = 6443

// Config says what cluster to build.
type Config struct {
	// Name tells clusters apart (1 to 5 lower-case letters or digits):
	// several may run at once, each with its own Dir.
	Name string
	// Dir holds the cluster's state: certificates, configs, logs and each
	// node's containerd root. Down removes it.
	Dir string
	// Nodes is the number of worker nodes.
	Nodes int
	// ProxyMode is kube-proxy's mode: "iptables" (the default) or "nftables".
	ProxyMode string
	// KubeBin holds kube-apiserver, kube-controller-manager, kube-scheduler,
	// kubelet, kube-proxy, kubectl and etcd (test/kube/build.sh).
	KubeBin string
	// CNIBin holds the standard CNI plugins a node's package manager would
	// install (loopback, portmap, …); Up copies them into each node's
	// /opt/cni/bin. weft's own plugin is installed by its DaemonSet.
	CNIBin string
	// SandboxImage is the pause image containerd runs pod sandboxes from.
	SandboxImage string
	// Images are image archives (OCI or docker-archive) imported into every
	// node's containerd before kubelet starts.
	Images []string
}

// State is what Up records for Down and for clients.
type State struct {
	Dir        string   `json:"dir"`
	Prefix     string   `json:"prefix"`     // NamePrefix(Config.Name)
	Kubeconfig string   `json:"kubeconfig"` // the admin's, through the loopback forwarder
	Nodes      []Node   `json:"nodes"`
	Procs      []Daemon `json:"procs"`
	Namespaces []string `json:"namespaces"`
	Cgroups    []string `json:"cgroups"`
	Sysctls    []Sysctl `json:"sysctls"` // values before the first kubelet started
}

// Node is one worker node.
type Node struct {
	Name   string   `json:"name"`   // its hostname and Kubernetes node name
	NetNS  string   `json:"netns"`  // its network namespace, under /run/netns
	IP     string   `json:"ip"`     // its underlay address
	Dir    string   `json:"dir"`    // its state directory
	Holder lab.Proc `json:"holder"` // the process holding its mount and UTS namespaces
	Cgroup string   `json:"cgroup"` // kubelet's cgroupRoot
}

// Daemon is a process Up started, by the name of its log.
type Daemon struct {
	Name string `json:"name"`
	lab.Proc
}

// Sysctl is a machine-wide sysctl and its value.
type Sysctl struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

func stateFile(dir string) string { return filepath.Join(dir, "state.json") }

// ErrNoCluster is returned by LoadState when dir holds no cluster.
var ErrNoCluster = errors.New("kubecluster: no cluster")

// LoadState reads the state Up wrote into dir.
func LoadState(dir string) (*State, error) {
	b, err := os.ReadFile(stateFile(dir))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w in %s", ErrNoCluster, dir)
	}
	if err != nil {
		return nil, fmt.Errorf("kubecluster: read state: %w", err)
	}
	var s State
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("kubecluster: parse %s: %w", stateFile(dir), err)
	}
	return &s, nil
}

// save writes s atomically, so that Down always finds a whole state file,
// even when Up dies half-way.
func (s *State) save() error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("kubecluster: encode state: %w", err)
	}
	tmp := stateFile(s.Dir) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("kubecluster: write state: %w", err)
	}
	if err := os.Rename(tmp, stateFile(s.Dir)); err != nil {
		return fmt.Errorf("kubecluster: write state: %w", err)
	}
	return nil
}

func nodeName(i int) string { return fmt.Sprintf("kc-n%d", i+1) }

func nodeIP(i int) netip.Addr {
	a := firstNodeIP
	for range i {
		a = a.Next()
	}
	return a
}
