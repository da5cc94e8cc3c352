package host_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-io/sluice/core/app"
	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/plugins/host"
	"github.com/sluice-io/sluice/transports/memory"
)

// The example plugin gates a whole sluice: nothing is dispatched while its
// budget file says 0, everything once it says 1, and a denied tenant ends
// with GATE_DROPPED without reaching the gateway.
func TestEndToEndThroughApp(t *testing.T) {
	var hits atomic.Int64
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == "PRI" {
			// The h2c preface of dispatch.protocol auto's detection, which
			// net/http hands to the handler of an HTTP/1.1-only server.
			return
		}
		hits.Add(1)
		_, _ = w.Write([]byte(`{"ok":true}`))
	}))
	defer gw.Close()

	file := budgetFile(t, "0")
	params := map[string]json.RawMessage{}
	for k, v := range map[string]string{"path": pluginBin, "file": file, "admit": "true", "deny_tenants": "blocked"} {
		params[k], _ = json.Marshal(v)
	}
	const queue, results = "requests", "results"
	mem := memory.New(memory.Options{})
	cfg := &config.Config{
		Transport: memory.Name, Concurrency: 4, MetricsPort: -1, HealthPort: -1,
		DrainTimeout: config.Duration(5 * time.Second),
		TransportConfig: config.TransportConfig{ResultQueueName: results, Queues: []config.Queue{{
			Queue: transport.Queue{Name: queue}, IGWBaseURL: gw.URL, GateType: "plugin", GateParams: params,
		}}},
	}
	ad := app.NewAdapters()
	if err := ad.Gates.Register(host.Type, host.Factory); err != nil {
		t.Fatal(err)
	}
	a, err := app.New(cfg, app.Options{Adapters: ad, Transport: mem, Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- a.Run(ctx) }()
	defer func() {
		stop()
		select {
		case err := <-errc:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("Run did not return")
		}
	}()

	deadline := time.Now().Add(time.Minute)
	for _, r := range []struct{ id, tenant string }{{"a", "t1"}, {"b", "t2"}, {"x", "blocked"}} {
		b, _ := json.Marshal(map[string]any{
			"id": r.id, "deadline": float64(deadline.UnixMilli()) / 1000, "payload": map[string]string{"p": "1"},
			"metadata": map[string]string{"tenant": r.tenant},
		})
		if err := mem.Enqueue(queue, b); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(500 * time.Millisecond)
	if n, _ := mem.ResultCount(results); n != 0 || hits.Load() != 0 {
		t.Fatalf("budget 0: %d results, %d gateway calls; want none", n, hits.Load())
	}
	if err := os.WriteFile(file, []byte("1"), 0o600); err != nil {
		t.Fatal(err)
	}
	wait := time.After(20 * time.Second)
	for {
		n, more := mem.ResultCount(results)
		if n >= 3 {
			break
		}
		select {
		case <-more:
		case <-wait:
			t.Fatalf("%d results after opening the gate, want 3", n)
		}
	}
	got := map[string]*wire.Result{}
	for _, b := range mem.Results(results) {
		r, err := wire.DecodeResult(b)
		if err != nil {
			t.Fatal(err)
		}
		got[r.ID] = r
	}
	for _, id := range []string{"a", "b"} {
		if r := got[id]; r == nil || r.ErrorCode != "" || r.StatusCode != 200 {
			t.Errorf("%s: %+v", id, r)
		}
	}
	if r := got["x"]; r == nil || r.ErrorCode != wire.CodeGateDropped {
		t.Errorf("denied tenant: %+v, want %s", r, wire.CodeGateDropped)
	}
	if n := hits.Load(); n != 2 {
		t.Errorf("gateway called %d times, want 2", n)
	}
}
