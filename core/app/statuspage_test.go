package app

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/status"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/transports/memory"
)

// startStatusApp runs the app with the metrics port (and so the status
// page) on a free loopback port, the depth poll at 200ms so the figures
// come quickly.
func startStatusApp(t *testing.T, gwURL string, mutate func(*config.Config)) *harness {
	t.Helper()
	return startApp(t, gwURL, time.Second, func(c *config.Config) {
		c.ListenHost, c.MetricsPort = "127.0.0.1", testenv.FreePort(t)
		c.BacklogPollInterval = config.Duration(200 * time.Millisecond)
		if mutate != nil {
			mutate(c)
		}
	})
}

// traffic enqueues requests on the test queue, each answered by the test
// gateway after sleepMS (every tenth with a final 400), every `every` until
// the test ends; it returns how many it enqueued so far.
func traffic(t *testing.T, h *harness, every time.Duration, sleepMS int) func() int {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	n := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		tk := time.NewTicker(every)
		defer tk.Stop()
		for {
			mu.Lock()
			i := n
			n++
			mu.Unlock()
			script := map[string]any{"sleep_ms": sleepMS}
			if i%10 == 9 {
				script["status"] = http.StatusBadRequest
			}
			_ = h.mem.Enqueue(e2eQueue, request("s"+strconv.Itoa(i), time.Now().Add(time.Minute), script))
			select {
			case <-ctx.Done():
				return
			case <-tk.C:
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return func() int { mu.Lock(); defer mu.Unlock(); return n }
}

func getStatus(t *testing.T, base string) status.Snapshot {
	t.Helper()
	code, body := get(t, base+"/status.json")
	if code != 200 {
		t.Fatalf("/status.json: %d %s", code, body)
	}
	var s status.Snapshot
	if err := json.Unmarshal([]byte(body), &s); err != nil {
		t.Fatalf("/status.json: %v: %s", err, body)
	}
	return s
}

// /status.json on the metrics port tells, while traffic runs, each queue's
// figures as the metrics count them, its gate and budget history, the
// worker pool and the process.
func TestStatusJSON(t *testing.T) {
	_, url := newGateway(t)
	h := startStatusApp(t, url, nil)
	traffic(t, h, 5*time.Millisecond, 10)
	h.waitResults(20, 10*time.Second)
	base := "http://" + h.app.Addr("metrics")

	var s status.Snapshot
	waitFor(t, func() bool {
		s = getStatus(t, base)
		return len(s.Queues) == 1 && s.Queues[0].Throughput > 0 && s.Queues[0].Waiting != nil
	}, 10*time.Second)
	q := s.Queues[0]
	if q.ID != e2eQueue || q.Name != e2eQueue || q.Transport != "memory" || q.WorkerPool != "default" || q.Gate != "constant" {
		t.Errorf("queue %s %s %s %s gate %q", q.ID, q.Name, q.Transport, q.WorkerPool, q.Gate)
	}
	if q.Max != 8 || q.Limit != 8 || q.Claimed < 0 || q.Claimed > q.Limit || q.Budget != 1 {
		t.Errorf("credits claimed %d limit %d max %d budget %v", q.Claimed, q.Limit, q.Max, q.Budget)
	}
	if q.Results["ok"] == 0 || q.Results["http_error"] == 0 || q.Total != q.Results["ok"]+q.Results["http_error"] {
		t.Errorf("results %v total %d", q.Results, q.Total)
	}
	if q.Delayed == nil || q.DeadLettered != 0 || q.DeadLetterHeld == nil || *q.DeadLetterHeld != 0 {
		t.Errorf("delayed %v, dead-lettered %d (held %v)", q.Delayed, q.DeadLettered, q.DeadLetterHeld)
	}
	if len(q.BudgetHistory) < 2 || q.BudgetHistory[len(q.BudgetHistory)-1][1] != 1 {
		t.Errorf("budget history %v", q.BudgetHistory)
	}
	// The figures are the metrics' own.
	_, metricsBody := get(t, base+"/metrics")
	if !strings.Contains(metricsBody, `sluice_results_total{code="ok"`) {
		t.Error("/metrics lacks sluice_results_total")
	}
	if len(s.Gates) != 1 || s.Gates[0].Name != "constant" || s.Gates[0].State != "ok" || s.Gates[0].Plugin != nil {
		t.Errorf("gates %+v", s.Gates)
	}
	if len(s.Pools) != 1 || s.Pools[0].ID != "default" || s.Pools[0].Workers != 8 || s.Pools[0].InFlight > 8 {
		t.Errorf("pools %+v", s.Pools)
	}
	if s.Process.Version == "" || s.Process.Transport != "memory" || s.Process.Started == 0 || s.Process.Go == "" {
		t.Errorf("process %+v", s.Process)
	}

	code, page := get(t, base+"/")
	if code != 200 || !strings.Contains(page, "<title>sluice status</title>") {
		t.Errorf("GET /: %d", code)
	}
	if code, _ := get(t, base+"/nothing-here"); code != 404 {
		t.Errorf("GET /nothing-here: %d", code)
	}
}

// status_page: false serves /metrics alone.
func TestStatusPageOff(t *testing.T) {
	_, url := newGateway(t)
	off := false
	h := startStatusApp(t, url, func(c *config.Config) { c.StatusPage = &off })
	waitFor(t, func() bool { return h.app.Pipeline().Ready() }, 5*time.Second)
	base := "http://" + h.app.Addr("metrics")
	for path, want := range map[string]int{"/": 404, "/status.json": 404, "/metrics": 200} {
		if code, _ := get(t, base+path); code != want {
			t.Errorf("GET %s: %d, want %d", path, code, want)
		}
	}
}

// tokenGuard lets a request through with the right bearer token.
type tokenGuard struct{}

func (tokenGuard) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer let-me-in" {
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// The guard of /metrics (--metrics-endpoint-auth) guards the page and its
// JSON the same way.
func TestStatusPageBehindMetricsGuard(t *testing.T) {
	cfg := &config.Config{
		Transport: memory.Name, MetricsPort: -1, HealthPort: -1,
		TransportConfig: config.TransportConfig{ResultQueueName: "r", Queues: []config.Queue{{Queue: transport.Queue{Name: "q"}, IGWBaseURL: "http://gw"}}},
	}
	a, err := New(cfg, Options{Adapters: testAdapters(t), Transport: memory.New(memory.Options{}), Registry: prometheus.NewRegistry(), MetricsGuard: tokenGuard{}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.close()
	srv := httptest.NewServer(a.mux("metrics"))
	defer srv.Close()
	for _, path := range []string{"/", "/status.json", "/metrics"} {
		for token, want := range map[string]int{"": 401, "forged": 401, "let-me-in": 200} {
			req, _ := http.NewRequest(http.MethodGet, srv.URL+path, nil)
			if token != "" {
				req.Header.Set("Authorization", "Bearer "+token)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close()
			if resp.StatusCode != want {
				t.Errorf("GET %s with token %q: %d, want %d", path, token, resp.StatusCode, want)
			}
		}
	}
}
