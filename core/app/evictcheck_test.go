package app

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/gates/headroom"
	"github.com/sluice-io/sluice/internal/poolsim"
	"github.com/sluice-io/sluice/transports/memory"
)

// TestEvictCheckOnSimulatedPool runs a batch queue with evict behind
// pool-headroom against the simulated pool (2 pods × 16 seats) and bursts
// of interactive requests sent to the pool directly. While the pool
// honours hang-ups the calls taken back show in the pods' abort counters
// and eviction goes on. Once it ignores them (a server that runs an
// aborted call to its end) the check suspends eviction: one warning names
// the queue and the pods, sluice_evict_suspended is 1, the status
// snapshot says it, nothing more is taken back while the gate's limit is
// below what runs, and the queue goes on dispatching under that limit.
// With hang-ups honoured again, eviction resumes after the back-off.
func TestEvictCheckOnSimulatedPool(t *testing.T) {
	pool, front, ctx := startSimPool(t, poolsim.Config{Seed: 1}, nil)
	pods := front + "/pods/0/metrics," + front + "/pods/1/metrics"

	const mc, backoff = 16, 2 * time.Second
	ad := testAdapters(t)
	if err := ad.Gates.Register(headroom.Type, headroom.Factory); err != nil {
		t.Fatal(err)
	}
	raw := func(v any) json.RawMessage { b, _ := json.Marshal(v); return b }
	var logs syncBuffer
	cfg := &config.Config{
		Transport: memory.Name, Concurrency: mc, MetricsPort: -1, HealthPort: -1,
		DrainTimeout: config.Duration(time.Second),
		TransportConfig: config.TransportConfig{ResultQueueName: e2eResults,
			Queues: []config.Queue{{Queue: transport.Queue{Name: e2eQueue, MaxConcurrency: mc}, IGWBaseURL: front,
				GateType: headroom.Type, Evict: true, EvictLimit: -1,
				GateParams: map[string]json.RawMessage{"endpoints": raw(pods), "seats_per_pod": raw(16), "reserve": raw(0),
					"hold": raw("-1ns"), "evict_check_backoff": raw(backoff.String())}}}},
	}
	h := startAppWith(t, cfg, Options{Adapters: ad, Transport: memory.New(memory.Options{}), Registry: prometheus.NewRegistry(),
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	m := h.app.metrics
	evicted := func() float64 { return testutil.ToFloat64(m.Evicted.WithLabelValues(e2eQueue, e2eQueue, "default")) }
	dispatched := func() float64 { return testutil.ToFloat64(m.Dispatched.WithLabelValues(e2eQueue, e2eQueue, "default")) }
	suspended := func() float64 { return testutil.ToFloat64(m.EvictSuspended.WithLabelValues(e2eQueue)) }
	running := func() int {
		n := 0
		for _, g := range pool.PodGauges() {
			n += g.Running + g.Waiting
		}
		return n
	}

	// A backlog of long batch requests fills the queue's 16 calls.
	far := time.Now().Add(10 * time.Minute)
	for i := range 200 {
		if err := h.mem.Enqueue(e2eQueue, request(fmt.Sprintf("b%03d", i), far, map[string]any{"max_tokens": 400})); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, func() bool { return running() == mc }, 10*time.Second)

	// burst sends n interactive requests straight to the pool; wait ends them.
	var wg sync.WaitGroup
	burst := func(n int) {
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, front+"/v1/completions",
					strings.NewReader(`{"prompt":"hi","max_tokens":100}`))
				req.Header.Set("Content-Type", "application/json")
				if resp, err := http.DefaultClient.Do(req); err == nil {
					resp.Body.Close()
				}
			}()
		}
	}

	// Hang-ups honoured: the burst takes seats back, the pods count the
	// aborts, and eviction is not suspended.
	burst(24)
	waitFor(t, func() bool { return evicted() >= 4 }, 5*time.Second)
	time.Sleep(time.Second) // the check's readings
	if suspended() != 0 || strings.Contains(logs.String(), "eviction suspended") {
		t.Fatalf("hang-ups honoured: suspended %v; logs:\n%s", suspended(), logs.String())
	}
	wg.Wait()
	waitFor(t, func() bool { return running() == mc }, 10*time.Second)

	// Hang-ups ignored: the calls taken back run on; the check suspends
	// eviction within its readings.
	pool.SetIgnoreHangups(true)
	before := evicted()
	burst(24)
	waitFor(t, func() bool { return suspended() == 1 }, 5*time.Second)
	suspendedAt := time.Now()
	atSuspension := evicted()
	if atSuspension <= before {
		t.Fatalf("suspended without an eviction (evicted %v before, %v now)", before, atSuspension)
	}
	if n := logs.count("eviction suspended"); n != 1 {
		t.Fatalf("%d suspension lines, want 1:\n%s", n, logs.String())
	}
	line := logs.String()[strings.Index(logs.String(), "eviction suspended"):]
	line = line[:strings.IndexByte(line, '\n')]
	for _, want := range []string{"queue=" + e2eQueue, front + "/pods/0/metrics", "counted 0 of the"} {
		if !strings.Contains(line, want) {
			t.Errorf("the suspension line does not say %q: %s", want, line)
		}
	}
	var snap string
	for _, q := range h.app.Pipeline().Snapshot().Queues {
		if q.ID == e2eQueue {
			snap = q.Evict + ": " + q.EvictReason
		}
	}
	if !strings.HasPrefix(snap, "suspended: pods ") {
		t.Errorf("status snapshot: %q, want the suspension", snap)
	}
	// While suspended: the gate's limit is below what runs, yet nothing is
	// taken back; and once the burst ends the queue dispatches again.
	credits := h.app.Pipeline().Credits(e2eQueue)
	sawGated := false
	d0 := dispatched()
	for time.Since(suspendedAt) < backoff*8/10 {
		if inflight, limit, _ := credits.Snapshot(); limit < inflight {
			sawGated = true
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := evicted(); got != atSuspension {
		t.Fatalf("evicted %v while suspended (%v at the suspension)", got, atSuspension)
	}
	if !sawGated {
		t.Error("the gate's limit never fell below the queue's in-flight while suspended: the test did not load the pool")
	}
	wg.Wait()
	waitFor(t, func() bool { return dispatched() > d0 }, 10*time.Second)
	if suspended() != 1 && time.Since(suspendedAt) < backoff {
		t.Fatal("the suspension ended before its back-off")
	}

	// Hang-ups honoured again: after the back-off eviction resumes, and
	// its check passes.
	pool.SetIgnoreHangups(false)
	waitFor(t, func() bool { return suspended() == 0 }, 2*backoff)
	if time.Since(suspendedAt) < backoff {
		t.Fatalf("the suspension ended %v after it began, before its back-off %v", time.Since(suspendedAt), backoff)
	}
	waitFor(t, func() bool { return running() >= mc }, 20*time.Second)
	resumed := evicted()
	burst(24)
	waitFor(t, func() bool { return evicted() > resumed }, 5*time.Second)
	time.Sleep(time.Second) // the check's readings
	if suspended() != 0 || logs.count("eviction suspended") != 1 || logs.count("eviction resumed") != 1 {
		t.Fatalf("after the back-off: suspended %v; logs:\n%s", suspended(), logs.String())
	}
	wg.Wait()
}

// startSimPool starts the simulated pool of cfg on a free loopback port
// (onRecord, when set, sees every request it ends) and returns it, its
// front's URL and a context ended with the test.
func startSimPool(t *testing.T, cfg poolsim.Config, onRecord func(poolsim.Record)) (*poolsim.Pool, string, context.Context) {
	t.Helper()
	pool, err := poolsim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if onRecord != nil {
		pool.OnRecord(onRecord)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := pool.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pool.Close() })
	front, err := pool.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return pool, front, ctx
}
