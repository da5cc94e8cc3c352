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

// podGate stands for pool-headroom with dispatch "pods": it reports its
// per-pod readings.
type podGate struct {
	budgetGate
	pods []gate.PodReading
}

func (g *podGate) PodReadings() []gate.PodReading { return append([]gate.PodReading(nil), g.pods...) }

// A gate that places requests on pods shows, in status.json, each pod's
// in flight and limit with their history (sampled at most once per
// PodHistoryStep, through the registry's wrapper), the last reading
// closing it; the page draws them as a chart in the queue's card.
func TestGatePods(t *testing.T) {
	pg := &podGate{pods: []gate.PodReading{
		{Pod: "http://pod-0:8000", InFlight: 3, Limit: 5, Running: 9, Waiting: 1, KV: 0.25, Burst: true},
		{Pod: "http://pod-1:8000", InFlight: 7, Limit: 1020},
	}}
	gates := NewGates()
	st := gates.Add("q", "pool-headroom")
	r := gate.NewRefresher(wrapped{pg}, gate.RefresherConfig{Name: "q"})
	st.SetRefresher(r)
	st.Observe(1, nil) // sampled: 3 and 7 in flight
	pg.pods[0].InFlight = 4
	st.Observe(1, nil) // within PodHistoryStep: not sampled
	st.Observe(0, errors.New("scrape failed"))
	pg.pods[0].InFlight = 2 // the reading in force when the page asks

	now := time.Now()
	p := New(Config{Pipeline: fixedSource{At: now, Queues: []pipeline.QueueSnapshot{{ID: "b", Name: "b", Gate: r}}}, Gates: gates})
	var s Snapshot
	if err := json.NewDecoder(get(t, p, "/status.json").Body).Decode(&s); err != nil {
		t.Fatal(err)
	}
	if len(s.Gates) != 1 || len(s.Gates[0].Pods) != 2 {
		t.Fatalf("gates %+v, want one gate with 2 pods", s.Gates)
	}
	p0, p1 := s.Gates[0].Pods[0], s.Gates[0].Pods[1]
	if p0.Pod != "http://pod-0:8000" || p0.InFlight != 2 || p0.Limit != 5 || p0.Running != 9 || p0.Waiting != 1 || p0.KV != 0.25 || !p0.Burst {
		t.Errorf("pod 0: %+v", p0)
	}
	if h := p0.History; len(h) != 2 || h[0][1] != 3 || h[0][2] != 5 || h[1] != [3]float64{float64(s.Now), 2, 5} {
		t.Errorf("pod 0 history %v, want the sample (3 of 5) then the reading now (2 of 5)", h)
	}
	if h := p1.History; p1.InFlight != 7 || p1.Limit != 1020 || len(h) != 2 || h[0][1] != 7 {
		t.Errorf("pod 1: %+v", p1)
	}
	// a gate that does not place requests has no pods in the JSON
	plain := NewGates()
	ps := plain.Add("c", "constant")
	ps.SetRefresher(gate.NewRefresher(budgetGate{}, gate.RefresherConfig{Name: "c"}))
	ps.Observe(1, nil)
	resp := get(t, New(Config{Pipeline: fixedSource{At: now}, Gates: plain}), "/status.json")
	body, _ := io.ReadAll(resp.Body)
	if strings.Contains(string(body), `"pods"`) {
		t.Errorf("a constant gate's entry has pods: %s", body)
	}
	page, _ := io.ReadAll(get(t, p, "/").Body)
	for _, want := range []string{"function podChart(", "g.pods && g.pods.length ? podChart(", `"batch in flight per pod"`, "p.in_flight", "p.limit"} {
		if !strings.Contains(string(page), want) {
			t.Errorf("the page lacks %q: it does not draw the pods", want)
		}
	}
}

// An "Also" figure with a chart carries its lines in status.json, and the
// page draws them with the budget chart's code above the table.
func TestExtraChart(t *testing.T) {
	now := time.Now()
	at := func(d time.Duration) float64 { return float64(now.Add(d).UnixMilli()) }
	p := New(Config{Pipeline: fixedSource{At: now}, Extra: func() []Figure {
		return []Figure{
			{Label: "phase", Value: "burst"},
			{Label: "TTFT p99", Value: "80 ms", Chart: &Chart{Unit: "ms", Lines: []Line{
				{Label: "p99", Points: [][2]float64{{at(-2 * time.Second), 40}, {at(-time.Second), 80}}},
				{Label: "floor", Points: [][2]float64{{at(-2 * time.Second), 50}, {at(0), 50}}},
			}}},
		}
	}})
	var s Snapshot
	if err := json.NewDecoder(get(t, p, "/status.json").Body).Decode(&s); err != nil {
		t.Fatal(err)
	}
	if len(s.Extra) != 2 || s.Extra[0].Chart != nil {
		t.Fatalf("extra %+v", s.Extra)
	}
	c := s.Extra[1].Chart
	if c == nil || c.Unit != "ms" || len(c.Lines) != 2 || c.Lines[0].Label != "p99" || len(c.Lines[0].Points) != 2 ||
		c.Lines[0].Points[1][1] != 80 || c.Lines[1].Points[1][0] != at(0) {
		t.Errorf("chart %+v", c)
	}
	page, _ := io.ReadAll(get(t, p, "/").Body)
	for _, want := range []string{"function figureChart(", "f.chart.lines", "chartBlock(lines, now, span, ymax"} {
		if !strings.Contains(string(page), want) {
			t.Errorf("the page lacks %q: it does not draw the figures' charts", want)
		}
	}
	if n := strings.Count(string(page), "<polyline"); n != 1 {
		t.Errorf("%d polyline templates in the page, want the one chart implementation", n)
	}
}
