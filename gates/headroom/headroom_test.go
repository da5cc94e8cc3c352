package headroom_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/gates/gatetest"
	"github.com/sluice-io/sluice/gates/headroom"
	"github.com/sluice-io/sluice/internal/poolsim"
)

// pods is a set of fake model servers exporting vLLM's gauges and, with
// exportAborts, its request_success_total by finished_reason (abort: set by
// the test).
type pods struct {
	mu               sync.Mutex
	running, waiting []int
	kv               []float64
	aborts           []float64
	exportAborts     bool
	steps            []int // engine steps so far (exported when > 0)
	srv              []*httptest.Server
}

func newPods(t testing.TB, n int) *pods {
	p := &pods{running: make([]int, n), waiting: make([]int, n), kv: make([]float64, n), aborts: make([]float64, n), steps: make([]int, n)}
	for i := range n {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			p.mu.Lock()
			r, q, kv, a, export, steps := p.running[i], p.waiting[i], p.kv[i], p.aborts[i], p.exportAborts, p.steps[i]
			p.mu.Unlock()
			if steps > 0 {
				fmt.Fprintf(w, "# TYPE vllm:iteration_tokens_total histogram\nvllm:iteration_tokens_total_bucket{model_name=\"m\",le=\"+Inf\"} %d\n", steps)
				fmt.Fprintf(w, "vllm:iteration_tokens_total_sum{model_name=\"m\"} %d\nvllm:iteration_tokens_total_count{model_name=\"m\"} %d\n", 100*steps, steps)
			}
			if export {
				fmt.Fprint(w, "# TYPE vllm:request_success_total counter\nvllm:request_success_total{finished_reason=\"stop\",model_name=\"m\"} 7\n")
				fmt.Fprintf(w, "vllm:request_success_total{finished_reason=\"abort\",model_name=\"m\"} %g\n", a)
			}
			fmt.Fprintf(w, "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_name=\"m\",engine=\"0\"} %g\n", kv)
			fmt.Fprintf(w, "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\",engine=\"0\"} %d\n", r)
			fmt.Fprintf(w, "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"m\",engine=\"0\"} %d\n", q)
		}))
		t.Cleanup(s.Close)
		p.srv = append(p.srv, s)
	}
	return p
}

// addSteps counts n more engine steps on pod i (exported once any are).
func (p *pods) addSteps(i, n int) {
	p.mu.Lock()
	p.steps[i] += n
	p.mu.Unlock()
}

func (p *pods) set(i, running, waiting int) {
	p.mu.Lock()
	p.running[i], p.waiting[i] = running, waiting
	p.mu.Unlock()
}

func (p *pods) urls() []string {
	var out []string
	for _, s := range p.srv {
		out = append(out, s.URL+"/metrics")
	}
	return out
}

func (p *pods) params(extra string) string {
	return fmt.Sprintf(`{"endpoints":%q,"seats_per_pod":16%s}`, strings.Join(p.urls(), ","), extra)
}

func build(t testing.TB, params string, maxConc int) (gate.Gate, error) {
	r := gate.NewRegistry()
	if err := r.Register(headroom.Type, headroom.Factory); err != nil {
		t.Fatal(err)
	}
	return gatetest.Build(t, r, headroom.Type, params, gate.Env{MaxConcurrency: maxConc})
}

func mustBuild(t testing.TB, params string, maxConc int) *headroom.Gate {
	t.Helper()
	g, err := build(t, params, maxConc)
	if err != nil {
		t.Fatal(err)
	}
	return g.(*headroom.Gate)
}

