package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/transports/memory"
)

// dialGate is a gate whose budget the test sets, read every 5 ms; fail
// makes its readings fail (the refresh loop's policy then decides).
type dialGate struct {
	budget atomic.Value // float64
	fail   atomic.Bool
}

func (g *dialGate) Budget(context.Context) (float64, error) {
	if g.fail.Load() {
		return 0, errors.New("backend down")
	}
	return g.budget.Load().(float64), nil
}

func (g *dialGate) RefreshInterval() time.Duration { return 5 * time.Millisecond }

// holdingGateway holds every call until open is closed, and records the
// order calls arrived in and the calls whose client went away.
type holdingGateway struct {
	open chan struct{}

	mu       sync.Mutex
	arrivals []string       // ids, in arrival order (a re-dispatch appears again)
	aborted  map[string]int // id → calls abandoned by sluice
	served   map[string]int // id → 200 answers
	holding  int
}

func newHoldingGateway(t *testing.T) (*holdingGateway, string) {
	g := &holdingGateway{open: make(chan struct{}), aborted: map[string]int{}, served: map[string]int{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var p struct {
			ID string `json:"id"`
		}
		if json.Unmarshal(body, &p) != nil || p.ID == "" {
			return // the protocol probe
		}
		g.mu.Lock()
		g.arrivals = append(g.arrivals, p.ID)
		g.holding++
		g.mu.Unlock()
		select {
		case <-g.open:
			g.mu.Lock()
			g.holding--
			g.served[p.ID]++
			g.mu.Unlock()
			_, _ = w.Write([]byte(`{"id":"cmpl-` + p.ID + `","choices":[{"text":"ok"}]}`))
		case <-r.Context().Done():
			g.mu.Lock()
			g.holding--
			g.aborted[p.ID]++
			g.mu.Unlock()
		}
	}))
	t.Cleanup(srv.Close)
	return g, srv.URL
}

func (g *holdingGateway) snapshot() (holding int, arrivals []string, aborted map[string]int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	ab := map[string]int{}
	for k, v := range g.aborted {
		ab[k] = v
	}
	return g.holding, slices.Clone(g.arrivals), ab
}

// startEvictApp runs a deployment of one queue (max_concurrency mc, evict
// on, evict_limit limit) against the gateway at url, whose gate is the
// returned dial, at budget 1.
func startEvictApp(t *testing.T, url string, mc, limit int) (*dialGate, *harness) {
	t.Helper()
	return startEvictAppResume(t, url, mc, limit, false)
}

// startEvictAppResume is startEvictApp with the queue's resume option.
func startEvictAppResume(t *testing.T, url string, mc, limit int, resume bool) (*dialGate, *harness) {
	t.Helper()
	dg := &dialGate{}
	dg.budget.Store(1.0)
	ad := testAdapters(t)
	if err := ad.Gates.Register("dial", func(gate.Params, gate.Env) (gate.Gate, error) { return dg, nil }); err != nil {
		t.Fatal(err)
	}
	cfg := &config.Config{
		Transport: memory.Name, Concurrency: mc, MetricsPort: -1, HealthPort: -1,
		DrainTimeout: config.Duration(2 * time.Second),
		TransportConfig: config.TransportConfig{ResultQueueName: e2eResults,
			Queues: []config.Queue{{Queue: transport.Queue{Name: e2eQueue, MaxConcurrency: mc}, IGWBaseURL: url,
				GateType: "dial", Evict: true, EvictLimit: limit, Resume: resume}}},
	}
	return dg, startAppWith(t, cfg, Options{Adapters: ad, Transport: memory.New(memory.Options{}), Registry: prometheus.NewRegistry()})
}

