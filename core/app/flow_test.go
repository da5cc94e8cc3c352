package app

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/transports/memory"
)

// peakServer is a gateway that sleeps and records the peak of calls in
// flight and when each call started and ended.
type peakServer struct {
	mu             sync.Mutex
	inflight, peak int
	started, ended map[string]time.Time
	sleep          time.Duration
}

func newPeakServer(t *testing.T, sleep time.Duration) (*peakServer, string) {
	s := &peakServer{sleep: sleep, started: map[string]time.Time{}, ended: map[string]time.Time{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == "PRI" {
			return // dispatch.protocol auto's h2c preface (see flow_test.go)
		}
		id := r.Header.Get("x-test-id")
		s.mu.Lock()
		s.inflight++
		s.peak = max(s.peak, s.inflight)
		s.started[id] = time.Now()
		s.mu.Unlock()
		time.Sleep(s.sleep)
		s.mu.Lock()
		s.inflight--
		s.ended[id] = time.Now()
		s.mu.Unlock()
		_, _ = w.Write([]byte(`{}`))
	}))
	t.Cleanup(srv.Close)
	return s, srv.URL
}

func (s *peakServer) peakInflight() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.peak
}

// idRequest is a request whose id the gateway sees in a header.
func idRequest(id string, deadline time.Time) []byte {
	return []byte(`{"id":"` + id + `","deadline":` + strconv.FormatFloat(float64(deadline.UnixMilli())/1000, 'f', 3, 64) +
		`,"payload":{"prompt":"hi"},"headers":{"x-test-id":"` + id + `"}}`)
}

// A worker pool bounds the requests in flight of all its queues together:
// three queues of a pool of 3 workers never have more than 3 calls out,
// although each queue alone may use 3.
func TestWorkerPoolSharedByItsQueues(t *testing.T) {
	gw, url := newPeakServer(t, 30*time.Millisecond)
	var queues []config.Queue
	for _, name := range []string{"qa", "qb", "qc"} {
		queues = append(queues, config.Queue{Queue: transport.Queue{Name: name}, IGWBaseURL: url, WorkerPoolID: "shared"})
	}
	cfg := &config.Config{
		Transport: memory.Name, MetricsPort: -1, HealthPort: -1, DrainTimeout: config.Duration(time.Second),
		WorkerPools:     []config.WorkerPool{{ID: "shared", Workers: 3}},
		TransportConfig: config.TransportConfig{ResultQueueName: e2eResults, Queues: queues},
	}
	h := startAppWith(t, cfg, Options{Transport: memory.New(memory.Options{})})
	for i := range 60 {
		q := queues[i%3].Name
		if err := h.mem.Enqueue(q, idRequest(q+"-"+strconv.Itoa(i), time.Now().Add(time.Minute))); err != nil {
			t.Fatal(err)
		}
	}
	h.waitResults(60, 20*time.Second)
	if p := gw.peakInflight(); p > 3 || p < 2 {
		t.Errorf("peak in flight %d across the pool's queues, want ≤ 3 (and some concurrency)", p)
	}
}

// slotGate admits one request at a time: while its slot is taken it
// answers Wait (or, with deferring set, Defer), and the Release of the
// admitted request frees it. It counts admissions and releases.
type slotGate struct {
	mu               sync.Mutex
	taken            bool
	admits, releases int
	waits, defers    int
	deferring        bool
}

func (g *slotGate) Budget(context.Context) (float64, error) { return 1, nil }

func (g *slotGate) Admit(_ context.Context, req *wire.Request) (gate.Decision, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.taken {
		if g.deferring {
			g.defers++
			return gate.Decision{Verdict: gate.Defer, Delay: 10 * time.Millisecond}, nil
		}
		g.waits++
		return gate.Decision{Verdict: gate.Wait, Reason: "slot taken"}, nil
	}
	g.taken = true
	g.admits++
	return gate.Decision{Verdict: gate.Admit, Release: func() {
		g.mu.Lock()
		g.taken = false
		g.releases++
		g.mu.Unlock()
	}}, nil
}