// The formula: the seats the other traffic leaves, minus the reserve,
// over the queue's concurrency; what the gate admitted is not "other".
func TestBudgetFormula(t *testing.T) {
	p := newPods(t, 2)
	g := mustBuild(t, p.params(`,"reserve":4,"reserve_share":0.5`), 32)
	clock := time.Now()
	g.SetClock(func() time.Time { return clock })
	ctx := context.Background()
	cases := []struct {
		run0, wait0, run1, wait1 int
		own                      int
		want                     float64
	}{
		{0, 0, 0, 0, 0, 28.0 / 32},    // nothing else: all but the reserve
		{3, 0, 2, 1, 0, 19.0 / 32},    // others 6: keep 4+3
		{10, 0, 10, 0, 20, 28.0 / 32}, // all 20 are sluice's own
		{16, 4, 16, 0, 10, 0},         // others 26, keep 17: nothing left
		{16, 0, 12, 0, 24, 22.0 / 32}, // others 4, keep 6
	}
	for i, c := range cases {
		p.set(0, c.run0, c.wait0)
		p.set(1, c.run1, c.wait1)
		var releases []func()
		for range c.own {
			d, err := g.Admit(ctx, nil)
			if err != nil || d.Verdict != gate.Admit || d.Release == nil {
				t.Fatalf("case %d: Admit = %+v, %v", i, d, err)
			}
			releases = append(releases, d.Release)
		}
		b, err := g.Budget(ctx)
		if err != nil || b != c.want {
			t.Errorf("case %d: budget %v, %v; want %v (reading %+v)", i, b, err, c.want, g.Last())
		}
		for _, r := range releases {
			r()
			r() // a second release must not count twice
		}
		if c.own > 0 { // released, but still own within the grace
			if b, _ := g.Budget(ctx); b != c.want {
				t.Errorf("case %d: budget %v just after the releases, want %v until the grace passed", i, b, c.want)
			}
		}
		clock = clock.Add(time.Second)
	}
	// every admission released (once each): the 28 running are others now
	if b, err := g.Budget(ctx); b != 0 || err != nil || g.Last().Own != 0 || g.Last().Others != 28 {
		t.Errorf("after the releases: budget %v, %v, reading %+v; want 0 with own 0, others 28", b, err, g.Last())
	}
}

