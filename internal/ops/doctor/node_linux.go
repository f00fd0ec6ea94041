package doctor

import (
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"

	"github.com/weft-net/weft/internal/ops/connectivity"
	"github.com/weft-net/weft/subnet"
)

// Node is what the doctor examines: a node's network namespace (through
// Handle and Do), what the datastore says, and where weftd and the runtime
// keep their files.
type Node struct {
	Name       string           // how the report names the node
	Handle     *netlink.Handle  // bound to the node's network namespace
	Do         connectivity.Do  // enters the node's namespace; nil: this process's own
	Leases     []subnet.Lease   // every lease in the datastore
	Config     *subnet.Config   // the network config
	Source     string           // where the leases came from, for the evidence
	SubnetFile string           // the subnet file weftd writes
	CNIConfDir string           // where the runtime reads its CNI config; "" skips the check
	HealthAddr string           // weftd's health address; "" skips the check
	Device     string           // overlay device; "" finds it (see inspect.FindDevice)
	Kube       *KubeNode        // Kubernetes mode: this node's object; nil otherwise
	Probe      ProbeOptions     // the active probes to the peers
	Now        func() time.Time // time.Now when nil
}

// KubeNode is the node object in Kubernetes mode.
type KubeNode struct {
	Node             *corev1.Node
	AnnotationPrefix string // flannel.alpha.coreos.com unless set
}

// ProbeOptions tune the active probes.
type ProbeOptions struct {
	Skip    bool          // no active probe at all
	Count   int           // echo requests per peer; 3
	Timeout time.Duration // per request; 1s
}
