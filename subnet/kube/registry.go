// Package kube is the Kubernetes registry: node subnets are the podCIDRs
// that Kubernetes assigns (spec.podCIDR / spec.podCIDRs), and each node
// publishes its lease as Flannel-compatible annotations on its own Node
// object, so weft and flanneld nodes of one cluster see each other.
//
// Writes are strategic-merge patches on the nodes/<name>/status subresource,
// which is all the RBAC in kube-manifests/ grants besides reading nodes.
package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/weft-net/weft/subnet"
)

// DefaultConfigFile is where the kube-weft ConfigMap mounts net-conf.json
// (Flannel's path).
const DefaultConfigFile = "/etc/kube-flannel/net-conf.json"

// Options configures a Registry.
type Options struct {
	// NodeName is this node's Node object (the pod's spec.nodeName, passed
	// as NODE_NAME in the DaemonSet). Required.
	NodeName string
	// AnnotationPrefix defaults to DefaultAnnotationPrefix.
	AnnotationPrefix string
	// ConfigFile is the network config (net-conf.json); defaults to
	// DefaultConfigFile.
	ConfigFile string
	// PodCIDRPoll is the first delay between looks at a node that has no
	// podCIDR yet; it doubles up to 5 s. Defaults to 200 ms.
	PodCIDRPoll time.Duration
	// Rejections records nodes whose lease annotations do not parse (logged
	// once per node, counted); nil: logged once per node to the registry's
	// logger.
	Rejections *subnet.Rejections
	// FlannelCondition makes SetNetworkAvailable write flanneld's reason
	// and message (FlannelNetworkAvailableReason) instead of weft's, for a
	// weftd that runs as flanneld.
	FlannelCondition bool
}

// Registry is a subnet.Registry on the Kubernetes API. Leases never expire:
// a node keeps its podCIDR for its lifetime.
type Registry struct {
	nodes Nodes
	opts  Options
	ann   annotations
	log   *slog.Logger
}

var _ subnet.Registry = (*Registry)(nil)

// New returns a registry for the node opts.NodeName, reading and patching
// Node objects through nodes.
func New(nodes Nodes, opts Options, log *slog.Logger) (*Registry, error) {
	if opts.NodeName == "" {
		return nil, errors.New("kube registry: node name is required (set NODE_NAME)")
	}
	if opts.AnnotationPrefix == "" {
		opts.AnnotationPrefix = DefaultAnnotationPrefix
	}
	if opts.ConfigFile == "" {
		opts.ConfigFile = DefaultConfigFile
	}
	if opts.PodCIDRPoll <= 0 {
		opts.PodCIDRPoll = 200 * time.Millisecond
	}
	ann, err := newAnnotations(opts.AnnotationPrefix)
	if err != nil {
		return nil, fmt.Errorf("kube registry: %w", err)
	}
	log = log.With("component", "kube-registry", "node", opts.NodeName)
	if opts.Rejections == nil {
		opts.Rejections = subnet.NewRejections(log, nil)
	}
	return &Registry{nodes: nodes, opts: opts, ann: ann, log: log}, nil
}

// Config reads and parses the network config file.
func (r *Registry) Config(ctx context.Context) (*subnet.Config, error) {
	b, err := os.ReadFile(r.opts.ConfigFile)
	if err != nil {
		return nil, fmt.Errorf("kube registry: read network config: %w", err)
	}
	cfg, err := subnet.ParseConfig(b)
	if err != nil {
		return nil, fmt.Errorf("kube registry: network config %s: %w", r.opts.ConfigFile, err)
	}
	return cfg, nil
}