// kv_limit: above it on the fullest pod, the limit holds at what the queue
// has in flight (no more admissions, none taken back); at or below it,
// seats alone decide; without it, KV is not read.
func TestKVLimit(t *testing.T) {
	p := newPods(t, 2)
	ctx := context.Background()
	g := mustBuild(t, p.params(`,"reserve":4,"kv_limit":0.8`), 32)
	off := mustBuild(t, p.params(`,"reserve":4`), 32)
	for range 20 {
		if _, err := g.Admit(ctx, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := off.Admit(ctx, nil); err != nil {
			t.Fatal(err)
		}
	}
	p.set(0, 10, 0)
	p.set(1, 10, 0) // the 20 running are the queue's own: seats leave 28
	for _, c := range []struct {
		kv0, kv1 float64
		want     float64
		cap      int
	}{
		{0.5, 0.7, 28.0 / 32, -1},  // below the limit: seats decide
		{0.8, 0.3, 28.0 / 32, -1},  // at the limit
		{0.6, 0.95, 20.0 / 32, 20}, // the fullest pod above it: hold at own
		{0.9, 0.2, 20.0 / 32, 20},
	} {
		p.mu.Lock()
		p.kv[0], p.kv[1] = c.kv0, c.kv1
		p.mu.Unlock()
		b, err := g.Budget(ctx)
		if err != nil || b != c.want || g.Last().KVCap != c.cap {
			t.Errorf("kv %v/%v: budget %v, %v, reading %+v; want %v with KVCap %d", c.kv0, c.kv1, b, err, g.Last(), c.want, c.cap)
		}
		if b, err := off.Budget(ctx); err != nil || b != 28.0/32 {
			t.Errorf("kv %v/%v without kv_limit: budget %v, %v; want 28/32", c.kv0, c.kv1, b, err)
		}
	}
}

// A peak of the other traffic holds the limit down for hold: it falls at
// once and rises only once the traffic stayed lower that long.
func TestHold(t *testing.T) {
	p := newPods(t, 2)
	g := mustBuild(t, p.params(`,"reserve":0,"hold":"1s"`), 32)
	clock := time.Now()
	g.SetClock(func() time.Time { return clock })
	ctx := context.Background()
	step := func(others int, after time.Duration, want float64) {
		t.Helper()
		clock = clock.Add(after)
		p.set(0, others, 0)
		if b, err := g.Budget(ctx); err != nil || b != want {
			t.Errorf("others %d after %v: budget %v, %v; want %v (%+v)", others, after, b, err, want, g.Last())
		}
	}
	step(2, 0, 30.0/32)
	step(10, 100*time.Millisecond, 22.0/32) // falls at once
	step(4, 100*time.Millisecond, 22.0/32)  // held
	step(6, 500*time.Millisecond, 22.0/32)  // still within 1s of the peak
	step(5, 450*time.Millisecond, 26.0/32)  // the peak expired: the next highest, 6, holds
	step(5, 600*time.Millisecond, 27.0/32)
}

// The burst rule: a reading whose others reach burst_threshold starts a
// burst that lasts burst_window past the last such reading; in it the
// reserve is reserve and the limit rises above the queue's own by one per
// burst_growth at most (it falls at once); outside it the reserve is
// idle_reserve and the limit follows the readings.
func TestBurst(t *testing.T) {
	p := newPods(t, 2)
	g := mustBuild(t, p.params(`,"reserve":2,"idle_reserve":0,"hold":"-1ns","burst_threshold":4,"burst_window":"2s","burst_growth":"100ms"`), 32)
	clock := time.Now()
	g.SetClock(func() time.Time { return clock })
	ctx := context.Background()
	own := 0
	admit := func(n int) {
		for range n {
			if _, err := g.Admit(ctx, nil); err != nil {
				t.Fatal(err)
			}
			own++
		}
	}
	step := func(others int, after time.Duration, wantAllowed int, wantBurst bool) {
		t.Helper()
		clock = clock.Add(after)
		p.set(0, own+others, 0) // the queue's own run on the pod too
		b, err := g.Budget(ctx)
		r := g.Last()
		if err != nil || r.Allowed != wantAllowed || r.Burst != wantBurst || b != float64(wantAllowed)/32 {
			t.Errorf("others %d after %v (own %d): budget %v, %v, reading %+v; want allowed %d, burst %v",
				others, after, own, b, err, r, wantAllowed, wantBurst)
		}
	}
	step(2, 0, 30, false) // idle: no reserve, the limit follows the reading
	admit(20)
	step(3, 50*time.Millisecond, 29, false) // below the threshold
	step(4, 50*time.Millisecond, 21, true)  // a burst: seats leave 26, but the limit rises one over own
	step(4, 50*time.Millisecond, 20, true)  // within burst_growth of that rise: no more
	step(4, 50*time.Millisecond, 21, true)  // burst_growth passed: one more
	admit(1)
	step(5, 100*time.Millisecond, 22, true)
	step(12, 100*time.Millisecond, 18, true)  // it falls at once, below own
	step(0, time.Second, 22, true)            // still a burst: 1 s after the last reading at the threshold
	step(0, 1100*time.Millisecond, 32, false) // burst_window passed: idle again, at once
	step(4, 50*time.Millisecond, 22, true)    // a new burst
	if d := g.Describe(); !strings.Contains(d, "in bursts") || !strings.Contains(d, "0 between them") {
		t.Errorf("Describe() = %q, want the burst rule named", d)
	}
	// without burst_threshold there is no burst rule, whatever idle_reserve says
	off := mustBuild(t, p.params(`,"reserve":2,"idle_reserve":0,"hold":"-1ns"`), 32)
	p.set(0, 10, 0) // the other gate admitted nothing: all 10 are others
	if b, err := off.Budget(ctx); err != nil || b != 20.0/32 || off.Last().Burst {
		t.Errorf("no burst rule: budget %v, %v, reading %+v; want 20/32 (reserve 2, others 10)", b, err, off.Last())
	}
}

// Bad parameters are refused, each named.
func TestValidation(t *testing.T) {
	for _, c := range []struct{ params, want string }{
		{`{"seats_per_pod":16}`, "endpoints is required"},
		{`{"endpoints":"ftp://x/metrics","seats_per_pod":16}`, "not an http(s)"},
		{`{"endpoints":"http://a/metrics"}`, "seats_per_pod"},
		{`{"endpoints":"http://a/metrics","seats_per_pod":16,"reserve":-1}`, "reserve: -1 is negative"},
		{`{"endpoints":"http://a/metrics","seats_per_pod":16,"reserve_share":1}`, "reserve_share"},
		{`{"endpoints":"http://a/metrics","seats_per_pod":16,"kv_limit":1.5}`, "kv_limit"},
		{`{"endpoints":"http://a/metrics","seats_per_pod":16,"burst_threshold":-1}`, "burst_threshold: -1"},
		{`{"endpoints":"http://a/metrics","seats_per_pod":16,"burst_threshold":4,"burst_window":"-1s"}`, "burst_window"},
		{`{"endpoints":"http://a/metrics","seats_per_pod":16,"burst_growth":"-5ms"}`, "burst_growth"},
		{`{"endpoints":"http://a/metrics","seats_per_pod":16,"idle_reserve":-2}`, "idle_reserve: -2"},
		{`{"endpoints":"http://a/metrics","seats_per_pod":16,"resrve":2}`, "resrve"},
		{`{"endpoints":"http://a/metrics","seats_per_pod":16,"evict_check":"maybe"}`, "evict_check"},
		{`{"endpoints":"http://a/metrics","seats_per_pod":16,"evict_check_readings":0}`, "evict_check_readings"},
		{`{"endpoints":"http://a/metrics","seats_per_pod":16,"evict_check_backoff":"0s"}`, "evict_check_backoff"},
		{`{"endpoints":"http://a/metrics","seats_per_pod":16,"evict_check_backoff":"-1s"}`, "evict_check_backoff"},
		{`{"endpoints":"http://a/metrics","seats_per_pod":16,"abort_labels":[1]}`, "abort_labels"},
		{`{"endpoints":["http://a/metrics",3],"seats_per_pod":16}`, "endpoints"},
	} {
		_, err := build(t, c.params, 8)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err %v, want it to mention %q", c.params, err, c.want)
		}
	}
}