// TestEvictOnBudgetDrop: with the queue's evict option, a measured fall of
// the gate's budget aborts the youngest calls over the new limit at once
// and re-queues them without counting an attempt; a failing gate (fail
// closed: budget 0) aborts nothing; every request still ends in exactly
// one 200 result.
func TestEvictOnBudgetDrop(t *testing.T) {
	const mc, requests = 8, 20
	gw, url := newHoldingGateway(t)
	dg, h := startEvictApp(t, url, mc, 0)
	far := time.Now().Add(2 * time.Minute)
	// the first 8 one by one, so their ages are known
	for i := range requests {
		if err := h.mem.Enqueue(e2eQueue, request(fmt.Sprintf("r%02d", i), far, nil)); err != nil {
			t.Fatal(err)
		}
		if i < mc {
			waitFor(t, func() bool { n, _, _ := gw.snapshot(); return n == i+1 }, 5*time.Second)
			time.Sleep(2 * time.Millisecond)
		}
	}
	time.Sleep(20 * time.Millisecond)
	if n, arr, _ := gw.snapshot(); n != mc || len(arr) != mc {
		t.Fatalf("%d held, arrivals %v: want the first 8 held, the rest queued", n, arr)
	}

	// A failing gate under fail-closed drops the budget to 0: no new
	// claims, but nothing running is taken back.
	dg.fail.Store(true)
	time.Sleep(60 * time.Millisecond)
	if n, _, ab := gw.snapshot(); n != mc || len(ab) != 0 {
		t.Fatalf("a failing gate evicted: %d held, aborted %v", n, ab)
	}
	dg.fail.Store(false)

	// Half the budget: the 4 youngest calls are aborted.
	dg.budget.Store(0.5)
	waitFor(t, func() bool { n, _, _ := gw.snapshot(); return n <= mc/2 }, 2*time.Second)
	time.Sleep(30 * time.Millisecond) // nothing more goes
	n, arrivals, aborted := gw.snapshot()
	if n != mc/2 || len(aborted) != mc/2 {
		t.Fatalf("after the fall: %d held, aborted %v; want 4 and 4", n, aborted)
	}
	for _, id := range arrivals[mc/2 : mc] {
		if aborted[id] != 1 {
			t.Errorf("%s, one of the 4 youngest calls (arrivals %v), was not aborted once (aborted %v)", id, arrivals[:mc], aborted)
		}
	}
	if got := testutil.ToFloat64(h.app.metrics.Evicted.WithLabelValues(e2eQueue, e2eQueue, "default")); got != mc/2 {
		t.Errorf("sluice_evicted_total %v, want 4", got)
	}

	// Open up and let everything finish.
	dg.budget.Store(1.0)
	close(gw.open)
	res := h.waitResults(requests, 30*time.Second) // fails on a second result for an id
	if err := h.shutdown(); err != nil {
		t.Fatal(err)
	}
	for i := range requests {
		id := fmt.Sprintf("r%02d", i)
		if r, ok := res[id]; !ok || r.StatusCode != http.StatusOK || r.ErrorCode != "" {
			t.Errorf("%s: %+v (found %v), want one 200", id, r, ok)
		}
	}
	gw.mu.Lock()
	for id, k := range gw.served {
		if k != 1 {
			t.Errorf("%s served %d times", id, k)
		}
	}
	gw.mu.Unlock()
	if got := testutil.ToFloat64(h.app.metrics.Retries.WithLabelValues(e2eQueue, e2eQueue, "default")); got != 0 {
		t.Errorf("%v retries counted; an eviction is no attempt", got)
	}
}

// TestEvictLimit: a request taken back evict_limit times runs to its end;
// a later fall takes older calls back instead.
func TestEvictLimit(t *testing.T) {
	const mc = 4
	gw, url := newHoldingGateway(t)
	dg, h := startEvictApp(t, url, mc, 1)
	far := time.Now().Add(2 * time.Minute)
	for i := range mc {
		if err := h.mem.Enqueue(e2eQueue, request(fmt.Sprintf("r%d", i), far, nil)); err != nil {
			t.Fatal(err)
		}
		waitFor(t, func() bool { n, _, _ := gw.snapshot(); return n == i+1 }, 5*time.Second)
		time.Sleep(2 * time.Millisecond)
	}
	held := func(n int) func() bool {
		return func() bool { k, _, _ := gw.snapshot(); return k == n }
	}
	dg.budget.Store(0.5) // r2 and r3, the youngest, go back
	waitFor(t, held(2), 2*time.Second)
	dg.budget.Store(1.0) // they come back, now the youngest calls
	waitFor(t, held(4), 2*time.Second)
	dg.budget.Store(0.5) // r2 and r3 were taken back once: r0 and r1 go instead
	waitFor(t, held(2), 2*time.Second)
	time.Sleep(30 * time.Millisecond)
	if _, _, ab := gw.snapshot(); len(ab) != 4 || ab["r0"] != 1 || ab["r1"] != 1 || ab["r2"] != 1 || ab["r3"] != 1 {
		t.Fatalf("aborted %v, want each of r0..r3 once (r2, r3 first, then r0, r1: r2 and r3 had used their one eviction)", ab)
	}
	dg.budget.Store(1.0)
	close(gw.open)
	res := h.waitResults(mc, 30*time.Second)
	if err := h.shutdown(); err != nil {
		t.Fatal(err)
	}
	for i := range mc {
		if r, ok := res[fmt.Sprintf("r%d", i)]; !ok || r.StatusCode != http.StatusOK {
			t.Errorf("r%d: %+v, want one 200", i, r)
		}
	}
}
