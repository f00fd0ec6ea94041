package daemon

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/weft-net/weft/backend"
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
func newMetrics(live *liveBackend) (*prometheus.Registry, *Metrics) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := NewMetrics(reg)
	registerBackendMetrics(reg, live)
	return reg, m
}

func mountMetrics(hs *HealthServer, reg *prometheus.Registry) {
	hs.Mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
}

// registerBackendMetrics exports the live dataplane's counters, the same
// for every backend (backend.Stats).
func registerBackendMetrics(reg prometheus.Registerer, live *liveBackend) {
	reg.MustRegister(dataplaneCollector{live})
}

// dataplaneCollector exports backend.Stats of the live dataplane.
type dataplaneCollector struct{ live *liveBackend }

var (
	repairsDesc = prometheus.NewDesc("weft_repairs_total",
		"Dataplane state put back because it drifted from what was programmed, by kind.", []string{"kind"}, nil)
	framesDesc = prometheus.NewDesc("weft_dataplane_frames_total",
		"Inner frames the dataplane sent into (tx) or took out of (rx) the overlay.", []string{"direction"}, nil)
	dropsDesc = prometheus.NewDesc("weft_dataplane_drops_total",
		"Frames and datagrams the dataplane dropped, by reason.", []string{"reason"}, nil)
	eventsDesc = prometheus.NewDesc("weft_dataplane_events_total",
		"Other dataplane events, by name (partial_checksum: inner frames accepted with a checksum left for the receiver to complete).",
		[]string{"event"}, nil)
)

func (dataplaneCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- repairsDesc
	ch <- framesDesc
	ch <- dropsDesc
	ch <- eventsDesc
}

func (c dataplaneCollector) Collect(ch chan<- prometheus.Metric) {
	b := c.live.get()
	if b == nil {
		return
	}
	st := b.Stats()
	counter := func(d *prometheus.Desc, v uint64, label string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), label)
	}
	for k, v := range st.Repairs {
		counter(repairsDesc, v, k)
	}
	counter(framesDesc, st.TxFrames, "tx")
	counter(framesDesc, st.RxFrames, "rx")
	for k, v := range st.Drops {
		counter(dropsDesc, v, k)
	}
	for k, v := range st.Events {
		counter(eventsDesc, v, k)
	}
}