// A pod that does not export a gauge fails the reading (kept-last by the
// refresh loop), naming the pod and the metric.
func TestMissingMetric(t *testing.T) {
	p := newPods(t, 1)
	g := mustBuild(t, p.params(`,"waiting_metric":"vllm:nope"`), 8)
	_, err := g.Budget(context.Background())
	if err == nil || !strings.Contains(err.Error(), "vllm:nope") || !strings.Contains(err.Error(), p.srv[0].URL) {
		t.Fatalf("err %v, want the metric and the pod named", err)
	}
	if g.FailurePolicy() != gate.FailKeepLast {
		t.Fatalf("failure policy %s, want keep-last", g.FailurePolicy())
	}
}

func TestConformance(t *testing.T) {
	p := newPods(t, 2)
	gatetest.Run(t, func(t testing.TB) gate.Gate {
		return mustBuild(t, p.params(`,"reserve":0`), 32)
	}, gatetest.Features{
		Set: func(_ testing.TB, b float64) {
			others := int(32 * (1 - b))
			p.set(0, min(16, others), 0)
			p.set(1, others-min(16, others), 0)
		},
		Failing: func(t testing.TB) gate.Gate {
			s := httptest.NewServer(http.NotFoundHandler())
			u := s.URL
			s.Close()
			return mustBuild(t, fmt.Sprintf(`{"endpoints":%q,"seats_per_pod":16}`, u+"/metrics"), 32)
		},
		Hanging: func(t testing.TB) gate.Gate {
			block := make(chan struct{})
			s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				select {
				case <-block:
				case <-r.Context().Done():
				}
			}))
			t.Cleanup(func() { close(block); s.Close() })
			return mustBuild(t, fmt.Sprintf(`{"endpoints":%q,"seats_per_pod":16}`, s.URL+"/metrics"), 32)
		},
	})
}

// Against the simulated pool's real pods: the gate reads vLLM's names as
// the pods export them and sees requests the pool runs.
func TestSimulatedPool(t *testing.T) {
	cfg := poolsim.Config{Seed: 1}
	pool, err := poolsim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := pool.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	front, err := pool.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := mustBuild(t, fmt.Sprintf(`{"endpoints":"%s/pods/0/metrics,%s/pods/1/metrics","seats_per_pod":16,"reserve":2}`, front, front), 32)
	if b, err := g.Budget(ctx); err != nil || b != 30.0/32 {
		t.Fatalf("idle pool: budget %v, %v; want 30/32", b, err)
	}
	// six long requests straight to the front: others 6
	var wg sync.WaitGroup
	reqCtx, stop := context.WithCancel(ctx)
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := strings.NewReader(fmt.Sprintf(`{"model":%q,"prompt":"hi","max_tokens":2000}`, poolsim.DefaultModelName))
			req, _ := http.NewRequestWithContext(reqCtx, http.MethodPost, front+"/v1/completions", body)
			req.Header.Set("Content-Type", "application/json")
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, err := g.Budget(ctx)
		if err == nil && b == 24.0/32 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("budget %v, %v with 6 requests running; want 24/32 (reading %+v)", b, err, g.Last())
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	wg.Wait()
}
