package main

import (
	"context"
	"log/slog"

	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/subnet/kube"
)

// newKubeRegistry builds the Kubernetes registry (in-cluster config unless
// --kubeconfig names a file).
func newKubeRegistry(_ context.Context, c *config, rej *subnet.Rejections, log *slog.Logger) (subnet.Registry, func(), error) {
	client, err := kube.NewClient(c.kubeconfig)
	if err != nil {
		return nil, nil, err
	}
	reg, err := kube.New(client, kube.Options{
		NodeName:         c.nodeName,
		AnnotationPrefix: c.kubeAnnotPrefix,
		ConfigFile:       c.netConfPath,
		Rejections:       rej,
	}, log)
	if err != nil {
		return nil, nil, err
	}
	return reg, func() {}, nil
}