func (g *slotGate) counts() (admits, releases, waits, defers int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.admits, g.releases, g.waits, g.defers
}

func flowApp(t *testing.T, url string, poolGate, queueGate gate.Gate, mutate func(*config.Config)) *harness {
	t.Helper()
	ad := testAdapters(t)
	for name, g := range map[string]gate.Gate{"test-pool": poolGate, "test-queue": queueGate} {
		if g == nil {
			continue
		}
		if err := ad.Gates.Register(name, func(gate.Params, gate.Env) (gate.Gate, error) { return g, nil }); err != nil {
			t.Fatal(err)
		}
	}
	pool := config.WorkerPool{ID: "p", Workers: 8}
	if poolGate != nil {
		pool.GateType = "test-pool"
	}
	q := config.Queue{Queue: transport.Queue{Name: e2eQueue}, IGWBaseURL: url, WorkerPoolID: "p"}
	if queueGate != nil {
		q.GateType = "test-queue"
	}
	cfg := &config.Config{
		Transport: memory.Name, MetricsPort: -1, HealthPort: -1, DrainTimeout: config.Duration(time.Second),
		WorkerPools:     []config.WorkerPool{pool},
		TransportConfig: config.TransportConfig{ResultQueueName: e2eResults, Queues: []config.Queue{q}},
	}
	if mutate != nil {
		mutate(cfg)
	}
	return startAppWith(t, cfg, Options{Adapters: ad, Transport: memory.New(memory.Options{})})
}

// A pool gate's Wait keeps requests in flight, without re-queueing them,
// and a release wakes the next one at once (not after a polling period).
func TestWaitVerdictWokenByRelease(t *testing.T) {
	gw, url := newPeakServer(t, 100*time.Millisecond)
	g := &slotGate{}
	h := flowApp(t, url, g, nil, nil)
	ids := []string{"w1", "w2", "w3", "w4"}
	for _, id := range ids {
		if err := h.mem.Enqueue(e2eQueue, idRequest(id, time.Now().Add(time.Minute))); err != nil {
			t.Fatal(err)
		}
	}
	res := h.waitResults(len(ids), 10*time.Second)
	for _, id := range ids {
		if r := res[id]; !r.OK() {
			t.Errorf("%s: %+v", id, r)
		}
	}
	if p := gw.peakInflight(); p != 1 {
		t.Errorf("peak in flight %d, want 1 (one slot)", p)
	}
	admits, releases, waits, defers := g.counts()
	if admits != 4 || releases != 4 || waits == 0 || defers != 0 {
		t.Errorf("admits %d releases %d waits %d defers %d", admits, releases, waits, defers)
	}
	// Each call after the first started right after the previous one ended:
	// woken by the release, not by the 1 s re-ask.
	gw.mu.Lock()
	defer gw.mu.Unlock()
	var ends []time.Time
	for _, id := range ids {
		ends = append(ends, gw.ended[id])
	}
	for _, id := range ids {
		start := gw.started[id]
		var prev time.Time
		for _, e := range ends {
			if e.Before(start) && e.After(prev) {
				prev = e
			}
		}
		if !prev.IsZero() && start.Sub(prev) > 500*time.Millisecond {
			t.Errorf("%s started %v after the previous call ended: not woken by the release", id, start.Sub(prev))
		}
	}
}

// A Wait that outlasts the deadline ends the request with DEADLINE_EXCEEDED.
func TestWaitUntilDeadline(t *testing.T) {
	_, url := newPeakServer(t, 2*time.Second)
	g := &slotGate{}
	h := flowApp(t, url, g, nil, nil)
	if err := h.mem.Enqueue(e2eQueue, idRequest("long", time.Now().Add(time.Minute))); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { a, _, _, _ := g.counts(); return a == 1 }, 5*time.Second)
	if err := h.mem.Enqueue(e2eQueue, idRequest("short", time.Now().Add(500*time.Millisecond))); err != nil {
		t.Fatal(err)
	}
	res := h.waitResults(2, 10*time.Second)
	if r := res["short"]; r.ErrorCode != wire.CodeDeadlineExceeded {
		t.Errorf("short: %+v", r)
	}
	if r := res["long"]; !r.OK() {
		t.Errorf("long: %+v", r)
	}
}

