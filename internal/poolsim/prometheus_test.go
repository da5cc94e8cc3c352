package poolsim_test

// This file is the one place where the ground-floor poolsim package meets
// sluice's gates: an external test, so the package itself imports nothing
// above it.

import (
	"context"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/gates/endpointscrape"
	"github.com/sluice-io/sluice/gates/prombudget"
	"github.com/sluice-io/sluice/gates/promsaturation"
	"github.com/sluice-io/sluice/internal/poolsim"
	"github.com/sluice-io/sluice/internal/testenv"
)

func buildGate(t *testing.T, f gate.Factory, params string, env gate.Env) gate.Gate {
	t.Helper()
	var obj map[string]json.RawMessage
	if err := json.Unmarshal([]byte(params), &obj); err != nil {
		t.Fatal(err)
	}
	p, err := gate.ParseParams(obj)
	if err != nil {
		t.Fatal(err)
	}
	g, err := f(p, env)
	if err != nil {
		t.Fatalf("gate %s: %v", params, err)
	}
	t.Cleanup(func() {
		if c, ok := g.(interface{ Close() error }); ok {
			_ = c.Close()
		}
	})
	return g
}

// waitGate polls g until it reads want (within 1e-6) without error: a
// fallback budget (missing metric) does not count.
func waitGate(t *testing.T, name string, g gate.Gate, want float64, what string) {
	t.Helper()
	var got float64
	var err error
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if got, err = g.Budget(context.Background()); err == nil && math.Abs(got-want) < 1e-6 {
			return
		}
	}
	t.Fatalf("%s, %s: budget %v (err %v), want %v", what, name, got, err, want)
}

// TestGatesReadThePool runs a real prometheus scraping the front (and the
// pod, with an inference_pool label as a harness would attach) and checks
// that sluice's prometheus-saturation and prometheus-budget gates, and the
// endpoint-scrape gate on the front's /metrics, read the pool's state.
func TestGatesReadThePool(t *testing.T) {
	cfg := poolsim.Config{Seed: 1, Pods: 1}
	cfg.Engine.MaxNumSeqs = 1
	cfg.Front.QueueDepthThreshold = 4
	cfg.Front.FlushInterval = 200 * time.Millisecond
	p, err := poolsim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	base, err := p.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	prom := testenv.StartPrometheusWith(t, testenv.PrometheusOptions{
		ScrapeInterval: 250 * time.Millisecond,
		Targets: []testenv.ScrapeTarget{
			{URL: base + poolsim.PathMetrics},
			{URL: base + poolsim.PodPrefix + "0" + poolsim.PathMetrics, Labels: map[string]string{"inference_pool": "other-pool"}},
		},
	})
	env := gate.Env{PrometheusURL: prom.URL}
	sat := buildGate(t, promsaturation.Factory, `{"inference_pool":"sim-pool","cache_ttl":"100ms"}`, env)
	budget := buildGate(t, prombudget.Factory, `{"inference_pool":"sim-pool","max_concurrency":4,"baseline":0,"cache_ttl":"100ms"}`, env)
	scrape := buildGate(t, endpointscrape.Factory, `{"url":"`+base+poolsim.PathMetrics+`","metric":"vllm:num_requests_waiting",`+
		`"labels":{"pod":"pod-0"},"max_count_per_pod":4,"cache_ttl":"100ms"}`, gate.Env{})

	// Idle: saturation 0 → budget = threshold 0.8; no queue → D = 1.
	waitGate(t, "prometheus-saturation", sat, 0.8, "idle")
	waitGate(t, "prometheus-budget", budget, 1, "idle")
	waitGate(t, "endpoint-scrape", scrape, 1, "idle")

	// One request runs on the single seat and two wait: the pod scores
	// 2/4 = 0.5, so the saturation gate reads 0.8 − 0.5 and the budget
	// gates 1 − 2/4.
	c := &http.Client{Transport: &http.Transport{}}
	defer c.CloseIdleConnections()
	release := hold(t, c, base, 3)
	waitGate(t, "prometheus-saturation", sat, 0.3, "one running, two waiting")
	waitGate(t, "prometheus-budget", budget, 0.5, "one running, two waiting")
	waitGate(t, "endpoint-scrape", scrape, 0.5, "one running, two waiting")

	// Four more waiting: saturation 1.5 ≥ 0.8 closes the saturation gate.
	release2 := hold(t, c, base, 4)
	waitGate(t, "prometheus-saturation", sat, 0, "one running, six waiting")
	waitGate(t, "prometheus-budget", budget, 0, "one running, six waiting")
	release2()
	release()
	waitGate(t, "prometheus-saturation", sat, 0.8, "idle again")
}

// hold sends n long requests that stay open until release.
func hold(t *testing.T, c *http.Client, base string, n int) (release func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+poolsim.PathCompletions,
				strings.NewReader(`{"prompt":"hi","max_tokens":3000}`))
			if resp, err := c.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	return func() { cancel(); wg.Wait() }
}
