package web

import (
	"fmt"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// ParseCounters reads the dataplane counters from weftd's /metrics text:
// weft_dataplane_frames_total by direction, the bytes uvxlan's fast path
// carried (which the overlay device does not count), weft_repairs_total by kind,
// weft_leases_rejected_total summed, and weft_ready.
func ParseCounters(text string) (*Counters, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		return nil, fmt.Errorf("parse /metrics: %w", err)
	}
	c := &Counters{Repairs: map[string]uint64{}}
	each(fams["weft_dataplane_frames_total"], func(labels map[string]string, v float64) {
		switch labels["direction"] {
		case "tx":
			c.TxFrames = uint64(v)
		case "rx":
			c.RxFrames = uint64(v)
		}
	})
	each(fams["weft_dataplane_events_total"], func(labels map[string]string, v float64) {
		switch labels["event"] {
		case "fastpath_tx_bytes":
			c.fastTx = uint64(v)
		case "fastpath_rx_bytes":
			c.fastRx = uint64(v)
		}
	})
	each(fams["weft_repairs_total"], func(labels map[string]string, v float64) { c.Repairs[labels["kind"]] += uint64(v) })
	each(fams["weft_leases_rejected_total"], func(_ map[string]string, v float64) { c.Rejected += uint64(v) })
	each(fams["weft_ready"], func(_ map[string]string, v float64) { c.Ready = v == 1 })
	return c, nil
}

// each calls f with the labels and value of every sample of a counter or
// gauge family (nil: none).
func each(f *dto.MetricFamily, fn func(map[string]string, float64)) {
	if f == nil {
		return
	}
	for _, m := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		switch {
		case m.Counter != nil:
			fn(labels, m.GetCounter().GetValue())
		case m.Gauge != nil:
			fn(labels, m.GetGauge().GetValue())
		case m.Untyped != nil:
			fn(labels, m.GetUntyped().GetValue())
		}
	}
}
