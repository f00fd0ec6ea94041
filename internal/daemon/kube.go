//go:build !weft_nokube

package daemon

import (
	"context"
	"log/slog"
	"os"

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
