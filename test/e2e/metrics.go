package e2e

import (
	"fmt"
	"strings"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Metric scrapes the node's /metrics, parses it with Prometheus' text
// parser, and returns the value of the sample of name whose labels include
// every label given (pairs of name, value), summed over matching samples.
func (n *Node) Metric(name string, labels ...string) (float64, error) {
	code, body, err := n.HTTPGet("http://127.0.0.1:9470/metrics")
	if err != nil {
		return 0, err
	}
	if code != 200 {
		return 0, fmt.Errorf("/metrics answered %d", code)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		return 0, fmt.Errorf("parse /metrics: %w", err)
	}
	fam, ok := fams[name]
	if !ok {
		return 0, fmt.Errorf("no metric %s", name)
	}
	var sum float64
	found := false
	for _, m := range fam.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		match := true
		for i := 0; i+1 < len(labels); i += 2 {
			if have[labels[i]] != labels[i+1] {
				match = false
			}
		}
		if match {
			found = true
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	if !found {
		return 0, fmt.Errorf("no sample of %s with labels %v", name, labels)
	}
	return sum, nil
}
