//go:build weft_nokube

package daemon

import (
	"context"
	"errors"
	"log/slog"

	"github.com/weft-net/weft/subnet"
)

// kubeClientBuilt says whether this build has the Kubernetes registry: this
// one, built with -tags weft_nokube, has not.
const kubeClientBuilt = false

func newKubeRegistry(context.Context, *config, *subnet.Rejections, *slog.Logger) (subnet.Registry, error) {
	return nil, errors.New("--kube-subnet-mgr: this weftd was built with -tags weft_nokube, without the Kubernetes client; " +
		"use the standard build (go build ./cmd/weftd)")
}

// policyFactory: a build without the Kubernetes client has no
// NetworkPolicy controller (and no Kubernetes mode, whose flag fails
// above).
func policyFactory(*config, *slog.Logger) (func(*subnet.Config, subnet.Lease, PolicyReporter) (Runner, error), error) {
	return nil, nil
}
