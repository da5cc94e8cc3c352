package app

import (
	"context"
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