// A request admitted by the queue's gate and refused by the pool's gives
// its queue reservation back (all or nothing), and a pool gate's Reject
// answers with the gate's own result.
func TestPoolGateAfterQueueGate(t *testing.T) {
	_, url := newPeakServer(t, 0)
	queueGate := &slotGate{}
	poolGate := rejectGate{result: &wire.Result{Payload: `{"error": "Too Many Requests", "code": 429}`}}
	h := flowApp(t, url, poolGate, queueGate, nil)
	for _, id := range []string{"r1", "r2"} {
		if err := h.mem.Enqueue(e2eQueue, idRequest(id, time.Now().Add(time.Minute))); err != nil {
			t.Fatal(err)
		}
	}
	res := h.waitResults(2, 10*time.Second)
	for _, id := range []string{"r1", "r2"} {
		r := res[id]
		if r.Payload != `{"error": "Too Many Requests", "code": 429}` || r.StatusCode != 0 || r.ErrorCode != wire.CodeNone || r.ID != id {
			t.Errorf("%s: %+v", id, r)
		}
	}
	if admits, releases, _, _ := queueGate.counts(); admits != 2 || releases != 2 {
		t.Errorf("queue gate: %d admits, %d releases: a refused request must give its reservation back", admits, releases)
	}
}

// rejectGate drops every request with its result.
type rejectGate struct{ result *wire.Result }

func (rejectGate) Budget(context.Context) (float64, error) { return 1, nil }

func (g rejectGate) Admit(context.Context, *wire.Request) (gate.Decision, error) {
	return gate.Decision{Verdict: gate.Reject, Result: g.result}, nil
}

// At shutdown a waiting request goes back to its queue unanswered.
func TestWaitingRequestRequeuedAtShutdown(t *testing.T) {
	gw, url := newPeakServer(t, 300*time.Millisecond)
	g := &slotGate{}
	h := flowApp(t, url, g, nil, nil)
	for _, id := range []string{"first", "second"} {
		if err := h.mem.Enqueue(e2eQueue, idRequest(id, time.Now().Add(time.Minute))); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, func() bool { _, _, w, _ := g.counts(); return w > 0 }, 5*time.Second)
	if err := h.shutdown(); err != nil {
		t.Fatal(err)
	}
	res := h.mem.Results(e2eResults)
	if len(res) != 1 {
		t.Errorf("%d results after shutdown, want the dispatched one only", len(res))
	}
	d, _ := h.mem.Depth(context.Background(), transport.Queue{Name: e2eQueue})
	if d.Waiting+d.Delayed != 1 || d.InFlight != 0 {
		t.Errorf("depth after shutdown %+v: the waiting request should be back in the queue", d)
	}
	gw.mu.Lock()
	defer gw.mu.Unlock()
	if len(gw.started) != 1 {
		t.Errorf("%d requests dispatched, want 1: the waiting one must not start during shutdown", len(gw.started))
	}
}

// classifyingGate labels every request "overflow" and defers it once; it
// records the classification and tier each request carries when asked.
type classifyingGate struct {
	mu   sync.Mutex
	seen map[string][]string // id → "classification/tier" at each Admit
}

func (g *classifyingGate) Budget(context.Context) (float64, error) { return 1, nil }

func (g *classifyingGate) Admit(_ context.Context, req *wire.Request) (gate.Decision, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.seen[req.ID] = append(g.seen[req.ID], req.Classification()+"/"+req.Label("tier"))
	if len(g.seen[req.ID]) == 1 {
		req.SetClassification(wire.ClassOverflow)
		return gate.Decision{Verdict: gate.Defer, Delay: 10 * time.Millisecond}, nil
	}
	return gate.Admitted, nil
}

