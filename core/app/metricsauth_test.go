package app

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/metricsauth"
	"github.com/sluice-io/sluice/core/metricsauth/metricsauthtest"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/transports/memory"
)

// closeCount is a MetricsGuard wrapper that counts Close calls.
type closeCount struct {
	MetricsGuard
	closed atomic.Int32
}

func (c *closeCount) Close() error { c.closed.Add(1); return nil }

// TestMetricsGuard: with Options.MetricsGuard, /metrics goes through the
// guard (here metricsauth against a fake Kubernetes API), and the guard is
// closed with the deployment.
func TestMetricsGuard(t *testing.T) {
	api := metricsauthtest.New(t)
	g, err := metricsauth.New(metricsauth.Config{Host: api.URL, TokenFile: api.TokenFile, CAFile: api.CAFile})
	if err != nil {
		t.Fatal(err)
	}
	guard := &closeCount{MetricsGuard: g}
	cfg := &config.Config{
		Transport: memory.Name, MetricsPort: -1, HealthPort: -1,
		TransportConfig: config.TransportConfig{ResultQueueName: "r", Queues: []config.Queue{{Queue: transport.Queue{Name: "q"}, IGWBaseURL: "http://gw"}}},
	}
	a, err := New(cfg, Options{Adapters: testAdapters(t), Transport: memory.New(memory.Options{}), Registry: prometheus.NewRegistry(), MetricsGuard: guard})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a.mux("metrics"))
	defer srv.Close()
	for token, want := range map[string]int{"": 401, metricsauthtest.TokenDenied: 403, metricsauthtest.TokenAllowed: 200, "forged": 401} {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/metrics", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("token %q: %d, want %d", token, resp.StatusCode, want)
		}
	}
	if n, z := api.Calls(); n != 3 || z != 2 {
		t.Errorf("API calls: %d token reviews, %d access reviews; want 3, 2", n, z)
	}
	for _, ar := range api.AccessReviews() {
		if ar.Spec.NonResourceAttributes == nil || ar.Spec.NonResourceAttributes.Path != "/metrics" || ar.Spec.NonResourceAttributes.Verb != "get" {
			t.Errorf("access review: %+v", ar.Spec)
		}
	}
	a.close()
	if guard.closed.Load() != 1 {
		t.Errorf("guard closed %d times, want 1", guard.closed.Load())
	}

	// Without a guard /metrics stays open.
	b, err := New(&config.Config{Transport: memory.Name, MetricsPort: -1, HealthPort: -1, TransportConfig: cfg.TransportConfig},
		Options{Adapters: testAdapters(t), Transport: memory.New(memory.Options{}), Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	defer b.close()
	w := httptest.NewRecorder()
	b.mux("metrics").ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if w.Code != 200 || strings.Contains(w.Body.String(), "Unauthorized") {
		t.Errorf("no guard: %d", w.Code)
	}
}
