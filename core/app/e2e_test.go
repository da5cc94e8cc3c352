package app

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/gates/constant"
	"github.com/sluice-io/sluice/internal/simulator"
	"github.com/sluice-io/sluice/transports/memory"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
		// started by an init function of opencensus, which the Pub/Sub client imports
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
		// watermill's router leaves this watcher behind when a Subscribe fails
		// at start (TestSecretsNeverLeak's wrong Redis password).
		goleak.IgnoreAnyFunction("github.com/ThreeDotsLabs/watermill/message.(*Router).watchAllHandlersStopped.func1"))
}

// testAdapters registers what these tests build: the memory transport and
// the constant gate.
func testAdapters(t *testing.T) Adapters {
	t.Helper()
	ad := NewAdapters()
	if err := errors.Join(
		ad.Transports.Register(memory.Name, memory.Factory),
		ad.Gates.Register(constant.Type, constant.Factory),
	); err != nil {
		t.Fatal(err)
	}
	return ad
}

// gateway is a scripted test gateway. Per request id it can fail the first
// N attempts with a status, sleep, or answer a fixed status; it records the
// arrival time of every attempt.
type gateway struct {
	mu       sync.Mutex
	arrivals map[string][]time.Time
	headers  map[string]http.Header
	protos   map[string]int // HTTP major version each request came over
}

func newGateway(t *testing.T) (*gateway, string) {
	g := &gateway{arrivals: map[string][]time.Time{}, headers: map[string]http.Header{}, protos: map[string]int{}}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(g.serve))
	srv.Config.Protocols = simulator.ServerProtocols() // HTTP/1.1 and h2c
	srv.Start()
	t.Cleanup(srv.Close)
	return g, srv.URL
}

func (g *gateway) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var p struct {
		ID         string `json:"id"`
		FailTimes  int    `json:"fail_times"`
		FailStatus int    `json:"fail_status"` // of the first FailTimes answers (default 503)
		Status     int    `json:"status"`
		SleepMS    int    `json:"sleep_ms"`
	}
	_ = json.Unmarshal(body, &p)
	g.mu.Lock()
	g.arrivals[p.ID] = append(g.arrivals[p.ID], time.Now())
	g.headers[p.ID] = r.Header.Clone()
	g.protos[p.ID] = r.ProtoMajor
	n := len(g.arrivals[p.ID])
	g.mu.Unlock()
	if p.SleepMS > 0 {
		select {
		case <-time.After(time.Duration(p.SleepMS) * time.Millisecond):
		case <-r.Context().Done():
			return
		}
	}
	switch {
	case n <= p.FailTimes:
		w.WriteHeader(cmp.Or(p.FailStatus, http.StatusServiceUnavailable))
		_, _ = w.Write([]byte(`{"error":"busy"}`))
	case p.Status != 0:
		w.WriteHeader(p.Status)
		_, _ = w.Write([]byte(`{"error":"scripted"}`))
	default:
		_, _ = w.Write([]byte(`{"id":"cmpl-` + p.ID + `","choices":[{"text":"ok"}]}`))
	}
}

func (g *gateway) attempts(id string) []time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]time.Time(nil), g.arrivals[id]...)
}

const (
	e2eQueue   = "llm-d-async:requests:e2e"
	e2eResults = "llm-d-async:results:e2e:$batch"
)

// request builds a flat request whose payload scripts the test gateway.
func request(id string, deadline time.Time, script map[string]any) []byte {
	payload := map[string]any{"id": id, "prompt": "hi"}
	for k, v := range script {
		payload[k] = v
	}
	pb, _ := json.Marshal(payload)
	b, _ := json.Marshal(map[string]any{
		"id": id, "created": time.Now().Unix(), "deadline": float64(deadline.UnixMilli()) / 1000,
		"payload": json.RawMessage(pb), "metadata": map[string]string{"job_id": "j1", "request_index": id},
	})
	return b
}

type harness struct {
	t    *testing.T
	mem  *memory.Transport
	app  *App
	stop context.CancelFunc
	errc chan error
}

