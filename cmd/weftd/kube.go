package main

import (
	"context"
	"log/slog"
	"os"

	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/subnet/kube"
)

// newKubeRegistry builds the Kubernetes registry (in-cluster config unless
// --kubeconfig names a file or --kube-api-url a server). Without a node
// name it reads the node of the pod named by POD_NAMESPACE and POD_NAME, as
// flanneld does.
func newKubeRegistry(ctx context.Context, c *config, rej *subnet.Rejections, log *slog.Logger) (subnet.Registry, func(), error) {
	client, err := kube.NewClientURL(c.kubeAPIURL, c.kubeconfig)
	if err != nil {
		return nil, nil, err
	}
	nodeName := c.nodeName
	if nodeName == "" {
		ns, pod := os.Getenv("POD_NAMESPACE"), os.Getenv("POD_NAME")
		if nodeName, err = kube.PodNodeName(ctx, client, ns, pod); err != nil {
			return nil, nil, err
		}
		log.Info("node name from this pod", "pod", ns+"/"+pod, "node", nodeName)
	}
	reg, err := kube.New(client, kube.Options{
		NodeName:         nodeName,
		AnnotationPrefix: c.kubeAnnotPrefix,
		ConfigFile:       c.netConfPath,
		Rejections:       rej,
	}, log)
	if err != nil {
		return nil, nil, err
	}
	if !c.setNodeNetUnav {
		return registryOnly{reg}, func() {}, nil
	}
	return reg, func() {}, nil
}

// registryOnly hides the registry's SetNetworkAvailable, for
// --set-node-network-unavailable=false: the node condition is left alone.
type registryOnly struct{ subnet.Registry }
