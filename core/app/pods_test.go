package app

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/gates/headroom"
	"github.com/sluice-io/sluice/internal/poolsim"
	"github.com/sluice-io/sluice/transports/memory"
)

// TestPodsOnSimulatedPool runs a batch queue behind pool-headroom with
// dispatch "pods" (evict and resume on) against the simulated pool's real
// pods (2 × 16 seats, prefix caching): the batch goes straight to the pods,
// never to the queue's gateway, and fills each pod to its own limit; a
// burst of interactive requests on pod 0 takes back calls on pod 0 only;
// the calls taken back resume on pod 0, where their tokens are cached
// (the pod's prefix-cache hits grow); every request ends with one result.
func TestPodsOnSimulatedPool(t *testing.T) {
	var records sync.Mutex
	aborted := map[int]int{} // pod → batch calls aborted
	pool, front, ctx := startSimPool(t, poolsim.Config{Seed: 1, Engine: poolsim.EngineConfig{PrefixCaching: true}}, func(r poolsim.Record) {
		if r.Class == poolsim.ClassBatch && r.FinishReason == "abort" {
			records.Lock()
			aborted[r.Pod]++
			records.Unlock()
		}
	})
	var viaGateway atomic.Int64
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > 0 && r.URL.Path != "/" {
			viaGateway.Add(1)
		}
		http.Error(w, "not the pods", http.StatusServiceUnavailable)
	}))
	defer gw.Close()

	const mc, n = 64, 40
	ad := testAdapters(t)
	if err := ad.Gates.Register(headroom.Type, headroom.Factory); err != nil {
		t.Fatal(err)
	}
	raw := func(v any) json.RawMessage { b, _ := json.Marshal(v); return b }
	cfg := &config.Config{
		Transport: memory.Name, Concurrency: mc, MetricsPort: -1, HealthPort: -1,
		DrainTimeout: config.Duration(time.Second),
		TransportConfig: config.TransportConfig{ResultQueueName: e2eResults,
			Queues: []config.Queue{{Queue: transport.Queue{Name: e2eQueue, MaxConcurrency: mc}, IGWBaseURL: gw.URL,
				GateType: headroom.Type, Evict: true, EvictLimit: -1, Resume: true, InferenceObjective: "batch-sheddable",
				GateParams: map[string]json.RawMessage{"endpoints": raw(front + "/pods/0/metrics," + front + "/pods/1/metrics"),
					"seats_per_pod": raw(16), "reserve": raw(2), "hold": raw("-1ns"), "dispatch": raw("pods"),
					"pending_prefills": raw(16), "evict_check": raw("off")}}}},
	}
	h := startAppWith(t, cfg, Options{Adapters: ad, Transport: memory.New(memory.Options{}), Registry: prometheus.NewRegistry()})

	far := time.Now().Add(10 * time.Minute)
	for i := range n {
		if err := h.mem.Enqueue(e2eQueue, request(fmt.Sprintf("b%03d", i), far, map[string]any{"max_tokens": 200})); err != nil {
			t.Fatal(err)
		}
	}
	batchOn := func(i int) int { return pool.PodGauges()[i].RunningByClass[poolsim.ClassBatch] }
	// each pod filled to its own limit: 16 seats less the reserve of 2
	filled := func() bool { return batchOn(0) == 14 && batchOn(1) == 14 }
	for end := time.Now().Add(10 * time.Second); !filled() && time.Now().Before(end); {
		time.Sleep(10 * time.Millisecond)
	}
	if !filled() {
		g, _ := gate.Find[*headroom.Gate](h.app.Pipeline().Snapshot().Queues[0].Gate.Gate())
		t.Fatalf("pods hold %d and %d batch calls, want 14 each; gauges %+v, gate %+v", batchOn(0), batchOn(1), pool.PodGauges(), g.Last())
	}

	time.Sleep(1500 * time.Millisecond) // every call makes tokens worth resuming

	// a burst of 8 on pod 0 only
	hitsBefore := pool.PodGauges()[0].PrefixHits
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, front+"/pods/0/v1/completions",
				strings.NewReader(`{"prompt":"interactive","max_tokens":150}`))
			req.Header.Set("Content-Type", "application/json")
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
	}
	waitFor(t, func() bool { records.Lock(); defer records.Unlock(); return aborted[0] >= 8 }, 5*time.Second)
	records.Lock()
	on0, on1 := aborted[0], aborted[1]
	records.Unlock()
	if on1 != 0 {
		t.Errorf("a burst on pod 0 took back %d calls on pod 1 (and %d on pod 0); want none there", on1, on0)
	}
	if b := batchOn(1); b != 14 {
		t.Errorf("pod 1 holds %d batch calls during pod 0's burst, want its 14", b)
	}
	wg.Wait()

	// the calls taken back resume on pod 0, from its prefix cache
	hit := func() bool { return pool.PodGauges()[0].PrefixHits > hitsBefore }
	for end := time.Now().Add(10 * time.Second); !hit() && time.Now().Before(end); {
		time.Sleep(10 * time.Millisecond)
	}
	if hits := pool.PodGauges()[0].PrefixHits; hits <= hitsBefore {
		t.Errorf("pod 0's prefix-cache hits %d → %d: the resumed calls did not come back to their tokens (gauges %+v, resumed tokens %v, evicted %v)", hitsBefore, hits,
			pool.PodGauges(), testutil.ToFloat64(h.app.metrics.Resumed.WithLabelValues(e2eQueue, e2eQueue, "default")), testutil.ToFloat64(h.app.metrics.Evicted.WithLabelValues(e2eQueue, e2eQueue, "default")))
	}

	res := h.waitResults(n, 90*time.Second) // fails on a second result for an id
	for id, r := range res {
		if r.StatusCode != http.StatusOK {
			t.Errorf("%s: status %d %s", id, r.StatusCode, r.Payload)
		}
	}
	if v := viaGateway.Load(); v != 0 {
		t.Errorf("%d batch calls went to the queue's gateway, want every one on a pod", v)
	}
}