func startApp(t *testing.T, gwURL string, drain time.Duration, mutate func(*config.Config)) *harness {
	t.Helper()
	mem := memory.New(memory.Options{})
	cfg := &config.Config{
		Transport: memory.Name, Concurrency: 8, MetricsPort: -1, HealthPort: -1,
		DrainTimeout: config.Duration(drain),
		Retry:        config.Retry{Base: config.Duration(300 * time.Millisecond), Max: config.Duration(2 * time.Second), Jitter: 0.1},
		TransportConfig: config.TransportConfig{ResultQueueName: e2eResults,
			Queues: []config.Queue{{Queue: transport.Queue{Name: e2eQueue}, IGWBaseURL: gwURL}}},
	}
	if mutate != nil {
		mutate(cfg)
	}
	return startAppWith(t, cfg, Options{Transport: mem})
}

// startAppWith runs an app of cfg and o (o.Transport must be a memory
// transport; o.Adapters default to testAdapters).
func startAppWith(t *testing.T, cfg *config.Config, o Options) *harness {
	t.Helper()
	mem := o.Transport.(*memory.Transport)
	if o.Adapters.Gates == nil {
		o.Adapters = testAdapters(t)
	}
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
	}
	a, err := New(cfg, o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	h := &harness{t: t, mem: mem, app: a, stop: stop, errc: make(chan error, 1)}
	go func() { h.errc <- a.Run(ctx) }()
	t.Cleanup(func() { h.shutdown() })
	return h
}

// shutdown stops the app and returns Run's error (once).
func (h *harness) shutdown() error {
	if h.stop == nil {
		return nil
	}
	h.stop()
	h.stop = nil
	select {
	case err := <-h.errc:
		return err
	case <-time.After(30 * time.Second):
		h.t.Fatal("Run did not return after shutdown")
		return nil
	}
}

// waitResults waits until n results exist and returns them by id.
func (h *harness) waitResults(n int, within time.Duration) map[string]*wire.Result {
	h.t.Helper()
	deadline := time.After(within)
	for {
		c, more := h.mem.ResultCount(e2eResults)
		if c >= n {
			break
		}
		select {
		case <-more:
		case <-deadline:
			h.t.Fatalf("got %d results, want %d within %s", c, n, within)
		}
	}
	out := map[string]*wire.Result{}
	for _, b := range h.mem.Results(e2eResults) {
		r, err := wire.DecodeResult(b)
		if err != nil {
			h.t.Fatalf("undecodable result %s: %v", b, err)
		}
		if _, dup := out[r.ID]; dup {
			h.t.Fatalf("two results for %s", r.ID)
		}
		out[r.ID] = r
	}
	return out
}

// TestEndToEnd runs over HTTP/1.1 and over h2c (sluice's own HTTP/2 client).
func TestEndToEnd(t *testing.T) {
	for _, proto := range []string{"http1", "h2c"} {
		t.Run(proto, func(t *testing.T) { testEndToEnd(t, proto) })
	}
}

