//go:build !weft_nokube

package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/weft-net/weft/policy"
	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/subnet/kube"
)

// kubeClientBuilt says whether this build has the Kubernetes registry (a
// build with -tags weft_nokube leaves client-go out).
const kubeClientBuilt = true

// newKubeRegistry builds the Kubernetes registry (in-cluster config unless
// --kubeconfig names a file or --kube-api-url a server). Without a node
// name it reads the node of the pod named by POD_NAMESPACE and POD_NAME, as
// flanneld does.
func newKubeRegistry(ctx context.Context, c *config, rej *subnet.Rejections, log *slog.Logger) (subnet.Registry, error) {
	kube.LogClientGo(log) // client-go's klog lines in weftd's log format
	client, err := kube.NewClientURL(c.kubeAPIURL, c.kubeconfig)
	if err != nil {
		return nil, err
	}
	nodeName := c.nodeName
	if nodeName == "" {
		ns, pod := os.Getenv("POD_NAMESPACE"), os.Getenv("POD_NAME")
		if nodeName, err = kube.PodNodeName(ctx, client, ns, pod); err != nil {
			return nil, err
		}
		log.Info("node name from this pod", "pod", ns+"/"+pod, "node", nodeName)
	}
	return kube.New(client, kubeOptions(c, nodeName, rej), log)
}

// kubeOptions are the Kubernetes registry's options from the command line.
// Run as flanneld, weftd sets flanneld's reason on the node's
// NetworkUnavailable condition.
func kubeOptions(c *config, nodeName string, rej *subnet.Rejections) kube.Options {
	return kube.Options{
		NodeName:         nodeName,
		AnnotationPrefix: c.kubeAnnotPrefix,
		ConfigFile:       c.netConfPath,
		Rejections:       rej,
		FlannelCondition: c.compat,
	}
}

// policyFactory builds the NetworkPolicy controller of --network-policy
// (Kubernetes mode only), or, when it is off, removes the policy table an
// earlier run left: nil then. Nothing about the node makes it fail: a node
// where policy cannot be enforced (no br_netfilter, a setting weftd cannot
// change) gets a runner that says why to the reporter and waits, so that
// the dataplane runs on and weftd reports not ready instead of exiting.
func policyFactory(c *config, log *slog.Logger) (func(*subnet.Config, subnet.Lease, PolicyReporter) (Runner, error), error) {
	if !c.kubeSubnetMgr {
		return nil, nil // etcd mode: no NetworkPolicy objects to enforce
	}
	if !c.networkPolicy {
		if err := policy.Remove(""); err != nil {
			log.Warn("cannot remove the network policy table left from an earlier run", "err", err)
		}
		log.Info("network policy not enforced (--network-policy=false)")
		return nil, nil
	}
	rc, err := kube.RESTConfig(c.kubeAPIURL, c.kubeconfig)
	if err != nil {
		return nil, err
	}
	procSys := c.procSys
	if procSys == "" {
		procSys = "/proc/sys"
	}
	return func(_ *subnet.Config, lease subnet.Lease, rep PolicyReporter) (Runner, error) {
		changed, err := policy.EnsureBridgeNetfilter(procSys)
		if len(changed) > 0 {
			log.Info("network policy: turned on bridged traffic's netfilter hooks in this network namespace, as pods of one node need", "set", changed)
		}
		if err != nil {
			return cannotEnforce{err, rep}, nil
		}
		ctl, err := policy.New(policy.Config{Client: rc, Subnet: lease.Subnet, IPv6Subnet: lease.IPv6Subnet, Reporter: rep,
			AddressStore: c.addressStore, Bridge: c.podBridge, LogGroup: logGroup(c)}, log)
		if err != nil {
			return cannotEnforce{err, rep}, nil
		}
		return ctl, nil
	}, nil
}

// logGroup is the NFLOG group of the policy table's drops: none without
// --flows.
func logGroup(c *config) uint16 {
	if !c.flows || c.healthAddr == "" {
		return 0
	}
	return uint16(c.flowLogGroup)
}

// cannotEnforce is the policy runner of a node where policy cannot be
// enforced: it tells the reporter why and waits.
type cannotEnforce struct {
	err error
	rep PolicyReporter
}

func (r cannotEnforce) Run(ctx context.Context) error {
	r.rep.CannotEnforce(fmt.Errorf("%w; to run without NetworkPolicy, start weftd with --network-policy=false", r.err))
	<-ctx.Done()
	return nil
}