// Acquire returns the lease for this node's podCIDRs, waiting (until ctx
// ends) for Kubernetes to assign them, and publishes attrs as the node's
// annotations. The public IPs in the returned lease are the effective ones:
// the public-ip-overwrite or node-public-ip annotations win over attrs.
// The hints are ignored: Kubernetes chooses the subnets.
func (r *Registry) Acquire(ctx context.Context, attrs subnet.LeaseAttrs, _ ...netip.Prefix) (subnet.Lease, error) {
	cfg, err := r.Config(ctx)
	if err != nil {
		return subnet.Lease{}, err
	}
	node, err := r.waitForPodCIDR(ctx)
	if err != nil {
		return subnet.Lease{}, err
	}
	lease, err := r.leaseSubnets(cfg, node)
	if err != nil {
		return subnet.Lease{}, fmt.Errorf("kube registry: %w", err)
	}
	if lease.Attrs, err = r.ann.effectiveAttrs(node, attrs); err != nil {
		return subnet.Lease{}, fmt.Errorf("kube registry: %w", err)
	}
	if lease.Attrs.PublicIP != attrs.PublicIP || lease.Attrs.PublicIPv6 != attrs.PublicIPv6 {
		r.log.Info("public IP set by node annotation", "publicIP", lease.Attrs.PublicIP, "publicIPv6", lease.Attrs.PublicIPv6)
	}
	want, err := r.ann.leaseAnnotations(cfg, lease.Attrs)
	if err != nil {
		return subnet.Lease{}, fmt.Errorf("kube registry: node %s: %w", node.Name, err)
	}
	if needsPatch(node, want) {
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": want}})
		if err != nil {
			return subnet.Lease{}, fmt.Errorf("kube registry: encode annotations: %w", err)
		}
		if _, err := r.nodes.Patch(ctx, node.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
			return subnet.Lease{}, fmt.Errorf("kube registry: annotate node %s: %w", node.Name, err)
		}
		r.log.Info("published lease annotations", "subnet", lease.Subnet, "ipv6Subnet", lease.IPv6Subnet)
	}
	return lease, nil
}

// leaseSubnets picks the node's podCIDRs of the enabled families and checks
// that they lie inside the configured networks.
func (r *Registry) leaseSubnets(cfg *subnet.Config, node *corev1.Node) (subnet.Lease, error) {
	v4, v6, err := podCIDRs(node)
	if err != nil {
		return subnet.Lease{}, err
	}
	var l subnet.Lease
	for _, f := range []struct {
		on      bool
		cidr    netip.Prefix
		network netip.Prefix
		family  string
		dst     *netip.Prefix
	}{
		{cfg.EnableIPv4, v4, cfg.Network, "IPv4", &l.Subnet},
		{cfg.EnableIPv6, v6, cfg.IPv6Network, "IPv6", &l.IPv6Subnet},
	} {
		if !f.on {
			continue
		}
		if !f.cidr.IsValid() {
			return subnet.Lease{}, fmt.Errorf("node %s has no %s podCIDR (podCIDRs %v) but the network config enables %s",
				node.Name, f.family, node.Spec.PodCIDRs, f.family)
		}
		if f.cidr.Bits() < f.network.Bits() || !f.network.Contains(f.cidr.Addr()) {
			return subnet.Lease{}, fmt.Errorf("node %s: podCIDR %s is outside the network %s of the network config (the controller-manager's --cluster-cidr must match it)",
				node.Name, f.cidr, f.network)
		}
		*f.dst = f.cidr
	}
	return l, nil
}

// waitForPodCIDR gets this node until it has a podCIDR.
func (r *Registry) waitForPodCIDR(ctx context.Context) (*corev1.Node, error) {
	delay := r.opts.PodCIDRPoll
	var lastLog time.Time
	for {
		node, err := r.nodes.Get(ctx, r.opts.NodeName, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("kube registry: get node %s: %w", r.opts.NodeName, err)
		}
		if node.Spec.PodCIDR != "" || len(node.Spec.PodCIDRs) > 0 {
			return node, nil
		}
		if time.Since(lastLog) > 30*time.Second {
			r.log.Info(fmt.Sprintf("waiting for node %s to get a podCIDR (is kube-controller-manager running with --allocate-node-cidrs?)", r.opts.NodeName))
			lastLog = time.Now()
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("kube registry: waiting for node %s to get a podCIDR: %w", r.opts.NodeName, ctx.Err())
		case <-time.After(delay):
		}
		delay = min(2*delay, 5*time.Second)
	}
}

