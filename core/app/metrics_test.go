package app

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/metrics"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/transports/memory"
)

// closedReadingGate is a metric gate reading 0.3 against a threshold of
// 0.5: closed.
type closedReadingGate struct{}

func (closedReadingGate) Budget(context.Context) (float64, error) { return 0, nil }

func (closedReadingGate) Readings() []gate.Reading {
	return []gate.Reading{{Pool: "pool-a", Value: 0.3, Threshold: 0.5, Read: true, Available: true}}
}

// The sampled metrics: a gate holding a queue shut with requests waiting
// counts gate_closed decisions, the broker backlog is polled at
// backlog_poll_interval, a metric gate's reading is exported under
// upstream's gate gauges, and pool_worker_limit is the worker pool's
// workers.
func TestSampledMetrics(t *testing.T) {
	ad := testAdapters(t)
	if err := ad.Gates.Register("test-closed", func(gate.Params, gate.Env) (gate.Gate, error) { return closedReadingGate{}, nil }); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	cfg := &config.Config{
		Transport: memory.Name, MetricsPort: -1, HealthPort: -1,
		WorkerPools:         []config.WorkerPool{{ID: "batch", Workers: 10}},
		DrainTimeout:        config.Duration(time.Second),
		BacklogPollInterval: config.Duration(20 * time.Millisecond),
		TransportConfig: config.TransportConfig{ResultQueueName: e2eResults, Queues: []config.Queue{
			{Queue: transport.Queue{Name: e2eQueue}, IGWBaseURL: "http://127.0.0.1:1", GateType: "test-closed", WorkerPoolID: "batch"},
			{Queue: transport.Queue{Name: "other", MaxConcurrency: 4}, IGWBaseURL: "http://127.0.0.1:1", WorkerPoolID: "batch"},
		}},
	}
	h := startAppWith(t, cfg, Options{Adapters: ad, Transport: memory.New(memory.Options{}), Registry: reg})
	for _, id := range []string{"a", "b", "c"} {
		if err := h.mem.Enqueue(e2eQueue, request(id, time.Now().Add(time.Minute), nil)); err != nil {
			t.Fatal(err)
		}
	}
	q := map[string]string{"queue_id": e2eQueue, "queue_name": e2eQueue, "pool_name": "batch"}
	with := func(k, v string) map[string]string {
		l := map[string]string{k: v}
		for k, v := range q {
			l[k] = v
		}
		return l
	}
	value := func(name string, labels map[string]string) float64 { return metricValue(t, reg, name, labels) }
	up := metrics.Upstream
	waitFor(t, func() bool { return value(up+"gate_decisions_total", with("reason", metrics.ReasonGateClosed)) >= 2 }, 5*time.Second)

	if got := value(up+"broker_backlog", q); got != 3 {
		t.Errorf("broker_backlog = %v, want 3", got)
	}
	if got := value(up+"dispatch_budget", q); got != 0 {
		t.Errorf("dispatch_budget = %v, want 0", got)
	}
	pool := with("inference_pool", "pool-a")
	if v, th, ok := value(up+"gate_metric_value", pool), value(up+"gate_metric_threshold", pool), value(up+"gate_metric_source_available", pool); v != 0.3 || th != 0.5 || ok != 1 {
		t.Errorf("gate gauges: value %v threshold %v available %v", v, th, ok)
	}
	if got := value(up+"pool_worker_limit", map[string]string{"pool_name": "batch"}); got != 10 {
		t.Errorf("pool_worker_limit{batch} = %v, want 10", got)
	}
	// Nothing was dispatched, and nothing else was counted as a decision.
	if got := value(up+"request_total", q); got != 0 {
		t.Errorf("request_total = %v with the gate closed", got)
	}
	for _, r := range []string{metrics.ReasonQuotaExhausted, metrics.ReasonDropped, metrics.ReasonError} {
		if got := value(up+"gate_decisions_total", with("reason", r)); got != 0 {
			t.Errorf("gate_decisions{reason=%s} = %v", r, got)
		}
	}
}

// metricValue returns the value of the series of name with exactly labels
// (NaN when there is none).
func metricValue(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; !ok || v != lp.GetValue() {
					continue next
				}
			}
			switch {
			case m.Counter != nil:
				return m.GetCounter().GetValue()
			case m.Gauge != nil:
				return m.GetGauge().GetValue()
			}
		}
	}
	return math.NaN()
}
