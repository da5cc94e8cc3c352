package app

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/gates/redisleasedrate"
	"github.com/sluice-io/sluice/transports/memory"
)

// waitGate answers Wait until opened, and counts its questions.
type waitGate struct {
	open  atomic.Bool
	asked atomic.Int64
}

func (g *waitGate) Budget(context.Context) (float64, error) { return 1, nil }

func (g *waitGate) Admit(context.Context, *wire.Request) (gate.Decision, error) {
	g.asked.Add(1)
	if g.open.Load() {
		return gate.Admitted, nil
	}
	return gate.Decision{Verdict: gate.Wait, Delay: 20 * time.Millisecond, Reason: "closed"}, nil
}

// --gate-wait-timeout (gate_wait_timeout): a request waiting on a pool
// gate's Wait longer than the timeout is re-queued with no result and
// counted in gate_wait_requeues_total; one whose deadline comes first ends
// with DEADLINE_EXCEEDED; 0 waits until the deadline. While it waits,
// gate_waiting_requests counts it.
func TestGateWaitTimeout(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte(`{}`)) }))
	t.Cleanup(srv.Close)
	labels := map[string]string{"queue_id": e2eQueue, "queue_name": e2eQueue, "pool_name": "p"}
	run := func(t *testing.T, timeout *time.Duration, deadline time.Duration) (*harness, *waitGate, *prometheus.Registry) {
		g := &waitGate{}
		ad := testAdapters(t)
		if err := ad.Gates.Register("test-wait", func(gate.Params, gate.Env) (gate.Gate, error) { return g, nil }); err != nil {
			t.Fatal(err)
		}
		cfg := &config.Config{
			Transport: memory.Name, MetricsPort: -1, HealthPort: -1, DrainTimeout: config.Duration(time.Second),
			WorkerPools: []config.WorkerPool{{ID: "p", Workers: 2, GateType: "test-wait"}},
			TransportConfig: config.TransportConfig{ResultQueueName: e2eResults, Queues: []config.Queue{
				{Queue: transport.Queue{Name: e2eQueue}, IGWBaseURL: srv.URL, WorkerPoolID: "p"}}},
		}
		if timeout != nil {
			d := config.Duration(*timeout)
			cfg.GateWaitTimeout = &d
		}
		reg := prometheus.NewRegistry()
		h := startAppWith(t, cfg, Options{Adapters: ad, Transport: memory.New(memory.Options{}), Registry: reg})
		if err := h.mem.Enqueue(e2eQueue, idRequest("r", time.Now().Add(deadline))); err != nil {
			t.Fatal(err)
		}
		return h, g, reg
	}
	requeues := func(reg *prometheus.Registry) float64 {
		return metricValue(t, reg, "llm_d_async_async_gate_wait_requeues_total", labels)
	}

	t.Run("timeout before the deadline: re-queued, then dispatched", func(t *testing.T) {
		d := 200 * time.Millisecond
		h, g, reg := run(t, &d, time.Minute)
		waitFor(t, func() bool {
			return metricValue(t, reg, "llm_d_async_async_gate_waiting_requests", labels) == 1
		}, 5*time.Second)
		waitFor(t, func() bool { return requeues(reg) >= 2 }, 5*time.Second)
		if n, _ := h.mem.ResultCount(e2eResults); n != 0 {
			t.Fatalf("%d results while the gate waited: a re-queue writes none", n)
		}
		g.open.Store(true)
		res := h.waitResults(1, 10*time.Second)
		if r := res["r"]; !r.OK() {
			t.Fatalf("result %+v, want the gateway's answer", r)
		}
		waitFor(t, func() bool {
			return metricValue(t, reg, "llm_d_async_async_gate_waiting_requests", labels) == 0
		}, 5*time.Second)
	})
	t.Run("deadline before the timeout: DEADLINE_EXCEEDED", func(t *testing.T) {
		h, _, reg := run(t, nil, 600*time.Millisecond) // the default, 5m
		res := h.waitResults(1, 10*time.Second)
		if r := res["r"]; r.ErrorCode != wire.CodeDeadlineExceeded {
			t.Fatalf("result %+v, want DEADLINE_EXCEEDED", r)
		}
		if n := requeues(reg); n != 0 {
			t.Fatalf("%v wait re-queues, want 0", n)
		}
	})
	t.Run("0: until the deadline", func(t *testing.T) {
		zero := time.Duration(0)
		h, g, reg := run(t, &zero, 800*time.Millisecond)
		res := h.waitResults(1, 10*time.Second)
		if r := res["r"]; r.ErrorCode != wire.CodeDeadlineExceeded {
			t.Fatalf("result %+v, want DEADLINE_EXCEEDED", r)
		}
		if n := requeues(reg); n != 0 {
			t.Fatalf("%v wait re-queues, want 0", n)
		}
		if g.asked.Load() < 5 {
			t.Fatalf("asked %d times over 800ms: the request did not wait", g.asked.Load())
		}
	})
}

