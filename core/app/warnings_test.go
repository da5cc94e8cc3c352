package app

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/transports/memory"
)

// The settings upstream accepts that act on nothing here are logged by New,
// once each, so that an embedder sees them as sluice serve's user does;
// CheckWarnings returns the same lines.
func TestNewLogsConfigWarningsOnce(t *testing.T) {
	cfg := &config.Config{
		Transport: memory.Name, Concurrency: 1, MetricsPort: -1, HealthPort: -1,
		DrainTimeout: config.Duration(time.Second),
		MergePolicy:  config.MergePolicy{Parameters: json.RawMessage(`{"fairness_heder":"x-tenant"}`)},
		TransportConfig: config.TransportConfig{ResultQueueName: "r", EnableTracing: true,
			Queues: []config.Queue{{Queue: transport.Queue{Name: "q"}, IGWBaseURL: "http://127.0.0.1:1"}}},
	}
	want := []string{
		"transport_config.enable_tracing is accepted and ignored",
		`merge_policy.parameters.fairness_heder is not a parameter sluice reads (did you mean \"fairness_header\"?)`,
	}
	var buf bytes.Buffer
	a, err := New(cfg, Options{Adapters: testAdapters(t), Logger: slog.New(slog.NewJSONHandler(&buf, nil)),
		Transport: memory.New(memory.Options{}), Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	a.close()
	log := buf.String()
	for _, w := range want {
		if n := strings.Count(log, w); n != 1 {
			t.Errorf("New logged %q %d times, want once:\n%s", w, n, log)
		}
		if !strings.Contains(log, `"level":"WARN","msg":"`+w) {
			t.Errorf("%q is not logged as a warning:\n%s", w, log)
		}
	}
	warnings, err := CheckWarnings(cfg, testAdapters(t))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(warnings, "\n"); strings.Count(got, "enable_tracing") != 1 || strings.Count(got, "fairness_heder") != 1 {
		t.Errorf("CheckWarnings = %q, want each of the config's two warnings once", warnings)
	}
}
