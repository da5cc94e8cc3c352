package metrics

import (
	"slices"
	"sort"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// The metrics upstream added after v0.9 (docs/metrics.md), with upstream's
// names, types, labels and, for the histogram, buckets.
func TestUpstreamV010Metrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := New(reg)
	if err != nil {
		t.Fatal(err)
	}
	l := Labels{QueueID: "qi", QueueName: "qn", Pool: "p"}
	q := m.For(l)
	q.TokensIn.Add(3)
	q.TokensOut.Add(4)
	cum := make([]uint64, len(ProximityBounds))
	for i := range cum {
		cum[i] = uint64(i + 1) // i+1 requests with less than bound i left
	}
	m.DeadlineProximity.Set(l, Proximity{Cumulative: cum, Total: 20})

	Q := []string{"pool_name", "queue_id", "queue_name"}
	want := []struct {
		name   string
		typ    dto.MetricType
		labels []string
	}{
		{"tokens_total", dto.MetricType_COUNTER, append([]string{"direction"}, Q...)},
		{"deadline_proximity_millis", dto.MetricType_HISTOGRAM, Q},
		{"dispatched_requests_total", dto.MetricType_COUNTER, Q},
		{"broker_backlog_source_available", dto.MetricType_GAUGE, Q},
		{"queue_config_reloads_total", dto.MetricType_COUNTER, []string{"result"}},
		{"gate_wait_requeues_total", dto.MetricType_COUNTER, Q},
		{"gate_waiting_requests", dto.MetricType_GAUGE, Q},
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		byName[f.GetName()] = f
	}
	for _, w := range want {
		f := byName["llm_d_async_async_"+w.name]
		if f == nil {
			t.Errorf("llm_d_async_async_%s not registered (or no series)", w.name)
			continue
		}
		if f.GetType() != w.typ {
			t.Errorf("%s: type %v, want %v", w.name, f.GetType(), w.typ)
		}
		for _, s := range f.GetMetric() {
			var got []string
			for _, lp := range s.GetLabel() {
				got = append(got, lp.GetName())
			}
			sort.Strings(got)
			wl := slices.Clone(w.labels)
			sort.Strings(wl)
			if !slices.Equal(got, wl) {
				t.Errorf("%s: labels %v, want %v", w.name, got, wl)
			}
		}
	}
	// Both reload results exist at 0 before any reload.
	if f := byName["llm_d_async_async_queue_config_reloads_total"]; f == nil || len(f.GetMetric()) != 2 {
		t.Errorf("queue_config_reloads_total: want the success and error series at 0")
	}
	// Tokens by direction.
	dirs := map[string]float64{}
	for _, s := range byName["llm_d_async_async_tokens_total"].GetMetric() {
		for _, lp := range s.GetLabel() {
			if lp.GetName() == "direction" {
				dirs[lp.GetValue()] = s.GetCounter().GetValue()
			}
		}
	}
	if dirs["input"] != 3 || dirs["output"] != 4 || len(dirs) != 2 {
		t.Errorf("tokens by direction %v, want input 3, output 4", dirs)
	}
	// Upstream's buckets, in ms, cumulative as given, +Inf = the total.
	h := byName["llm_d_async_async_deadline_proximity_millis"].GetMetric()[0].GetHistogram()
	wantLe := []float64{0, 1000, 5000, 15000, 30000, 60000, 120000, 300000, 600000, 1800000, 3600000, 7200000, 21600000, 86400000}
	var le []float64
	for i, b := range h.GetBucket() {
		le = append(le, b.GetUpperBound())
		if b.GetCumulativeCount() != uint64(i+1) {
			t.Errorf("bucket le=%v: %d, want %d", b.GetUpperBound(), b.GetCumulativeCount(), i+1)
		}
	}
	if !slices.Equal(le, wantLe) {
		t.Errorf("buckets %v, want %v", le, wantLe)
	}
	if h.GetSampleCount() != 20 {
		t.Errorf("count %d, want 20", h.GetSampleCount())
	}
	// The sum from midpoints: one request per bucket, at (lower+upper)/2,
	// plus the 6 beyond the last bound at the last bound.
	sum, lower := 0.0, 0.0
	for i, b := range wantLe {
		if i > 0 {
			sum += (lower + b) / 2
		}
		lower = b
	}
	sum += 6 * 86400000
	if h.GetSampleSum() != sum {
		t.Errorf("sum %v, want %v", h.GetSampleSum(), sum)
	}
}
