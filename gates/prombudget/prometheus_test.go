package prombudget_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-io/sluice/core/app"
	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/credit"
	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/gates/prombudget"
	"github.com/sluice-io/sluice/internal/simulator"
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/transports/memory"
)

// TestRealPrometheus runs against one real prometheus scraping the gateway
// simulator (as pool "sim", through vllm:num_requests_running) and a fake
// endpoint-picker endpoint (ready pods of both pools, the flow-control queue
// of pool "epp").
func TestRealPrometheus(t *testing.T) {
	sim, err := simulator.New(simulator.Config{Capacity: 10_000, Latency: simulator.Fixed(100 * time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	simURL, err := sim.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	epp := testenv.StartGauges(t)
	epp.Set(prombudget.MetricReadyPods, 1, "name", "sim")
	epp.Set(prombudget.MetricReadyPods, 2, "name", "epp")
	epp.Set(prombudget.MetricQueueSize, 0, "inference_pool", "epp")
	prom := testenv.StartPrometheusWith(t, testenv.PrometheusOptions{
		ScrapeInterval: 500 * time.Millisecond,
		Targets: []testenv.ScrapeTarget{
			{URL: simURL + "/metrics", Labels: map[string]string{"inference_pool": "sim"}},
			{URL: epp.URL()},
		},
	})
	t.Run("BudgetFollowsSimulatedLoad", func(t *testing.T) { testFollowsLoad(t, prom.URL, simURL) })
	t.Run("DispatchSlowsAndStops", func(t *testing.T) { testDispatchStops(t, prom.URL, simURL, sim, epp) })
}

// testFollowsLoad holds n requests open on the simulator and checks the
// budget reads 1 − n/MC − baseline.
func testFollowsLoad(t *testing.T, promURL, simURL string) {
	g := mustBuild(t, `{"inference_pool":"sim","max_concurrency":20,"baseline":0,"cache_ttl":"100ms","prometheus_url":"`+promURL+`"}`)
	r := gate.NewRefresher(g, gate.RefresherConfig{Name: "budget", Interval: 50 * time.Millisecond})
	r.Start(context.Background())
	defer r.Close()
	waitBudget(t, r, 1, "idle pool")

	client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 100}}
	defer client.CloseIdleConnections()
	for _, n := range []int{5, 15, 0} {
		release := hold(t, client, simURL, n)
		waitBudget(t, r, 1-float64(n)/20, fmt.Sprintf("%d requests running", n))
		release()
	}
}

// hold sends n requests that stay open until release is called.
func hold(t *testing.T, c *http.Client, base string, n int) (release func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/completions",
				strings.NewReader(`{"model":"m","prompt":"hi"}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set(simulator.HeaderLatencyMS, "60000")
			if resp, err := c.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
	}
	return func() { cancel(); wg.Wait() }
}

func waitBudget(t *testing.T, r *gate.Refresher, want float64, what string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for math.Abs(r.Budget()-want) > 1e-6 {
		if time.Now().After(deadline) {
			t.Fatalf("%s: budget %v, want %v", what, r.Budget(), want)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// testDispatchStops runs sluice (memory transport, simulator, this gate) over
// a deep backlog while the endpoint picker's queue grows: the in-flight
// limit drops from ceil(40×0.95) to ceil(40×0.45) and then to 0, in-flight
// requests never exceed it, and once closed no request reaches the gateway.
func testDispatchStops(t *testing.T, promURL, simURL string, sim *simulator.Server, epp *testenv.Gauges) {
	const queue, results = "llm-d-async:requests:epp", "llm-d-async:results:epp:$batch"
	mem := memory.New(memory.Options{})
	params := map[string]json.RawMessage{
		"inference_pool": json.RawMessage(`"epp"`), "max_concurrency": json.RawMessage(`"50"`),
		"refresh_interval": json.RawMessage(`"50ms"`),
	}
	cfg := &config.Config{
		Transport: memory.Name, Concurrency: 40, MetricsPort: -1, HealthPort: -1,
		DrainTimeout: config.Duration(5 * time.Second),
		Prometheus:   config.Prometheus{URL: promURL, CacheTTL: config.Duration(100 * time.Millisecond)},
		TransportConfig: config.TransportConfig{ResultQueueName: results, Queues: []config.Queue{{
			Queue: transport.Queue{Name: queue}, IGWBaseURL: simURL, GateType: prombudget.Type, GateParams: params,
		}}},
	}
	reg := prometheus.NewRegistry()
	ad := app.NewAdapters()
	if err := ad.Gates.Register(prombudget.Type, prombudget.Factory); err != nil {
		t.Fatal(err)
	}
	a, err := app.New(cfg, app.Options{Adapters: ad, Transport: mem, Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Hour).Unix()
	for i := range 5000 {
		b := fmt.Appendf(nil, `{"id":"r%d","deadline":%d,"payload":{"model":"m","prompt":"hi"}}`, i, deadline)
		if err := mem.Enqueue(queue, b); err != nil {
			t.Fatal(err)
		}
	}
	ctx, stop := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- a.Run(ctx) }()
	defer func() {
		stop()
		if err := <-errc; err != nil {
			t.Errorf("run: %v", err)
		}
	}()
	credits := a.Pipeline().Credits(queue)

	// The pool has room: D = 1, budget 0.95, limit ceil(40 × 0.95) = 38.
	steps := []struct {
		queued float64 // the endpoint picker's flow-control queue, of 2 pods × 50
		limit  int
	}{{0, 38}, {50, 18}, {100, 0}}
	for _, s := range steps {
		epp.Set(prombudget.MetricQueueSize, s.queued, "inference_pool", "epp")
		before := sim.Stats().Requests
		waitLimit(t, credits, s.limit)
		// Requests started under the higher limit finish (100 ms each); from
		// then on, in flight never exceeds the limit.
		waitInflightAtMost(t, credits, s.limit)
		for range 20 {
			inflight, limit, _ := credits.Snapshot()
			if inflight > s.limit || limit != s.limit {
				t.Fatalf("queue %v: in flight %d, limit %d; want ≤ %d", s.queued, inflight, limit, s.limit)
			}
			time.Sleep(25 * time.Millisecond)
		}
		if s.limit > 0 && sim.Stats().Requests == before {
			t.Fatalf("queue %v: no request dispatched with limit %d", s.queued, s.limit)
		}
	}
	// Closed and drained: nothing new reaches the gateway.
	stopped := sim.Stats().Requests
	time.Sleep(1500 * time.Millisecond)
	if n := sim.Stats().Requests; n != stopped {
		t.Fatalf("%d requests dispatched after the gate closed", n-stopped)
	}
	if v := gaugeValue(t, reg, "sluice_gate_budget"); v != 0 {
		t.Fatalf("sluice_gate_budget = %v, want 0", v)
	}
	// And it reopens.
	epp.Set(prombudget.MetricQueueSize, 0, "inference_pool", "epp")
	waitLimit(t, credits, 38)
}

func waitInflightAtMost(t *testing.T, c *credit.Pool, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for inflight, _, _ := c.Snapshot(); inflight > n; inflight, _, _ = c.Snapshot() {
		if time.Now().After(deadline) {
			t.Fatalf("%d requests in flight, want ≤ %d", inflight, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func waitLimit(t *testing.T, c *credit.Pool, want int) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		_, limit, _ := c.Snapshot()
		if limit == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("credit limit %d, want %d", limit, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func gaugeValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) > 0 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("metric %s not found", name)
	return 0
}
