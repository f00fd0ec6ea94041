package daemon

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the daemon's Prometheus metrics. A nil *Metrics records
// nothing, so tests and callers that do not serve metrics pass nil.
type Metrics struct {
	leases        prometheus.Gauge
	peers         *prometheus.GaugeVec
	acquisitions  prometheus.Counter
	leaseLost     prometheus.Counter
	renewals      prometheus.Counter
	renewFailures prometheus.Counter
	ready         prometheus.Gauge
	events        *prometheus.CounterVec
	tableUpdate   prometheus.Histogram
	rejected      *prometheus.CounterVec
	fallback      *prometheus.GaugeVec
	policyOn      prometheus.Gauge
	policyReady   prometheus.Gauge
	policyNoSrc   prometheus.Gauge
	policyFailed  prometheus.Counter
}

// NewMetrics creates the metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		leases: prometheus.NewGauge(prometheus.GaugeOpts{Name: "weft_leases",
			Help: "Subnet leases known from the datastore, this node's included."}),
		peers: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "weft_peers",
			Help: "Remote node subnets in the desired peer table, by address family."}, []string{"family"}),
		acquisitions: prometheus.NewCounter(prometheus.CounterOpts{Name: "weft_lease_acquisitions_total",
			Help: "Leases acquired (at start and after a lost lease)."}),
		leaseLost: prometheus.NewCounter(prometheus.CounterOpts{Name: "weft_lease_lost_total",
			Help: "Times this node's lease was deleted or taken over."}),
		renewals: prometheus.NewCounter(prometheus.CounterOpts{Name: "weft_lease_renewals_total",
			Help: "Successful lease renewals."}),
		renewFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: "weft_lease_renewal_failures_total",
			Help: "Failed lease renewal attempts (each is retried)."}),
		ready: prometheus.NewGauge(prometheus.GaugeOpts{Name: "weft_ready",
			Help: "1 once the subnet file is written and the dataplane programmed, and (with --network-policy) while the last network policy transaction committed."}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "weft_lease_events_total",
			Help: "Lease events received from the datastore watch, by type."}, []string{"type"}),
		tableUpdate: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "weft_peer_table_build_seconds",
			Help:    "Time to turn a batch of lease events into a new peer table and hand it to the dataplane.",
			Buckets: prometheus.ExponentialBuckets(0.00001, 4, 10)}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "weft_leases_rejected_total",
			Help: "Subnet leases (keys, values, annotations) left out because they fail a check, by reason; each key once per reason."}, []string{"reason"}),
		fallback: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "weft_backend_fallback",
			Help: "1 when this node runs another dataplane than the configured one (uvxlan for vxlan on a kernel without the VXLAN driver): the configured and running types and a short reason; weftd's log and weftctl doctor say more."},
			[]string{"configured", "running", "reason"}),
	}
	m.policyOn = prometheus.NewGauge(prometheus.GaugeOpts{Name: "weft_network_policy_enabled",
		Help: "1 when weftd enforces NetworkPolicy (--network-policy in Kubernetes mode)."})
	m.policyReady = prometheus.NewGauge(prometheus.GaugeOpts{Name: "weft_network_policy_ready",
		Help: "1 when the last network policy transaction committed the cluster's state; 0 before the first, after a failure, or when policy cannot be enforced on this node."})
	m.policyFailed = prometheus.NewCounter(prometheus.CounterOpts{Name: "weft_network_policy_program_failures_total",
		Help: "Network policy transactions the kernel refused (each is retried with backoff)."})
	m.policyNoSrc = prometheus.NewGauge(prometheus.GaugeOpts{Name: "weft_network_policy_source_checks_degraded",
		Help: "1 when network policy is enforced but not every pod's source addresses are checked on its bridge port: the CNI address store cannot be read (new pods go unchecked) or the kernel refuses nftables' bridge family; weftd's log says which."})
	reg.MustRegister(m.policyOn, m.policyReady, m.policyFailed, m.policyNoSrc)
	reg.MustRegister(m.fallback, m.rejected, m.leases, m.peers, m.acquisitions, m.leaseLost, m.renewals, m.renewFailures, m.ready, m.events, m.tableUpdate)
	return m
}

func (m *Metrics) acquired() {
	if m != nil {
		m.acquisitions.Inc()
	}
}

func (m *Metrics) lost() {
	if m != nil {
		m.leaseLost.Inc()
	}
}

func (m *Metrics) renewed(err error) {
	if m == nil {
		return
	}
	if err != nil {
		m.renewFailures.Inc()
	} else {
		m.renewals.Inc()
	}
}

func (m *Metrics) setReady(v bool) {
	if m != nil {
		m.ready.Set(map[bool]float64{true: 1}[v])
	}
}

func (m *Metrics) policyEnabled() {
	if m != nil {
		m.policyOn.Set(1)
	}
}

func (m *Metrics) policyProgrammed(err error) {
	if m == nil {
		return
	}
	if err != nil {
		m.policyFailed.Inc()
		m.policyReady.Set(0)
	} else {
		m.policyReady.Set(1)
	}
}

func (m *Metrics) policySourceChecks(err error) {
	if m != nil {
		m.policyNoSrc.Set(map[bool]float64{true: 1}[err != nil])
	}
}

// policyUnknown: a new session's controller has committed nothing yet.
func (m *Metrics) policyUnknown() {
	if m != nil {
		m.policyReady.Set(0)
	}
}

func (m *Metrics) policyCannot() {
	if m != nil {
		m.policyReady.Set(0)
	}
}

func (m *Metrics) batch(added, removed, leases, v4, v6 int, took time.Duration) {
	if m == nil {
		return
	}
	m.events.WithLabelValues("added").Add(float64(added))
	m.events.WithLabelValues("removed").Add(float64(removed))
	m.leases.Set(float64(leases))
	m.peers.WithLabelValues("ipv4").Set(float64(v4))
	m.peers.WithLabelValues("ipv6").Set(float64(v6))
	m.tableUpdate.Observe(took.Seconds())
}

// LeaseRejected counts one rejected lease; see subnet.Rejections.
func (m *Metrics) LeaseRejected(reason string) {
	if m != nil {
		m.rejected.WithLabelValues(reason).Inc()
	}
}

// setFallback records that fb runs in place of the configured type.
func (m *Metrics) setFallback(configured string, fb *Fallback) {
	if m != nil {
		m.fallback.Reset()
		m.fallback.WithLabelValues(configured, fb.Type, fb.Code).Set(1)
	}
}
