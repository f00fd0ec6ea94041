package main

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/weft-net/weft/backend"
	"github.com/weft-net/weft/internal/daemon"
)

// liveBackend holds the dataplane of the current lease, for metrics that
// read its counters.
type liveBackend struct {
	p atomic.Pointer[backend.Backend]
}

func (l *liveBackend) set(b backend.Backend) { l.p.Store(&b) }

func (l *liveBackend) get() backend.Backend {
	if p := l.p.Load(); p != nil {
		return *p
	}
	return nil
}

// newMetrics returns the registry weftd serves on /metrics: Go runtime and
// process metrics, the daemon's, and the live dataplane's counters.
func newMetrics(live *liveBackend) (*prometheus.Registry, *daemon.Metrics) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := daemon.NewMetrics(reg)
	registerBackendMetrics(reg, live)
	return reg, m
}

func mountMetrics(hs *daemon.HealthServer, reg *prometheus.Registry) {
	hs.Mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
}
