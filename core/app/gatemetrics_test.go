package app

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/metrics"
	"github.com/sluice-io/sluice/gates/constant"
	"github.com/sluice-io/sluice/transports/memory"
)

// ownMetricsType is a test gate type that exports a series of its own
// through gate.Env.Metrics: sluice_gate_events_total{gate, event="built"}.
const ownMetricsType = "test-own-metrics"

// registerOwnMetrics registers ownMetricsType in ad: a constant gate of
// budget 1 whose parameter v is its one event count; a negative v is
// refused after the gate registered its series.
func registerOwnMetrics(t *testing.T, ad Adapters) {
	t.Helper()
	if err := ad.Gates.Register(ownMetricsType, func(p gate.Params, env gate.Env) (gate.Gate, error) {
		v, err := p.Float("v", 0)
		if err != nil {
			return nil, err
		}
		if err := gate.Register(env.Metrics, gate.EventsCollector(func() map[string]int64 { return map[string]int64{"built": int64(v)} })); err != nil {
			return nil, err
		}
		if v < 0 {
			return nil, fmt.Errorf("v %v: negative (refused after registering)", v)
		}
		return constant.New(1)
	}); err != nil {
		t.Fatal(err)
	}
}

// gateEventSeries returns the gate label → value of every
// sluice_gate_events_total{event="built"} series in reg.
func gateEventSeries(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != "sluice_gate_events_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["event"] == "built" {
				out[labels["gate"]] = m.GetCounter().GetValue()
			}
		}
	}
	return out
}

// TestGateOwnMetricsAcrossReloads: gates register their own series through
// gate.Env.Metrics, labelled with the gate's name (two gates of one type:
// one metric, one series each); a reload that replaces a gate removes the
// old gate's series and registers the new one's (no duplicate-registration
// error, no stale series), a queue's gate that is unchanged keeps its
// series, and a gate whose factory fails after registering leaves none.
func TestGateOwnMetricsAcrossReloads(t *testing.T) {
	_, gw := newGateway(t)
	file := filepath.Join(t.TempDir(), "queues.json")
	write := func(va, vb int) {
		t.Helper()
		(&reloadRig{t: t, file: file}).writeRaw(fmt.Sprintf(`{"queues": [
			{"id": "a", "queue_name": "req:a", "result_queue_name": "res:a", "igw_base_url": %q, "max_concurrency": 2,
			 "gate_type": %q, "gate_params": {"v": %d}},
			{"id": "b", "queue_name": "req:b", "result_queue_name": "res:b", "igw_base_url": %q, "max_concurrency": 2,
			 "gate_type": %q, "gate_params": {"v": %d}}]}`, gw, ownMetricsType, va, gw, ownMetricsType, vb))
	}
	write(1, 2)
	load := func() (*config.Config, error) { return loadQueues(file) }
	cfg, err := load()
	if err != nil {
		t.Fatal(err)
	}
	ad := testAdapters(t)
	registerOwnMetrics(t, ad)
	reg := prometheus.NewRegistry()
	h := startAppWith(t, cfg, Options{Adapters: ad, Transport: memory.New(memory.Options{}), Registry: reg,
		Logger: slog.New(slog.DiscardHandler), Reload: &Reload{Interval: 10 * time.Millisecond, Files: []string{file}, Load: load}})
	waitReload(t, 10*time.Second, "the pipeline to run", h.app.Pipeline().Ready)
	want := func(w map[string]float64) {
		t.Helper()
		got := gateEventSeries(t, reg)
		if len(got) != len(w) {
			t.Fatalf("gate series %v, want %v", got, w)
		}
		for k, v := range w {
			if gv, ok := got[k]; !ok || gv != v {
				t.Fatalf("gate series %v, want %v", got, w)
			}
		}
	}
	want(map[string]float64{ownMetricsType: 1, ownMetricsType + "#1": 2})

	reloads := func() float64 {
		return metricValue(t, reg, "llm_d_async_async_queue_config_reloads_total", map[string]string{"result": metrics.ReloadSuccess})
	}
	write(1, 3) // a unchanged, b's gate replaced
	waitReload(t, 10*time.Second, "the first reload", func() bool { return reloads() >= 1 })
	want(map[string]float64{ownMetricsType: 1, ownMetricsType + "#2": 3})

	write(4, 3) // a's gate replaced
	waitReload(t, 10*time.Second, "the second reload", func() bool { return reloads() >= 2 })
	want(map[string]float64{ownMetricsType + "#3": 4, ownMetricsType + "#2": 3})

	// A gate whose factory fails leaves no series: the name it would have
	// had goes to the next gate built, whose series are its own.
	failures := func() float64 {
		return metricValue(t, reg, "llm_d_async_async_queue_config_reloads_total", map[string]string{"result": metrics.ReloadError})
	}
	write(-1, 3)
	waitReload(t, 10*time.Second, "the failed reload", func() bool { return failures() >= 1 })
	want(map[string]float64{ownMetricsType + "#3": 4, ownMetricsType + "#2": 3})
	write(4, 5)
	waitReload(t, 10*time.Second, "the third reload", func() bool { return reloads() >= 3 })
	want(map[string]float64{ownMetricsType + "#3": 4, ownMetricsType + "#4": 5})

	if err := h.shutdown(); err != nil {
		t.Errorf("shutdown: %v", err)
	}
	if got := gateEventSeries(t, reg); len(got) != 0 {
		t.Errorf("after shutdown: gate series %v, want none (the gates were closed)", got)
	}
}
