package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/subnet/kube"
)

// newKubeRegistry builds the Kubernetes registry (in-cluster config unless
// --kubeconfig names a file).
func newKubeRegistry(ctx context.Context, c *config, log *slog.Logger) (subnet.Registry, func(), error) {
	client, err := kube.NewClientURL(c.kubeAPIURL, c.kubeconfig)
	if err != nil {
		return nil, nil, err
	}
	nodeName := c.nodeName
	if nodeName == "" {
		if nodeName, err = podNodeName(ctx, client); err != nil {
			return nil, nil, err
		}
		log.Info("node name from this pod", "pod", os.Getenv("POD_NAMESPACE")+"/"+os.Getenv("POD_NAME"), "node", nodeName)
	}
	reg, err := kube.New(client, kube.Options{
		NodeName:         nodeName,
		AnnotationPrefix: c.kubeAnnotPrefix,
		ConfigFile:       c.netConfPath,
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

// podNodeName reads the node of the pod named by POD_NAMESPACE and
// POD_NAME, as flanneld does when NODE_NAME is not set.
func podNodeName(ctx context.Context, client kubernetes.Interface) (string, error) {
	ns, name := os.Getenv("POD_NAMESPACE"), os.Getenv("POD_NAME")
	pod, err := client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("node name: get pod %s/%s: %w", ns, name, err)
	}
	if pod.Spec.NodeName == "" {
		return "", fmt.Errorf("node name: pod %s/%s is not scheduled", ns, name)
	}
	return pod.Spec.NodeName, nil
}