// The drain_limit gauges a leased-rate gate registers on
// gate.Env.PoolMetrics reach the deployment's registry, labelled with the
// gate's pool (a pool gate's pool id; a queue gate's worker_pool_id).
func TestLeaseMetrics(t *testing.T) {
	ad := testAdapters(t)
	until := time.UnixMilli(1_900_000_000_123)
	if err := ad.Gates.Register("test-lease", func(_ gate.Params, env gate.Env) (gate.Gate, error) {
		rec, err := redisleasedrate.LeaseGauges(env.PoolMetrics, env.Pool)
		if err != nil || rec == nil {
			return nil, fmt.Errorf("lease gauges: %v (recorder %v)", err, rec != nil)
		}
		rec(env.Pool, 2.5, true, until)
		return &waitGate{}, nil
	}); err != nil {
		t.Fatal(err)
	}
	cfg := &config.Config{
		Transport: memory.Name, MetricsPort: -1, HealthPort: -1, DrainTimeout: config.Duration(time.Second),
		WorkerPools: []config.WorkerPool{{ID: "pa", Workers: 1, GateType: "test-lease"}},
		TransportConfig: config.TransportConfig{ResultQueueName: e2eResults, Queues: []config.Queue{
			{Queue: transport.Queue{Name: e2eQueue}, IGWBaseURL: "http://127.0.0.1:1", WorkerPoolID: "pa"}}},
	}
	reg := prometheus.NewRegistry()
	startAppWith(t, cfg, Options{Adapters: ad, Transport: memory.New(memory.Options{}), Registry: reg})
	pool := map[string]string{"pool_name": "pa"}
	if v := metricValue(t, reg, "llm_d_async_async_drain_limit_rps", pool); v != 2.5 {
		t.Errorf("drain_limit_rps %v, want 2.5", v)
	}
	if v := metricValue(t, reg, "llm_d_async_async_drain_limit_lease_valid", pool); v != 1 {
		t.Errorf("drain_limit_lease_valid %v, want 1", v)
	}
	if v := metricValue(t, reg, "llm_d_async_async_drain_limit_valid_until_seconds", pool); v != 1_900_000_000.123 {
		t.Errorf("drain_limit_valid_until_seconds %v, want 1900000000.123", v)
	}
}

// tokens_total counts the usage of 2xx JSON answers by direction, and
// dispatched_requests_total every attempt, the retried ones included.
func TestTokensAndDispatched(t *testing.T) {
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == "PRI" {
			return
		}
		switch id := r.Header.Get("x-test-id"); {
		case id == "retried" && calls.Add(1) == 1:
			w.WriteHeader(http.StatusServiceUnavailable)
		case id == "bad":
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write([]byte(`{"usage":{"prompt_tokens":1000,"completion_tokens":1000}}`)) // not 2xx: not counted
		default:
			_, _ = w.Write([]byte(`{"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":11}}`))
		}
	}))
	t.Cleanup(srv.Close)
	cfg := &config.Config{
		Transport: memory.Name, MetricsPort: -1, HealthPort: -1, DrainTimeout: config.Duration(time.Second),
		Retry: config.Retry{Base: config.Duration(time.Millisecond), Max: config.Duration(5 * time.Millisecond)},
		TransportConfig: config.TransportConfig{ResultQueueName: e2eResults, Queues: []config.Queue{
			{Queue: transport.Queue{Name: e2eQueue}, IGWBaseURL: srv.URL}}},
	}
	reg := prometheus.NewRegistry()
	h := startAppWith(t, cfg, Options{Transport: memory.New(memory.Options{}), Registry: reg})
	for _, id := range []string{"plain", "retried", "bad"} {
		if err := h.mem.Enqueue(e2eQueue, idRequest(id, time.Now().Add(time.Minute))); err != nil {
			t.Fatal(err)
		}
	}
	h.waitResults(3, 10*time.Second)
	q := map[string]string{"queue_id": e2eQueue, "queue_name": e2eQueue, "pool_name": "default"}
	if v := metricValue(t, reg, "llm_d_async_async_dispatched_requests_total", q); v != 4 {
		t.Errorf("dispatched %v, want 4 (three requests, one retried once)", v)
	}
	for dir, want := range map[string]float64{"input": 14, "output": 22} {
		l := map[string]string{"direction": dir}
		for k, v := range q {
			l[k] = v
		}
		if v := metricValue(t, reg, "llm_d_async_async_tokens_total", l); v != want {
			t.Errorf("tokens %s %v, want %v (two 2xx answers)", dir, v, want)
		}
	}
}
