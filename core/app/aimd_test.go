package app

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/gates/aimd"
	"github.com/sluice-io/sluice/gates/composite"
	"github.com/sluice-io/sluice/gates/constant"
	"github.com/sluice-io/sluice/gates/waitonrefuse"
	"github.com/sluice-io/sluice/transports/memory"
)

// saturatingGateway answers like an EPP in legacy admission: it serves at
// most capacity requests at once (each takes service), and answers 429 with
// x-llm-d-request-dropped-reason: rejected-saturated to any request above
// that. It samples how many requests it serves every 2ms.
type saturatingGateway struct {
	capacity   int
	service    time.Duration
	retryAfter string // the Retry-After of a rejection ("": none)

	inflight   atomic.Int64
	peak       atomic.Int64 // the most requests it was asked to hold at once (served + the one rejected)
	attempts   atomic.Int64
	rejections atomic.Int64

	mu       sync.Mutex
	served   map[string]int // id → 200 answers
	samples  []int          // served in flight, every 2ms, from the first request on
	arrived  []time.Time    // each attempt's arrival
	rejected []time.Time    // each rejection's time
	started  bool
	stop     chan struct{}
	done     chan struct{}
}

func newSaturatingGateway(t *testing.T, capacity int, service time.Duration) (*saturatingGateway, string) {
	g := &saturatingGateway{capacity: capacity, service: service, served: map[string]int{},
		stop: make(chan struct{}), done: make(chan struct{})}
	srv := httptest.NewServer(http.HandlerFunc(g.serve))
	t.Cleanup(srv.Close)
	t.Cleanup(g.stopSampling)
	return g, srv.URL
}

func (g *saturatingGateway) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var p struct {
		ID string `json:"id"`
	}
	if json.Unmarshal(body, &p) != nil || p.ID == "" {
		return // the dispatch client's protocol probe: not a request
	}
	g.startSampling()
	g.mu.Lock()
	g.arrived = append(g.arrived, time.Now())
	g.mu.Unlock()
	g.attempts.Add(1)
	n := g.inflight.Add(1)
	for {
		old := g.peak.Load()
		if n <= old || g.peak.CompareAndSwap(old, n) {
			break
		}
	}
	if n > int64(g.capacity) {
		g.inflight.Add(-1)
		g.rejections.Add(1)
		g.mu.Lock()
		g.rejected = append(g.rejected, time.Now())
		g.mu.Unlock()
		w.Header().Set("x-llm-d-request-dropped-reason", "rejected-saturated")
		if g.retryAfter != "" {
			w.Header().Set("Retry-After", g.retryAfter)
		}
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = w.Write([]byte(`{"error":"saturated"}`))
		return
	}
	select {
	case <-time.After(g.service):
	case <-r.Context().Done():
		g.inflight.Add(-1)
		return
	}
	g.inflight.Add(-1)
	g.mu.Lock()
	g.served[p.ID]++
	g.mu.Unlock()
	_, _ = w.Write([]byte(`{"id":"cmpl-` + p.ID + `","choices":[{"text":"ok"}]}`))
}

func (g *saturatingGateway) startSampling() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.started {
		return
	}
	g.started = true
	go func() {
		defer close(g.done)
		tk := time.NewTicker(2 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-g.stop:
				return
			case <-tk.C:
				n := int(min(g.inflight.Load(), int64(g.capacity)))
				g.mu.Lock()
				g.samples = append(g.samples, n)
				g.mu.Unlock()
			}
		}
	}()
}

func (g *saturatingGateway) stopSampling() {
	g.mu.Lock()
	started := g.started
	g.started = true // no sampler starts after this
	g.mu.Unlock()
	select {
	case <-g.stop:
	default:
		close(g.stop)
	}
	if started {
		<-g.done
	}
}

