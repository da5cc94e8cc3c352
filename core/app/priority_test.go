package app

import (
	"context"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/pipeline"
	"github.com/sluice-io/sluice/core/transform/gcsmultipart"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/transports/memory"
)

// switchGate reports budget 0 until opened.
type switchGate struct{ open atomic.Bool }

func (g *switchGate) Budget(context.Context) (float64, error) {
	if g.open.Load() {
		return 1, nil
	}
	return 0, nil
}

// Under the tier-priority policy a pool's single worker goes to the lowest
// lane first (reserved before overflow, interactive before async before
// batch), each request carries its lane in the priority header, and within a
// lane the queues take turns.
func TestTierPriorityLanes(t *testing.T) {
	var mu sync.Mutex
	var lanes []string
	var sources []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == "PRI" {
			return // dispatch.protocol auto's h2c preface (see flow_test.go)
		}
		mu.Lock()
		lanes = append(lanes, r.Header.Get("x-prio"))
		sources = append(sources, r.Header.Get("x-test-id")[:2])
		mu.Unlock()
		time.Sleep(2 * time.Millisecond)
		_, _ = w.Write([]byte(`{}`))
	}))
	t.Cleanup(srv.Close)
	poolGate := &switchGate{}
	ad := testAdapters(t)
	if err := ad.Gates.Register("test-switch", func(gate.Params, gate.Env) (gate.Gate, error) { return poolGate, nil }); err != nil {
		t.Fatal(err)
	}
	queue := func(name, tier string) config.Queue {
		return config.Queue{Queue: transport.Queue{Name: name, MaxConcurrency: 20}, IGWBaseURL: srv.URL, WorkerPoolID: "p", Labels: map[string]string{"tier": tier}}
	}
	cfg := &config.Config{
		Transport: memory.Name, MetricsPort: -1, HealthPort: -1, DrainTimeout: config.Duration(time.Second),
		WorkerPools: []config.WorkerPool{{ID: "p", Workers: 1, GateType: "test-switch"}},
		MergePolicy: config.MergePolicy{Type: config.PolicyTierPriority, Parameters: []byte(`{"priority_header":"x-prio"}`)},
		TransportConfig: config.TransportConfig{ResultQueueName: e2eResults, Queues: []config.Queue{
			queue("ib", "batch"), queue("ia", "async"), queue("ii", "interactive"), queue("ij", "interactive"),
		}},
	}
	h := startAppWith(t, cfg, Options{Adapters: ad, Transport: memory.New(memory.Options{})})
	far := time.Now().Add(time.Minute)
	reserved := func(id string) []byte {
		return []byte(`{"request_kind":"redis","internal":{"labels":{"classification":"reserved"}},"data":` + string(idRequest(id, far)) + `}`)
	}
	n := 0
	enqueue := func(q string, b []byte) {
		t.Helper()
		if err := h.mem.Enqueue(q, b); err != nil {
			t.Fatal(err)
		}
		n++
	}
	for i := range 5 {
		enqueue("ib", idRequest(fmt.Sprintf("ib-%d", i), far))
		enqueue("ia", idRequest(fmt.Sprintf("ia-%d", i), far))
		enqueue("ii", idRequest(fmt.Sprintf("ii-%d", i), far))
		enqueue("ij", idRequest(fmt.Sprintf("ij-%d", i), far))
	}
	for i := range 3 {
		enqueue("ib", reserved(fmt.Sprintf("ib-r%d", i))) // reserved batch: lane 2, before every overflow lane
	}
	// Everything is claimed and waits for the closed pool; then it opens.
	waitFor(t, func() bool {
		d := 0
		for _, q := range []string{"ib", "ia", "ii", "ij"} {
			dp, _ := h.mem.Depth(context.Background(), transport.Queue{Name: q})
			d += int(dp.Waiting)
		}
		return d == 0
	}, 5*time.Second)
	time.Sleep(100 * time.Millisecond)
	poolGate.open.Store(true)
	res := h.waitResults(n, 20*time.Second)
	for id, r := range res {
		if !r.OK() {
			t.Errorf("%s: %+v", id, r)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	want := strings.Repeat("2", 3) + strings.Repeat("3", 10) + strings.Repeat("4", 5) + strings.Repeat("5", 5)
	if got := strings.Join(lanes, ""); got != want {
		t.Errorf("lanes in dispatch order %s, want %s", got, want)
	}
	// Lane 3 holds two queues: they take turns.
	lane3 := strings.Join(sources[3:13], ",")
	if lane3 != "ii,ij,ii,ij,ii,ij,ii,ij,ii,ij" && lane3 != "ij,ii,ij,ii,ij,ii,ij,ii,ij,ii" {
		t.Errorf("lane 3 served %s, want the two queues in turn", lane3)
	}
}

// A transform file turns owned requests into multipart bodies; a signed
// URL expiring before the deadline is refused with INVALID_REQUEST before
// any gate or call.
func TestTransforms(t *testing.T) {
	var mu sync.Mutex
	got := map[string]string{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ct, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
		id := r.Header.Get("x-test-id")
		desc := ct
		if ct == "multipart/form-data" {
			mr := multipart.NewReader(r.Body, params["boundary"])
			for {
				p, err := mr.NextPart()
				if err != nil {
					break
				}
				b, _ := io.ReadAll(p)
				desc += " " + p.FormName() + "=" + string(b)
			}
		}
		mu.Lock()
		got[id] = desc
		mu.Unlock()
		_, _ = w.Write([]byte(`{}`))
	}))
	t.Cleanup(srv.Close)
	file := filepath.Join(t.TempDir(), "transforms.json")
	if err := os.WriteFile(file, []byte(`{"requestTransforms":[{"name":"gcs","type":"gcs_uri_multipart","parameters":{"providers":["gcs"]}}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	ad := testAdapters(t)
	if err := ad.Transforms.Register(gcsmultipart.Type, gcsmultipart.Factory); err != nil {
		t.Fatal(err)
	}
	cfg := &config.Config{
		Transport: memory.Name, MetricsPort: -1, HealthPort: -1, DrainTimeout: config.Duration(time.Second),
		TransformConfigFile: file,
		TransportConfig: config.TransportConfig{ResultQueueName: e2eResults, Queues: []config.Queue{
			{Queue: transport.Queue{Name: e2eQueue}, IGWBaseURL: srv.URL}}},
	}
	h := startAppWith(t, cfg, Options{Adapters: ad, Transport: memory.New(memory.Options{})})
	deadline := time.Now().Add(time.Minute)
	req := func(id, expires string) []byte {
		return []byte(fmt.Sprintf(`{"id":%q,"deadline":%d,"metadata":{"provider":"gcs"},"headers":{"x-test-id":%q},`+
			`"payload":{"gcs_uri":"https://storage.example/a.wav?Expires=%s","model":"whisper"}}`, id, deadline.Unix(), id, expires))
	}
	for _, b := range [][]byte{
		req("fresh", fmt.Sprint(deadline.Add(time.Hour).Unix())),
		req("stale", fmt.Sprint(deadline.Add(-time.Second).Unix())),
		idRequest("plain", deadline),
	} {
		if err := h.mem.Enqueue(e2eQueue, b); err != nil {
			t.Fatal(err)
		}
	}
	res := h.waitResults(3, 10*time.Second)
	if r := res["stale"]; r.ErrorCode != wire.CodeInvalidRequest || !strings.Contains(r.ErrorMessage, "Failed to validate request for transform: transform gcs/gcs_uri_multipart: signed URL expires at") {
		t.Errorf("stale: %+v", r)
	}
	mu.Lock()
	defer mu.Unlock()
	wantFresh := fmt.Sprintf("multipart/form-data url=https://storage.example/a.wav?Expires=%d model=whisper", deadline.Add(time.Hour).Unix())
	if got["fresh"] != wantFresh {
		t.Errorf("fresh arrived as %q, want %q", got["fresh"], wantFresh)
	}
	if got["plain"] != "application/json" {
		t.Errorf("plain arrived as %q", got["plain"])
	}
	if _, ok := got["stale"]; ok {
		t.Error("the refused request was sent")
	}
}

// Strict priority once interactive requests arrive: one worker, 40 batch
// requests queued and dispatching, then 10 interactive ones. Upstream's lanes
// hold what its readers pulled, so its popper takes the interactive lane
// whenever it is not empty; sluice's lanes must do the same, although each
// queue's max_concurrency here is 1 (the pool's size, the default). The
// report was "… tb-28 ti-0 tb-29 ti-1 tb-3 ti-2 …": when an interactive
// request ended, the next one was not claimed yet, and the worker went to a
// batch request. Two checks: the lanes' own steps (no batch request is given
// the worker while an interactive one waits), and the gateway's order (once
// the first interactive request arrives, the other nine come next).
func TestTierPriorityInteractiveFirst(t *testing.T) {
	var mu sync.Mutex
	var order []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == "PRI" {
			return
		}
		mu.Lock()
		order = append(order, r.Header.Get("x-test-id"))
		mu.Unlock()
		time.Sleep(3 * time.Millisecond)
		_, _ = w.Write([]byte(`{}`))
	}))
	t.Cleanup(srv.Close)
	queue := func(name, tier string) config.Queue {
		return config.Queue{Queue: transport.Queue{Name: name}, IGWBaseURL: srv.URL, WorkerPoolID: "p", Labels: map[string]string{"tier": tier}}
	}
	cfg := &config.Config{
		Transport: memory.Name, MetricsPort: -1, HealthPort: -1, DrainTimeout: config.Duration(time.Second),
		WorkerPools:     []config.WorkerPool{{ID: "p", Workers: 1}},
		MergePolicy:     config.MergePolicy{Type: config.PolicyTierPriority},
		TransportConfig: config.TransportConfig{ResultQueueName: e2eResults, Queues: []config.Queue{queue("tb", "batch"), queue("ti", "interactive")}},
	}
	h := startAppWith(t, cfg, Options{Transport: memory.New(memory.Options{})})
	// Replay the lanes' steps as they happen: at each grant, nothing may
	// wait in a lower lane.
	var violations []string
	waitingIn := [pipeline.NumLanes]map[uint64]bool{}
	for i := range waitingIn {
		waitingIn[i] = map[uint64]bool{}
	}
	interactiveWaited := 0
	if !h.app.Pipeline().ObserveLanes("p", func(e pipeline.LaneEvent) {
		switch e.Kind {
		case pipeline.LaneWaiting:
			waitingIn[e.Lane][e.Seq] = true
			if e.Lane == 3 {
				interactiveWaited++
			}
		case pipeline.LaneAbandoned:
			delete(waitingIn[e.Lane], e.Seq)
		case pipeline.LaneGranted:
			delete(waitingIn[e.Lane], e.Seq)
			for lower := range e.Lane {
				if len(waitingIn[lower]) > 0 {
					violations = append(violations, fmt.Sprintf("lane %d (%s) granted while %d waited in lane %d", e.Lane, e.Queue, len(waitingIn[lower]), lower))
				}
			}
		}
	}) {
		t.Fatal("the pool has no lanes")
	}
	far := time.Now().Add(time.Minute)
	for i := range 40 {
		if err := h.mem.Enqueue("tb", idRequest(fmt.Sprintf("tb-%d", i), far)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(order) >= 5 }, 5*time.Second)
	for i := range 10 {
		if err := h.mem.Enqueue("ti", idRequest(fmt.Sprintf("ti-%d", i), far)); err != nil {
			t.Fatal(err)
		}
	}
	res := h.waitResults(50, 20*time.Second)
	for id, r := range res {
		if !r.OK() {
			t.Errorf("%s: %+v", id, r)
		}
	}
	h.app.Pipeline().ObserveLanes("p", nil)
	mu.Lock()
	defer mu.Unlock()
	if len(violations) > 0 {
		t.Errorf("%d grants out of order, first: %s", len(violations), violations[0])
	}
	if interactiveWaited == 0 {
		t.Error("no interactive request ever waited in its lane: the check above saw nothing")
	}
	first := slices.IndexFunc(order, func(id string) bool { return strings.HasPrefix(id, "ti-") })
	if first < 0 || first+10 > len(order) {
		t.Fatalf("dispatch order %v", order)
	}
	for _, id := range order[first : first+10] {
		if !strings.HasPrefix(id, "ti-") {
			t.Fatalf("a batch request went between the interactive ones: %s", strings.Join(order[first:], " "))
		}
	}
}

// lane_objectives: a lane with an entry sends its objective in
// objective_header (default x-llm-d-inference-objective), the others send
// none; priority_header is off unless set (upstream v0.10); bad entries
// stop the start.
func TestTierPriorityLaneObjectives(t *testing.T) {
	var mu sync.Mutex
	got := map[string]http.Header{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == "PRI" {
			return
		}
		mu.Lock()
		got[r.Header.Get("x-test-id")] = r.Header.Clone()
		mu.Unlock()
		_, _ = w.Write([]byte(`{}`))
	}))
	t.Cleanup(srv.Close)
	cfgWith := func(params string) *config.Config {
		queue := func(name, tier string) config.Queue {
			return config.Queue{Queue: transport.Queue{Name: name}, IGWBaseURL: srv.URL, WorkerPoolID: "p", Labels: map[string]string{"tier": tier}}
		}
		return &config.Config{
			Transport: memory.Name, MetricsPort: -1, HealthPort: -1, DrainTimeout: config.Duration(time.Second),
			WorkerPools:     []config.WorkerPool{{ID: "p", Workers: 2}},
			MergePolicy:     config.MergePolicy{Type: config.PolicyTierPriority, Parameters: []byte(params)},
			TransportConfig: config.TransportConfig{ResultQueueName: e2eResults, Queues: []config.Queue{queue("oi", "interactive"), queue("ob", "batch")}},
		}
	}
	run := func(t *testing.T, params string) {
		t.Helper()
		h := startAppWith(t, cfgWith(params), Options{Transport: memory.New(memory.Options{})})
		far := time.Now().Add(time.Minute)
		for _, q := range []string{"oi", "ob"} {
			if err := h.mem.Enqueue(q, idRequest(q+"-1", far)); err != nil {
				t.Fatal(err)
			}
		}
		h.waitResults(2, 10*time.Second)
		if err := h.shutdown(); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("default header, one lane", func(t *testing.T) {
		run(t, `{"lane_objectives":{"overflow-interactive":"chat-fast"}}`)
		mu.Lock()
		defer mu.Unlock()
		if v := got["oi-1"].Get("x-llm-d-inference-objective"); v != "chat-fast" {
			t.Errorf("interactive lane: objective %q, want chat-fast", v)
		}
		if v, ok := got["ob-1"]["X-Llm-D-Inference-Objective"]; ok {
			t.Errorf("batch lane (no entry): objective %q sent", v)
		}
		for id, hs := range got {
			if v, ok := hs["X-Gateway-Priority"]; ok {
				t.Errorf("%s: priority header %q sent, want none (priority_header is off by default)", id, v)
			}
		}
	})
	t.Run("own header, and the priority header when set", func(t *testing.T) {
		run(t, `{"objective_header":"x-objective","priority_header":"x-prio","lane_objectives":{"overflow-batch":"bulk","reserved-batch":"never"}}`)
		mu.Lock()
		defer mu.Unlock()
		if v := got["ob-1"].Get("x-objective"); v != "bulk" {
			t.Errorf("batch lane: objective %q, want bulk", v)
		}
		if v := got["ob-1"].Get("x-prio"); v != "5" {
			t.Errorf("batch lane: priority %q, want 5", v)
		}
		if v := got["oi-1"].Get("x-objective"); v != "" {
			t.Errorf("interactive lane (no entry): objective %q", v)
		}
	})
	for _, bad := range []struct{ params, want string }{
		{`{"lane_objectives":{"overflow-urgent":"x"}}`, `unknown lane "overflow-urgent"`},
		{`{"lane_objectives":{"overflow-batch":"a\nb"}}`, "not a valid header value"},
		{`{"lane_objectives":["x"]}`, "want an object"},
		{`{"objective_header":"bad header"}`, "objective_header"},
		{`{"lane_min_share":{"overflow-urgent":0.1}}`, `lane_min_share: unknown lane "overflow-urgent"`},
		{`{"lane_min_share":{"overflow-batch":"0.1"}}`, "lane_min_share: want an object of lane key to a share"},
		{`{"lane_min_share":{"overflow-batch":1.5}}`, "lane_min_share: pipeline: priority: min share of lane overflow-batch: 1.5 is not in [0,1]"},
		{`{"lane_min_share":{"overflow-batch":0.6,"overflow-async":0.5}}`, "min shares sum to 1.1 > 1"},
	} {
		if _, err := New(cfgWith(bad.params), Options{Adapters: testAdapters(t), Transport: memory.New(memory.Options{}), Registry: prometheus.NewRegistry()}); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s: error %v, want one containing %q", bad.params, err, bad.want)
		}
	}
}