func testEndToEnd(t *testing.T, proto string) {
	gw, url := newGateway(t)
	h := startApp(t, url, 5*time.Second, func(c *config.Config) { c.Dispatch.Protocol = proto })
	now := time.Now()
	far := now.Add(time.Minute)
	enqueue := func(b []byte) {
		if err := h.mem.Enqueue(e2eQueue, b); err != nil {
			t.Fatal(err)
		}
	}
	enqueue(request("ok", far, nil))
	enqueue(request("fatal", far, map[string]any{"status": 404}))
	enqueue(request("flaky", far, map[string]any{"fail_times": 2}))
	enqueue(request("expired", now.Add(-time.Second), nil))
	enqueue(request("slow", now.Add(400*time.Millisecond), map[string]any{"sleep_ms": 3000}))
	enqueue([]byte(`{"id":"invalid","deadline":4102444800,"payload":[1,2]}`))
	enqueue([]byte(`{"deadline":4102444800,"payload":{}}`)) // no id: dead letter

	res := h.waitResults(6, 20*time.Second)

	if r := res["ok"]; r.ErrorCode != "" || r.StatusCode != 200 || r.Payload != `{"id":"cmpl-ok","choices":[{"text":"ok"}]}` || r.Metadata["request_index"] != "ok" {
		t.Errorf("ok: %+v", r)
	}
	// A non-retryable 4xx is passed on as it came, without an error code, as upstream writes it.
	if r := res["fatal"]; r.ErrorCode != wire.CodeNone || r.OK() || r.StatusCode != 404 || r.Payload != `{"error":"scripted"}` {
		t.Errorf("fatal: %+v", r)
	}
	if n := len(gw.attempts("fatal")); n != 1 {
		t.Errorf("fatal request sent %d times, want 1", n)
	}
	if r := res["flaky"]; r.ErrorCode != "" || r.StatusCode != 200 {
		t.Errorf("flaky: %+v", r)
	}
	// Backoff honoured: 300ms then 600ms, ±10% jitter.
	if at := gw.attempts("flaky"); len(at) != 3 {
		t.Errorf("flaky: %d attempts, want 3", len(at))
	} else {
		if d := at[1].Sub(at[0]); d < 270*time.Millisecond {
			t.Errorf("first retry after %s, want ≥ 270ms", d)
		}
		if d := at[2].Sub(at[1]); d < 540*time.Millisecond {
			t.Errorf("second retry after %s, want ≥ 540ms", d)
		}
	}
	if r := res["expired"]; r.ErrorCode != wire.CodeDeadlineExceeded || r.StatusCode != 0 {
		t.Errorf("expired: %+v", r)
	}
	if n := len(gw.attempts("expired")); n != 0 {
		t.Errorf("expired request was dispatched %d times", n)
	}
	if r := res["slow"]; r.ErrorCode != wire.CodeDeadlineExceeded {
		t.Errorf("slow: %+v", r)
	}
	if r := res["invalid"]; r.ErrorCode != wire.CodeInvalidRequest {
		t.Errorf("invalid: %+v", r)
	}
	if dl := h.mem.DeadLetters(e2eQueue); len(dl) != 1 {
		t.Errorf("dead letters: %d, want 1", len(dl))
	}
	if want := map[string]int{"http1": 1, "h2c": 2}[proto]; gw.protos["ok"] != want {
		t.Errorf("request came over HTTP/%d, want HTTP/%d", gw.protos["ok"], want)
	}
	// Deadline propagated as headers.
	hd := gw.headers["ok"]
	if ms, err := strconv.ParseInt(hd.Get("x-request-deadline"), 10, 64); err != nil || ms != far.UnixMilli() {
		t.Errorf("x-request-deadline = %q, want %d", hd.Get("x-request-deadline"), far.UnixMilli())
	}
	if v, err := strconv.Atoi(hd.Get("x-envoy-upstream-rq-timeout-ms")); err != nil || v <= 0 || v > 60_000 {
		t.Errorf("x-envoy-upstream-rq-timeout-ms = %q", hd.Get("x-envoy-upstream-rq-timeout-ms"))
	}
	if err := h.shutdown(); err != nil {
		t.Fatal(err)
	}
}

// A request in flight when the drain timeout ends is handed back, unanswered.
func TestShutdownHandsBackInflight(t *testing.T) {
	gw, url := newGateway(t)
	h := startApp(t, url, 200*time.Millisecond, nil)
	if err := h.mem.Enqueue(e2eQueue, request("long", time.Now().Add(time.Minute), map[string]any{"sleep_ms": 10_000})); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return len(gw.attempts("long")) == 1 }, 5*time.Second)
	start := time.Now()
	if err := h.shutdown(); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("shutdown took %s with a 200ms drain", el)
	}
	if n, _ := h.mem.ResultCount(e2eResults); n != 0 {
		t.Errorf("%d results; the request should have been handed back", n)
	}
	d, _ := h.mem.Depth(context.Background(), transport.Queue{Name: e2eQueue})
	if d.Waiting != 1 || d.InFlight != 0 {
		t.Errorf("depth after shutdown = %+v, want 1 waiting", d)
	}
}