// TestAIMDAgainstASaturatingGateway runs the real pipeline (memory
// transport, the aimd gate as the queue's gate) against a gateway that
// serves at most 8 requests at once and rejects the rest with 429
// rejected-saturated: the gate's window settles near the gateway's
// capacity, the rejections are retried, and every request ends in exactly
// one successful result.
func TestAIMDAgainstASaturatingGateway(t *testing.T) {
	const (
		capacity = 8
		requests = 300
	)
	gw, url := newSaturatingGateway(t, capacity, 25*time.Millisecond)
	elapsed := runAIMD(t, url, requests)
	gw.stopSampling()
	gw.mu.Lock()
	defer gw.mu.Unlock()
	for id, n := range gw.served {
		if n != 1 {
			t.Errorf("%s served %d times", id, n)
		}
	}
	rejections, attempts := gw.rejections.Load(), gw.attempts.Load()
	if rejections == 0 || attempts != int64(requests)+rejections {
		t.Errorf("%d attempts, %d rejections for %d requests: want rejections, each retried until served", attempts, rejections, requests)
	}
	// In flight at the gateway, over the middle of the run (past the first
	// slow start, before the tail drains).
	s := gw.samples
	mid := s[len(s)/5 : len(s)*4/5]
	mean := 0.0
	for _, n := range mid {
		mean += float64(n)
	}
	mean /= float64(len(mid))
	sorted := slices.Sorted(slices.Values(mid))
	p10 := sorted[len(sorted)/10]
	t.Logf("aimd e2e: %d requests in %v, %d attempts (%d rejected), peak asked %d, served in flight over the middle of the run: mean %.2f, p10 %d (capacity %d)",
		requests, elapsed.Round(time.Millisecond), attempts, rejections, gw.peak.Load(), mean, p10, capacity)
	// AIMD with decrease factor 0.5 saws between capacity/2 and capacity:
	// its mean is about 3/4 of it (measured 0.63–0.69 here).
	if mean < 0.5*capacity {
		t.Errorf("mean in flight %.2f over the middle of the run, want near the capacity %d (≥ 50%%)", mean, capacity)
	}
	// Without the gate the queue would send up to 64 at once; the window
	// overshoots the capacity at most by what one flight doubles to.
	if peak := gw.peak.Load(); peak > 2*capacity {
		t.Errorf("the gateway was asked to hold %d requests at once, want the window to stay near its capacity %d", peak, capacity)
	}
	// A rejection is answered at once and retried after 20ms or more: a
	// window that ignored them would make several per served request.
	if float64(rejections) > 0.5*requests {
		t.Errorf("%d rejections for %d requests: the window does not settle", rejections, requests)
	}
}

// runAIMD runs requests through a pipeline whose queue (max_concurrency
// 64) has the aimd gate, against the gateway at url, and checks that each
// ends in exactly one 200 result; it returns how long they took.
func runAIMD(t *testing.T, url string, requests int) time.Duration {
	t.Helper()
	const mc = 64
	ad := testAdapters(t)
	if err := ad.Gates.Register(aimd.Type, aimd.Factory); err != nil {
		t.Fatal(err)
	}
	cfg := &config.Config{
		Transport: memory.Name, Concurrency: mc, MetricsPort: -1, HealthPort: -1,
		DrainTimeout: config.Duration(2 * time.Second),
		Retry:        config.Retry{Base: config.Duration(20 * time.Millisecond), Max: config.Duration(200 * time.Millisecond), Jitter: 0.2},
		TransportConfig: config.TransportConfig{ResultQueueName: e2eResults,
			Queues: []config.Queue{{Queue: transport.Queue{Name: e2eQueue, MaxConcurrency: mc}, IGWBaseURL: url,
				GateType: aimd.Type, GateParams: map[string]json.RawMessage{"max_window": json.RawMessage(`64`)}}}},
	}
	reg := prometheus.NewRegistry()
	h := startAppWith(t, cfg, Options{Adapters: ad, Transport: memory.New(memory.Options{}), Registry: reg})
	far := time.Now().Add(2 * time.Minute)
	start := time.Now()
	for i := range requests {
		if err := h.mem.Enqueue(e2eQueue, request(fmt.Sprintf("r%03d", i), far, nil)); err != nil {
			t.Fatal(err)
		}
	}
	res := h.waitResults(requests, 60*time.Second) // fails on a second result for an id
	elapsed := time.Since(start)
	checkAIMDMetrics(t, reg)
	if err := h.shutdown(); err != nil {
		t.Fatal(err)
	}
	for i := range requests {
		id := fmt.Sprintf("r%03d", i)
		r, ok := res[id]
		switch {
		case !ok:
			t.Errorf("%s: no result", id)
		case r.StatusCode != http.StatusOK || r.ErrorCode != "":
			t.Errorf("%s: %+v, want the gateway's 200", id, r)
		}
	}
	if len(res) != requests {
		t.Errorf("%d results for %d requests", len(res), requests)
	}
	return elapsed
}

