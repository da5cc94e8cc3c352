package app

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/transports/memory"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestMetricsAndHealthEndpoints(t *testing.T) {
	_, url := newGateway(t)
	mp, hp := testenv.FreePort(t), testenv.FreePort(t)
	h := startApp(t, url, time.Second, func(c *config.Config) {
		c.ListenHost, c.MetricsPort, c.HealthPort = "127.0.0.1", mp, hp
	})
	if err := h.mem.Enqueue(e2eQueue, request("m1", time.Now().Add(time.Minute), nil)); err != nil {
		t.Fatal(err)
	}
	h.waitResults(1, 10*time.Second)
	waitFor(t, func() bool { return h.app.Pipeline().Ready() }, 5*time.Second)
	// upstream's bodies, byte for byte (encoding/json's Encoder ends them with a newline)
	health := "http://" + h.app.Addr("health")
	if code, body := get(t, health+"/healthz"); code != 200 || body != "{\"status\":\"ok\"}\n" {
		t.Errorf("/healthz: %d %q", code, body)
	}
	if code, body := get(t, health+"/readyz"); code != 200 || body != "{\"status\":\"ready\"}\n" {
		t.Errorf("/readyz: %d %q", code, body)
	}
	code, body := get(t, "http://"+h.app.Addr("metrics")+"/metrics")
	if code != 200 {
		t.Fatalf("/metrics: %d", code)
	}
	for _, want := range []string{
		`llm_d_async_async_request_total{pool_name="default",queue_id="llm-d-async:requests:e2e",queue_name="llm-d-async:requests:e2e"} 1`,
		`llm_d_async_async_successful_requests_total{pool_name="default"`,
		`sluice_results_total{code="ok"`,
		"llm_d_async_async_inference_latency_time_millis_bucket",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// Queues with the same gate definition share one gate and one refresh loop,
// however the parameters were written.
func TestGateSharedByEqualDefinitions(t *testing.T) {
	cfg := &config.Config{
		MetricsPort: -1, HealthPort: -1,
		TransportConfig: config.TransportConfig{ResultQueueName: "r", Queues: []config.Queue{
			{Queue: transport.Queue{Name: "a"}, IGWBaseURL: "http://gw", GateParams: map[string]json.RawMessage{"budget": json.RawMessage(`"0.5"`)}},
			{Queue: transport.Queue{Name: "b"}, IGWBaseURL: "http://gw", GateParams: map[string]json.RawMessage{"budget": json.RawMessage(`0.5`)}},
			{Queue: transport.Queue{Name: "c"}, IGWBaseURL: "http://gw", GateParams: map[string]json.RawMessage{"budget": json.RawMessage(`0.25`)}},
		}},
	}
	a, err := New(cfg, Options{Adapters: testAdapters(t), Transport: memory.New(memory.Options{}), Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(a.gates); n != 2 {
		t.Errorf("%d gates for two distinct definitions", n)
	}
	for _, g := range a.gates {
		_ = g.Close()
	}
	a.client.Close()
}