// A request in flight that finishes within the drain timeout gets its result.
func TestShutdownDrainsInflight(t *testing.T) {
	gw, url := newGateway(t)
	h := startApp(t, url, 10*time.Second, nil)
	if err := h.mem.Enqueue(e2eQueue, request("short", time.Now().Add(time.Minute), map[string]any{"sleep_ms": 500})); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return len(gw.attempts("short")) == 1 }, 5*time.Second)
	if err := h.shutdown(); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	res := h.mem.Results(e2eResults)
	if len(res) != 1 {
		t.Fatalf("%d results after drain, want 1", len(res))
	}
	if r, _ := wire.DecodeResult(res[0]); r.ErrorCode != "" {
		t.Errorf("drained request: %+v", r)
	}
}

// The attempt cap ends retries with the last response.
func TestMaxAttempts(t *testing.T) {
	gw, url := newGateway(t)
	h := startApp(t, url, time.Second, func(c *config.Config) { c.Retry.MaxAttempts = 2 })
	if err := h.mem.Enqueue(e2eQueue, request("down", time.Now().Add(time.Minute), map[string]any{"fail_times": 100})); err != nil {
		t.Fatal(err)
	}
	res := h.waitResults(1, 10*time.Second)
	// The last response as it came, without an error code (upstream's shape for exhausted retries).
	if r := res["down"]; r.ErrorCode != wire.CodeNone || r.OK() || r.StatusCode != 503 || r.Payload != `{"error":"busy"}` {
		t.Errorf("down: %+v", r)
	}
	if n := len(gw.attempts("down")); n != 2 {
		t.Errorf("%d attempts, want 2", n)
	}
}

// A retry that cannot happen before the deadline ends with the gateway's
// last response as it came (upstream's shape); with no response at all
// (the gateway unreachable) as DEADLINE_EXCEEDED.
func TestRetryPastDeadline(t *testing.T) {
	_, url := newGateway(t)
	slow := func(c *config.Config) { c.Retry.Base = config.Duration(5 * time.Second); c.Retry.Max = c.Retry.Base }
	h := startApp(t, url, time.Second, slow)
	if err := h.mem.Enqueue(e2eQueue, request("late", time.Now().Add(2*time.Second), map[string]any{"fail_times": 100})); err != nil {
		t.Fatal(err)
	}
	res := h.waitResults(1, 5*time.Second)
	if r := res["late"]; r.ErrorCode != wire.CodeNone || r.StatusCode != 503 || r.Payload != `{"error":"busy"}` {
		t.Errorf("late: %+v", r)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String()
	_ = ln.Close() // nothing listens there any more: connection refused, no response
	h2 := startApp(t, closed, time.Second, slow)
	if err := h2.mem.Enqueue(e2eQueue, request("unreachable", time.Now().Add(2*time.Second), nil)); err != nil {
		t.Fatal(err)
	}
	res = h2.waitResults(1, 5*time.Second)
	if r := res["unreachable"]; r.ErrorCode != wire.CodeDeadlineExceeded || r.StatusCode != 0 {
		t.Errorf("unreachable: %+v", r)
	}
}

// Credits bound the requests in flight to the concurrency.
func TestConcurrencyBound(t *testing.T) {
	var mu sync.Mutex
	inflight, peak := 0, 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == "PRI" {
			return // dispatch.protocol auto's h2c preface (see flow_test.go)
		}
		mu.Lock()
		inflight++
		peak = max(peak, inflight)
		mu.Unlock()
		time.Sleep(20 * time.Millisecond)
		mu.Lock()
		inflight--
		mu.Unlock()
		_, _ = w.Write([]byte(`{}`))
	}))
	t.Cleanup(srv.Close)
	h := startApp(t, srv.URL, time.Second, func(c *config.Config) { c.Concurrency = 5 })
	for i := range 100 {
		if err := h.mem.Enqueue(e2eQueue, request("c"+strconv.Itoa(i), time.Now().Add(time.Minute), nil)); err != nil {
			t.Fatal(err)
		}
	}
	h.waitResults(100, 20*time.Second)
	mu.Lock()
	defer mu.Unlock()
	if peak > 5 || peak < 2 {
		t.Errorf("peak in flight %d, want ≤ 5 (and some concurrency)", peak)
	}
}

func waitFor(t *testing.T, cond func() bool, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in time")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