// TestAIMDRetryAfterClosesTheBand: a rejection with Retry-After closes the
// band, so nothing new is sent to the gateway until then (the requests
// already admitted finish), and the band reopens after it; every request
// still ends in one successful result.
func TestAIMDRetryAfterClosesTheBand(t *testing.T) {
	const capacity, requests = 4, 60
	gw, url := newSaturatingGateway(t, capacity, 20*time.Millisecond)
	gw.retryAfter = "1"
	runAIMD(t, url, requests)
	gw.stopSampling()
	gw.mu.Lock()
	defer gw.mu.Unlock()
	if len(gw.rejected) == 0 {
		t.Fatal("no rejection: the test did not saturate the gateway")
	}
	first := gw.rejected[0]
	var during, after int
	for _, at := range gw.arrived {
		switch d := at.Sub(first); {
		case d > 50*time.Millisecond && d < 900*time.Millisecond:
			during++
		case d >= 900*time.Millisecond:
			after++
		}
	}
	t.Logf("aimd e2e Retry-After: %d attempts, %d rejections; after the first rejection %d arrivals in (50ms, 900ms), %d later",
		len(gw.arrived), len(gw.rejected), during, after)
	if during != 0 {
		t.Errorf("%d requests sent while Retry-After closed the band", during)
	}
	if after == 0 {
		t.Errorf("nothing sent after the band reopened")
	}
}

// checkAIMDMetrics checks the gate's series: a window per band, and the
// events of its reactions to the rejections.
func checkAIMDMetrics(t *testing.T, reg *prometheus.Registry) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	bands, reactions := 0, 0.0
	for _, mf := range mfs {
		switch mf.GetName() {
		case "sluice_gate_window":
			for _, m := range mf.GetMetric() {
				if m.GetGauge().GetValue() < 1 {
					t.Errorf("window %v below 1", m)
				}
				bands++
			}
		case "sluice_gate_events_total":
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "event" && strings.HasPrefix(l.GetValue(), "aimd_") {
						reactions += m.GetCounter().GetValue()
					}
				}
			}
		}
	}
	if bands != aimd.NumBands {
		t.Errorf("%d sluice_gate_window series, want one per band (%d)", bands, aimd.NumBands)
	}
	if reactions == 0 {
		t.Errorf("no aimd_* event counted in sluice_gate_events_total")
	}
}

// The gates that wrap others pass the aimd gate's Observe on: inside a
// composite or wait-on-refuse, a rejection still shrinks its window.
func TestAIMDLearnsThroughWrappers(t *testing.T) {
	r := gate.NewRegistry()
	for typ, f := range map[string]gate.Factory{
		aimd.Type: aimd.Factory, composite.Type: composite.Factory, waitonrefuse.Type: waitonrefuse.Factory, constant.Type: constant.Factory,
	} {
		if err := r.Register(typ, f); err != nil {
			t.Fatal(err)
		}
	}
	inner := `{"gate_type":"aimd","gate_params":{"initial_window":2}}`
	for _, tt := range []struct{ typ, params string }{
		{composite.Type, `{"gates":[{"gate_type":"constant","gate_params":{"budget":1}},` + inner + `]}`},
		{waitonrefuse.Type, `{"gate":` + inner + `}`},
	} {
		t.Run(tt.typ, func(t *testing.T) {
			var obj map[string]json.RawMessage
			if err := json.Unmarshal([]byte(tt.params), &obj); err != nil {
				t.Fatal(err)
			}
			p, err := gate.ParseParams(obj)
			if err != nil {
				t.Fatal(err)
			}
			g, err := r.New(tt.typ, p, gate.Env{MaxConcurrency: 8})
			if err != nil {
				t.Fatal(err)
			}
			adm := g.(gate.Admitter)
			req := &wire.Request{ID: "r", Deadline: time.Now().Add(time.Minute)}
			admit := func() gate.Decision {
				d, err := adm.Admit(context.Background(), req)
				if err != nil {
					t.Fatal(err)
				}
				return d
			}
			a, b := admit(), admit() // window 2
			if a.Verdict != gate.Admit || b.Verdict != gate.Admit || a.Observe == nil {
				t.Fatalf("decisions %+v, %+v: want two admissions with an Observe", a, b)
			}
			a.Observe(gate.Feedback{StatusCode: http.StatusTooManyRequests})
			a.Release()
			// The window is 1 now, held by b.
			if d := admit(); d.Verdict == gate.Admit {
				t.Fatalf("after a 429 the window still admits a second request: %+v", d)
			}
			b.Release()
			if d := admit(); d.Verdict != gate.Admit {
				t.Fatalf("window 1 with none in flight: %+v", d)
			} else {
				d.Release()
			}
		})
	}
}