// NodePublicIPs returns the addresses set in this node's node-public-ip and
// node-public-ipv6 annotations (invalid when not set). flanneld reads them
// before it picks its interface: with no --iface, the device holding that
// address carries the overlay.
func (r *Registry) NodePublicIPs(ctx context.Context) (v4, v6 netip.Addr, err error) {
	node, err := r.nodes.Get(ctx, r.opts.NodeName, metav1.GetOptions{})
	if err != nil {
		return v4, v6, fmt.Errorf("kube registry: get node %s: %w", r.opts.NodeName, err)
	}
	for _, f := range []struct {
		name string
		v6   bool
		dst  *netip.Addr
	}{{r.ann.nodePublicIP, false, &v4}, {r.ann.nodePublicIPv6, true, &v6}} {
		s := node.Annotations[f.name]
		if s == "" {
			continue
		}
		if *f.dst, err = parseIP(s, f.v6); err != nil {
			return netip.Addr{}, netip.Addr{}, fmt.Errorf("kube registry: node %s: annotation %s: %w", node.Name, f.name, err)
		}
	}
	return v4, v6, nil
}

// Renew returns l: leases in Kubernetes do not expire.
func (r *Registry) Renew(_ context.Context, l subnet.Lease) (subnet.Lease, error) { return l, nil }

// The reasons and messages of the NetworkUnavailable=False condition that
// SetNetworkAvailable writes: weft's own, and flanneld's (with
// Options.FlannelCondition).
const (
	NetworkAvailableReason         = "WeftIsUp"
	NetworkAvailableMessage        = "weft is running on this node"
	FlannelNetworkAvailableReason  = "FlannelIsUp"
	FlannelNetworkAvailableMessage = "Flannel is running on this node"
)

// SetNetworkAvailable sets the node condition NetworkUnavailable=False; the
// daemon calls it once the dataplane is programmed. note, when not empty,
// follows the message in parentheses (a dataplane that runs in place of the
// configured one, and why). It writes nothing when
// the condition is already False with this registry's reason; a False
// condition with another reason (written by flanneld, or by weft in its
// other mode) gets this one's, keeping its transition time.
func (r *Registry) SetNetworkAvailable(ctx context.Context, note string) error {
	node, err := r.nodes.Get(ctx, r.opts.NodeName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("kube registry: get node %s: %w", r.opts.NodeName, err)
	}
	now := metav1.Now()
	cond := corev1.NodeCondition{
		Type:               corev1.NodeNetworkUnavailable,
		Status:             corev1.ConditionFalse,
		Reason:             NetworkAvailableReason,
		Message:            NetworkAvailableMessage,
		LastTransitionTime: now,
		LastHeartbeatTime:  now,
	}
	if r.opts.FlannelCondition {
		cond.Reason, cond.Message = FlannelNetworkAvailableReason, FlannelNetworkAvailableMessage
	}
	if note != "" {
		cond.Message += " (" + note + ")"
	}
	for _, c := range node.Status.Conditions {
		if c.Type != corev1.NodeNetworkUnavailable || c.Status != corev1.ConditionFalse {
			continue
		}
		if c.Reason == cond.Reason && c.Message == cond.Message {
			return nil
		}
		cond.LastTransitionTime = c.LastTransitionTime
	}
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{cond}}})
	if err != nil {
		return fmt.Errorf("kube registry: encode node condition: %w", err)
	}
	if _, err := r.nodes.PatchStatus(ctx, r.opts.NodeName, patch); err != nil {
		return fmt.Errorf("kube registry: set NetworkUnavailable=False on node %s: %w", r.opts.NodeName, err)
	}
	r.log.Info("node condition NetworkUnavailable=False set", "reason", cond.Reason)
	return nil
}
