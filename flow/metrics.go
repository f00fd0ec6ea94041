package flow

import (
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// MaxPolicyLabels bounds the policies Metrics names in its labels; the
// verdicts of policies met after that many are counted under policy and
// namespace "other".
const MaxPolicyLabels = 256

// Metrics counts verdicts in weft_policy_verdicts_total{policy,namespace,
// direction,verdict}. A drop counts once for each policy it names (the
// policies that isolate the pod); an allowed connection (conntrack's new)
// counts once with policy and direction empty, as conntrack does not say
// which rule let it through. Only policies the kernel's log prefix names
// appear, and at most MaxPolicyLabels of them.
type Metrics struct {
	verdicts *prometheus.CounterVec
	mu       sync.Mutex
	seen     map[string]bool
}

// NewMetrics registers the counter with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{seen: map[string]bool{}, verdicts: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "weft_policy_verdicts_total",
		Help: "Policy verdicts the kernel reported: drops (as logged, rate-limited in nftables) per policy that isolates the pod, and allowed connections.",
	}, []string{"policy", "namespace", "direction", "verdict"})}
	if err := reg.Register(m.verdicts); err != nil {
		return nil, err
	}
	return m, nil
}

// Observe counts f's verdict; only drops and new connections count.
func (m *Metrics) Observe(f Flow) {
	switch f.Event {
	case EventNew:
		m.verdicts.WithLabelValues("", "", "", Allowed).Inc()
	case EventDrop:
		for _, p := range f.Policies {
			name, ns := m.label(p)
			m.verdicts.WithLabelValues(name, ns, f.Direction, Dropped).Inc()
		}
		if f.MorePolicies > 0 {
			m.verdicts.WithLabelValues("other", "other", f.Direction, Dropped).Add(float64(f.MorePolicies))
		}
	}
}

// label is the policy and namespace labels of p ("namespace/name").
func (m *Metrics) label(p string) (string, string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.seen[p] {
		if len(m.seen) >= MaxPolicyLabels {
			return "other", "other"
		}
		m.seen[p] = true
	}
	ns, name, _ := strings.Cut(p, "/")
	return name, ns
}