// TestAIMDAsPoolGate: as a worker pool's gate, the aimd gate sees the
// requests of every queue of the pool, one band per queue here (reserved
// interactive, overflow batch), learns each answer (the pool gate's
// Observe), and every request still ends in one 200 result.
func TestAIMDAsPoolGate(t *testing.T) {
	const capacity, perQueue = 6, 80
	gw, url := newSaturatingGateway(t, capacity, 20*time.Millisecond)
	ad := testAdapters(t)
	if err := ad.Gates.Register(aimd.Type, aimd.Factory); err != nil {
		t.Fatal(err)
	}
	const interactiveQueue = "llm-d-async:requests:e2e-interactive"
	cfg := &config.Config{
		Transport: memory.Name, Concurrency: 32, MetricsPort: -1, HealthPort: -1,
		DrainTimeout: config.Duration(2 * time.Second),
		Retry:        config.Retry{Base: config.Duration(20 * time.Millisecond), Max: config.Duration(200 * time.Millisecond), Jitter: 0.2},
		WorkerPools: []config.WorkerPool{{ID: "p", Workers: 32, GateType: aimd.Type,
			GateParams: map[string]json.RawMessage{"max_window": json.RawMessage(`32`)}}},
		TransportConfig: config.TransportConfig{ResultQueueName: e2eResults,
			Queues: []config.Queue{
				{Queue: transport.Queue{Name: e2eQueue, MaxConcurrency: 32}, IGWBaseURL: url, WorkerPoolID: "p"},
				{Queue: transport.Queue{Name: interactiveQueue, MaxConcurrency: 32}, IGWBaseURL: url, WorkerPoolID: "p",
					Labels: map[string]string{wire.LabelClassification: wire.ClassReserved, wire.DefaultTierLabel: wire.TierInteractive}},
			}},
	}
	reg := prometheus.NewRegistry()
	h := startAppWith(t, cfg, Options{Adapters: ad, Transport: memory.New(memory.Options{}), Registry: reg})
	far := time.Now().Add(2 * time.Minute)
	for i := range perQueue {
		for _, q := range []string{e2eQueue, interactiveQueue} {
			if err := h.mem.Enqueue(q, request(fmt.Sprintf("%s-%03d", q[len(q)-5:], i), far, nil)); err != nil {
				t.Fatal(err)
			}
		}
	}
	res := h.waitResults(2*perQueue, 60*time.Second)
	windows, ssthresh := map[string]float64{}, map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	events := 0.0
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			switch {
			case mf.GetName() == "sluice_gate_window" && labels["gate"] == "pool:p":
				windows[labels["band"]] = m.GetGauge().GetValue()
			case mf.GetName() == "sluice_gate_window_ssthresh" && labels["gate"] == "pool:p":
				ssthresh[labels["band"]] = m.GetGauge().GetValue()
			case mf.GetName() == "sluice_gate_events_total" && labels["gate"] == "pool:p" && strings.HasPrefix(labels["event"], "aimd_"):
				events += m.GetCounter().GetValue()
			}
		}
	}
	if err := h.shutdown(); err != nil {
		t.Fatal(err)
	}
	gw.stopSampling()
	for id, r := range res {
		if r.StatusCode != http.StatusOK {
			t.Errorf("%s: %+v", id, r)
		}
	}
	if len(res) != 2*perQueue {
		t.Errorf("%d results for %d requests", len(res), 2*perQueue)
	}
	t.Logf("aimd e2e pool gate: %d attempts, %d rejections, peak asked %d (capacity %d); windows %v; ssthresh %v; %v aimd events",
		gw.attempts.Load(), gw.rejections.Load(), gw.peak.Load(), capacity, windows, ssthresh, events)
	if len(windows) != aimd.NumBands {
		t.Fatalf("pool gate windows %v, want one per band", windows)
	}
	// Both bands learned: a band that saw no answer and no coupled
	// decrease keeps its initial state, window 1 and ssthresh 32
	// (max_window); these grew on the 2xx
	// answers (window above 1) or were decreased (ssthresh below 32).
	for _, band := range []string{"reserved-interactive", "overflow-batch"} {
		if windows[band] <= 1 && ssthresh[band] >= 32 {
			t.Errorf("band %s: window %v, ssthresh %v: the pool gate learned nothing", band, windows[band], ssthresh[band])
		}
	}
	if gw.rejections.Load() == 0 || events == 0 {
		t.Errorf("%d rejections, %v aimd events: want the windows to reach the gateway's capacity and shrink", gw.rejections.Load(), events)
	}
	if gw.peak.Load() > 3*capacity {
		t.Errorf("peak %d at a gateway of capacity %d", gw.peak.Load(), capacity)
	}
}
