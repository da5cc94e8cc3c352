package status

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/pipeline"
)

type fixedSource pipeline.Snapshot

func (s fixedSource) Snapshot() pipeline.Snapshot { return pipeline.Snapshot(s) }

type budgetGate struct{}

func (budgetGate) Budget(context.Context) (float64, error) { return 1, nil }

// pluginGate stands for plugins/host's gate: it tells its pid.
type pluginGate struct {
	budgetGate
	pid int
}

func (g pluginGate) PID() int { return g.pid }

// wrapped stands for the gate registry's wrapper of a gate whose generic
// parameters are set.
type wrapped struct{ gate.Gate }

func (w wrapped) Unwrap() gate.Gate { return w.Gate }

func get(t *testing.T, h http.Handler, path string) *http.Response {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Result()
}

// The page is one self-contained document: its own inline style and
// script, no external asset, and a policy that forbids loading any.
func TestPageIsSelfContained(t *testing.T) {
	p := New(Config{Pipeline: fixedSource{}})
	resp := get(t, p, "/")
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("GET /: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "connect-src 'self'") {
		t.Errorf("CSP %q", csp)
	}
	html := string(body)
	for _, bad := range []string{"http:", "https:", "@import", "url(", "<script src", "<link rel=\"stylesheet"} {
		if strings.Contains(html, bad) {
			t.Errorf("the page contains %q", bad)
		}
	}
	for _, m := range regexp.MustCompile(`(?:src|href)="([^"]*)"`).FindAllStringSubmatch(html, -1) {
		if !strings.HasPrefix(m[1], "data:") {
			t.Errorf("the page loads %q", m[1])
		}
	}
	for _, want := range []string{"<style>", "<script>", `fetch("status.json"`, "<svg", "<polyline"} {
		if !strings.Contains(html, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	if resp := get(t, p, "/other"); resp.StatusCode != 404 {
		t.Errorf("GET /other: %d", resp.StatusCode)
	}
}

// /status.json carries the pipeline's figures, names each queue's gate,
// and tells a plugin gate's process state.
func TestSnapshotJSON(t *testing.T) {
	gates := NewGates()
	plain := gates.Add("constant", "constant")
	rPlain := gate.NewRefresher(budgetGate{}, gate.RefresherConfig{Name: "constant"})
	plain.SetRefresher(rPlain)
	plug := gates.Add("plugin#1", "plugin")
	rPlug := gate.NewRefresher(wrapped{pluginGate{pid: 4242}}, gate.RefresherConfig{Name: "plugin#1"})
	plug.SetRefresher(rPlug)
	unasked := gates.Add("pool:p", "plugin")
	unasked.SetRefresher(gate.NewRefresher(pluginGate{}, gate.RefresherConfig{Name: "pool:p"}))

	plain.Observe(1, nil)
	plug.Observe(1, nil)
	plug.Observe(0, errors.New(`plugin gate-x (pid 4242) exited; next start in 1s`))

	now := time.Now()
	src := fixedSource{At: now,
		Queues: []pipeline.QueueSnapshot{{
			ID: "q1", Name: "requests:q1", WorkerPool: "default", Gate: rPlain,
			Waiting: 12, Delayed: -1, DeadLetterHeld: 5, DepthAt: now,
			Claimed: 3, Limit: 4, Max: 8, Budget: 0.5,
			Results: map[string]uint64{"ok": 10, "INFERENCE_ERROR": 2}, Total: 12, Throughput: 1.5,
			BudgetHistory: []pipeline.BudgetSample{{At: now.Add(-4 * time.Second), Budget: 1}, {At: now.Add(-2 * time.Second), Budget: 0.5}},
		}, {ID: "q2", Name: "requests:q2", WorkerPool: "default", Gate: rPlug, Max: 8}},
		Pools: []pipeline.PoolSnapshot{{ID: "default", Workers: 8, InFlight: 3}},
	}
	p := New(Config{Pipeline: src, Gates: gates, Transport: "memory", Version: "v9.9.9", Started: now.Add(-90 * time.Second)})
	resp := get(t, p, "/status.json")
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("GET /status.json: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	var s Snapshot
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		t.Fatal(err)
	}
	if s.Process.Version != "v9.9.9" || s.Process.UptimeS != 90 || s.Process.Transport != "memory" || s.Process.PID == 0 {
		t.Errorf("process %+v", s.Process)
	}
	if len(s.Queues) != 2 {
		t.Fatalf("%d queues", len(s.Queues))
	}
	q := s.Queues[0]
	if q.ID != "q1" || q.Name != "requests:q1" || q.Transport != "memory" || q.WorkerPool != "default" || q.Gate != "constant" {
		t.Errorf("queue %+v", q)
	}
	if q.Waiting == nil || *q.Waiting != 12 || q.Delayed != nil || q.DeadLetterHeld == nil || *q.DeadLetterHeld != 5 {
		t.Errorf("depth %v/%v/%v, want 12/unknown/5", q.Waiting, q.Delayed, q.DeadLetterHeld)
	}
	if q.Claimed != 3 || q.Limit != 4 || q.Max != 8 || q.Results["ok"] != 10 || q.Total != 12 || q.Throughput != 1.5 {
		t.Errorf("figures %+v", q)
	}
	// The history, then the budget in force now.
	if h := q.BudgetHistory; len(h) != 3 || h[2][0] != float64(s.Now) || h[2][1] != 0.5 || h[0][1] != 1 {
		t.Errorf("budget history %v", h)
	}
	if s.Queues[1].Waiting != nil || s.Queues[1].Gate != "plugin#1" {
		t.Errorf("second queue %+v", s.Queues[1])
	}
	if len(s.Gates) != 3 {
		t.Fatalf("%d gates", len(s.Gates))
	}
	if g := s.Gates[0]; g.State != "ok" || g.Plugin != nil || g.Failures != 0 {
		t.Errorf("constant gate %+v", g)
	}
	if g := s.Gates[1]; g.State != "failing" || g.Failures != 1 || !strings.Contains(g.LastError, "next start in") ||
		g.Plugin == nil || g.Plugin.PID != 4242 || g.Plugin.State != "failing" {
		t.Errorf("plugin gate %+v (plugin %+v)", g, g.Plugin)
	}
	if g := s.Gates[2]; g.State != "starting" || g.Plugin == nil || g.Plugin.State != "not running" {
		t.Errorf("unasked plugin gate %+v (plugin %+v)", g, g.Plugin)
	}
	if len(s.Pools) != 1 || s.Pools[0].Workers != 8 || s.Pools[0].InFlight != 3 {
		t.Errorf("pools %+v", s.Pools)
	}
	plug.Observe(1, nil)
	_ = json.NewDecoder(get(t, p, "/status.json").Body).Decode(&s)
	if g := s.Gates[1]; g.State != "ok" || g.Plugin.State != "running" || g.Failures != 1 {
		t.Errorf("recovered plugin gate %+v (plugin %+v)", g, g.Plugin)
	}
}

// A queue whose eviction is suspended says so in the JSON, with what its
// gate saw and when eviction is tried again; the page draws it.
func TestEvictSuspended(t *testing.T) {
	now := time.Now()
	until := now.Add(30 * time.Second)
	p := New(Config{Pipeline: fixedSource{At: now, Queues: []pipeline.QueueSnapshot{
		{ID: "b", Name: "b", Evict: "suspended", EvictReason: "pods saw 0 of 4 aborts", EvictUntil: until},
		{ID: "c", Name: "c", Evict: "on"},
		{ID: "d", Name: "d"},
	}}})
	var s Snapshot
	if err := json.NewDecoder(get(t, p, "/status.json").Body).Decode(&s); err != nil {
		t.Fatal(err)
	}
	if q := s.Queues[0]; q.Evict != "suspended" || q.EvictReason != "pods saw 0 of 4 aborts" || q.EvictUntil != until.UnixMilli() {
		t.Errorf("suspended queue: %+v", q)
	}
	if s.Queues[1].Evict != "on" || s.Queues[1].EvictUntil != 0 || s.Queues[2].Evict != "" {
		t.Errorf("queues: %+v", s.Queues[1:])
	}
	body, _ := io.ReadAll(get(t, p, "/").Body)
	if !strings.Contains(string(body), `"eviction suspended, tried again in "`) || !strings.Contains(string(body), "q.evict_reason") {
		t.Error("the page does not draw a suspended eviction")
	}
}