// A gate's classification survives the re-queue of a deferral, the queue's
// labels are set on its requests, and the deferral counts as
// quota_exhausted (an overflow refusal).
func TestLabelsSurviveRequeue(t *testing.T) {
	_, url := newPeakServer(t, 0)
	g := &classifyingGate{seen: map[string][]string{}}
	reg := prometheus.NewRegistry()
	ad := testAdapters(t)
	if err := ad.Gates.Register("test-classify", func(gate.Params, gate.Env) (gate.Gate, error) { return g, nil }); err != nil {
		t.Fatal(err)
	}
	cfg := &config.Config{
		Transport: memory.Name, MetricsPort: -1, HealthPort: -1, DrainTimeout: config.Duration(time.Second),
		TransportConfig: config.TransportConfig{ResultQueueName: e2eResults, Queues: []config.Queue{{
			Queue: transport.Queue{Name: e2eQueue}, IGWBaseURL: url, GateType: "test-classify", Labels: map[string]string{"tier": "batch"}}}},
	}
	h := startAppWith(t, cfg, Options{Adapters: ad, Transport: memory.New(memory.Options{}), Registry: reg})
	if err := h.mem.Enqueue(e2eQueue, idRequest("c1", time.Now().Add(time.Minute))); err != nil {
		t.Fatal(err)
	}
	if r := h.waitResults(1, 10*time.Second)["c1"]; !r.OK() {
		t.Fatalf("c1: %+v", r)
	}
	g.mu.Lock()
	seen := g.seen["c1"]
	g.mu.Unlock()
	if len(seen) != 2 || seen[0] != "/batch" || seen[1] != "overflow/batch" {
		t.Errorf("labels at each admission %q, want [/batch overflow/batch]", seen)
	}
	labels := map[string]string{"queue_id": e2eQueue, "queue_name": e2eQueue, "pool_name": "default", "reason": "quota_exhausted"}
	if got := metricValue(t, reg, "llm_d_async_async_gate_decisions_total", labels); got != 1 {
		t.Errorf("quota_exhausted decisions = %v, want 1", got)
	}
}

// Under random-robin, the queues of a saturated pool share its workers:
// none of three busy queues is starved while another has work.
func TestRandomRobinSharesThePool(t *testing.T) {
	var mu sync.Mutex
	var order []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == "PRI" {
			// The h2c preface of dispatch.protocol auto's detection, which
			// net/http hands to the handler of an HTTP/1.1-only server.
			return
		}
		mu.Lock()
		order = append(order, r.Header.Get("x-test-id")[:2])
		mu.Unlock()
		time.Sleep(3 * time.Millisecond)
		_, _ = w.Write([]byte(`{}`))
	}))
	t.Cleanup(srv.Close)
	var queues []config.Queue
	for _, name := range []string{"qa", "qb", "qc"} {
		queues = append(queues, config.Queue{Queue: transport.Queue{Name: name}, IGWBaseURL: srv.URL, WorkerPoolID: "shared"})
	}
	cfg := &config.Config{
		Transport: memory.Name, MetricsPort: -1, HealthPort: -1, DrainTimeout: config.Duration(time.Second),
		WorkerPools:     []config.WorkerPool{{ID: "shared", Workers: 2}},
		TransportConfig: config.TransportConfig{ResultQueueName: e2eResults, Queues: queues},
	}
	h := startAppWith(t, cfg, Options{Transport: memory.New(memory.Options{})})
	const per = 40
	for i := range per {
		for _, q := range queues {
			if err := h.mem.Enqueue(q.Name, idRequest(q.Name+"-"+strconv.Itoa(i), time.Now().Add(time.Minute))); err != nil {
				t.Fatal(err)
			}
		}
	}
	h.waitResults(3*per, 20*time.Second)
	mu.Lock()
	defer mu.Unlock()
	// While every queue still has work (the first 2/3 of the calls), each
	// gets a fair share: at least a fifth of them.
	counts := map[string]int{}
	for _, q := range order[:2*per] {
		counts[q]++
	}
	for _, q := range queues {
		if counts[q.Name] < 2*per/5 {
			t.Errorf("queue %s got %d of the first %d calls (%v): starved", q.Name, counts[q.Name], 2*per, counts)
		}
	}
}
