package app

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/transports/redissortedset"
)

// probe GETs path on the health endpoint of a and decodes upstream's body.
func probe(t *testing.T, a *App, path string) (int, healthBody) {
	t.Helper()
	resp, err := http.Get("http://" + a.Addr("health") + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s: Content-Type %q", path, ct)
	}
	var b healthBody
	dec := json.NewDecoder(resp.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil {
		t.Fatalf("%s: body: %v", path, err)
	}
	return resp.StatusCode, b
}

// /readyz follows Redis as upstream's does: ready while PING answers, 503
// {"status":"not ready","error":...} while redis-server is down (within the
// 3 s bound), ready again once it is back; /healthz stays 200 throughout.
func TestReadyzFollowsRedis(t *testing.T) {
	_, gw := newGateway(t)
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	tp, err := redissortedset.New(redissortedset.Options{Server: redissortedset.Server{URL: r.URL}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &config.Config{
		Transport: redissortedset.Name, Concurrency: 2, MetricsPort: -1,
		ListenHost: "127.0.0.1", HealthPort: testenv.FreePort(t), RedisURL: r.URL,
		DrainTimeout: config.Duration(time.Second),
		TransportConfig: config.TransportConfig{ResultQueueName: e2eResults,
			Queues: []config.Queue{{Queue: transport.Queue{Name: e2eQueue}, IGWBaseURL: gw}}},
	}
	a, err := New(cfg, Options{Adapters: testAdapters(t), Transport: tp})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	stop := sync.OnceFunc(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("Run did not return")
		}
	})
	t.Cleanup(stop)
	waitFor(t, func() bool { return a.Pipeline().Ready() }, 5*time.Second)

	if code, b := probe(t, a, "/readyz"); code != http.StatusOK || b != (healthBody{Status: "ready"}) {
		t.Fatalf("redis up: %d %+v", code, b)
	}
	r.Stop()
	start := time.Now()
	code, b := probe(t, a, "/readyz")
	if code != http.StatusServiceUnavailable || b.Status != "not ready" || !strings.Contains(b.Error, "redis ping") {
		t.Fatalf("redis down: %d %+v", code, b)
	}
	if el := time.Since(start); el > healthCheckTimeout+500*time.Millisecond {
		t.Errorf("/readyz took %s with redis down", el)
	}
	if code, b := probe(t, a, "/healthz"); code != http.StatusOK || b != (healthBody{Status: "ok"}) {
		t.Errorf("/healthz with redis down: %d %+v", code, b)
	}
	testenv.StartRedis(t, testenv.RedisOptions{Port: tcpPort(t, r.Addr), Dir: r.Dir()})
	if code, b := probe(t, a, "/readyz"); code != http.StatusOK || b != (healthBody{Status: "ready"}) {
		t.Fatalf("redis back: %d %+v", code, b)
	}
	stop() // while redis-server still runs (cleanups stop it first)
}

// From shutdown on, through the drain, /readyz answers 503
// {"status":"not ready"} without asking the broker.
func TestReadyzNotReadyWhileDraining(t *testing.T) {
	gw, url := newGateway(t)
	h := startApp(t, url, 10*time.Second, func(c *config.Config) {
		c.ListenHost, c.HealthPort = "127.0.0.1", testenv.FreePort(t)
	})
	if err := h.mem.Enqueue(e2eQueue, request("slow", time.Now().Add(time.Minute), map[string]any{"sleep_ms": 1500})); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return len(gw.attempts("slow")) == 1 }, 5*time.Second)
	if code, b := probe(t, h.app, "/readyz"); code != http.StatusOK || b != (healthBody{Status: "ready"}) {
		t.Fatalf("running: %d %+v", code, b)
	}
	h.stop() // SIGTERM: the request in flight is drained
	waitFor(t, func() bool { return !h.app.Pipeline().Ready() }, time.Second)
	if code, b := probe(t, h.app, "/readyz"); code != http.StatusServiceUnavailable || b != (healthBody{Status: "not ready"}) {
		t.Errorf("draining: %d %+v", code, b)
	}
	if code, b := probe(t, h.app, "/healthz"); code != http.StatusOK || b != (healthBody{Status: "ok"}) {
		t.Errorf("/healthz while draining: %d %+v", code, b)
	}
	select {
	case err := <-h.errc:
		t.Fatalf("Run returned (%v) before the drain ended: the probes above did not see the drain", err)
	default:
	}
	if err := h.shutdown(); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if n, _ := h.mem.ResultCount(e2eResults); n != 1 {
		t.Errorf("%d results after the drain, want 1", n)
	}
}

// tcpPort returns the port of addr (host:port).
func tcpPort(t *testing.T, addr string) int {
	t.Helper()
	ta, err := net.ResolveTCPAddr("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return ta.Port
}
