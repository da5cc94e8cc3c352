package gcppubsub_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-io/sluice/core/app"
	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/gates/constant"
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/transports/gcppubsub"
)

// On the emulator, with a result topic that does not exist: each request is
// sent to the gateway once, its result is retried, then handed back with
// the result kept (re-published to the request topic, due later); no result
// is counted while none is written. Once the topic exists, each result is
// published exactly once and counted once.
func TestMissingResultTopicIsNotReinferred(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the Pub/Sub emulator")
	}
	const n = 20
	f := newFixture(t, testenv.StartPubSubEmulator(t))
	reqTopic := f.topic(t, "rw-requests")
	f.subscription(t, "rw-requests-sub", reqTopic)

	var mu sync.Mutex
	calls := map[string]int{}
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var p struct{ ID string }
		_ = json.NewDecoder(r.Body).Decode(&p)
		mu.Lock()
		calls[p.ID]++
		mu.Unlock()
		_, _ = w.Write([]byte(`{"ok":true}`))
	}))
	t.Cleanup(gw.Close)

	tp, err := gcppubsub.New(gcppubsub.Options{ProjectID: project, EmulatorHost: f.addr}, transport.Env{})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	ad := app.NewAdapters()
	if err := ad.Gates.Register(constant.Type, constant.Factory); err != nil {
		t.Fatal(err)
	}
	cfg := &config.Config{
		Transport: gcppubsub.Name, Concurrency: 2 * n, MetricsPort: -1, HealthPort: -1,
		DrainTimeout:        config.Duration(5 * time.Second),
		ResultWriteTimeout:  config.Duration(time.Second),
		ResultHandBackDelay: config.Duration(4 * time.Second),
		TransportConfig: config.TransportConfig{ResultQueueName: "rw-results",
			Queues: []config.Queue{{Queue: transport.Queue{Name: "rw-requests-sub"}, IGWBaseURL: gw.URL}}},
	}
	a, err := app.New(cfg, app.Options{Adapters: ad, Transport: tp, Registry: reg, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- a.Run(ctx) }()
	defer func() {
		stop()
		if err := <-errc; err != nil {
			t.Errorf("run: %v", err)
		}
	}()

	far := time.Now().Add(2 * time.Minute)
	for i := range n {
		id := fmt.Sprint("rw-", i)
		b, _ := json.Marshal(map[string]any{"id": id, "deadline": far.Unix(), "payload": map[string]any{"id": id}})
		f.publish(t, reqTopic, b, nil)
	}
	// Each request is answered, its write fails for result_write_timeout,
	// and it is handed back with its result kept.
	waitCounter(t, reg, "sluice_handed_back_total", n, 30*time.Second)
	if got := counter(t, reg, "sluice_results_total"); got != 0 {
		t.Errorf("sluice_results_total = %v while the result topic is missing, want 0", got)
	}
	// Now the destination exists (and a subscription to read it), while the
	// kept results wait to come back.
	res := f.topic(t, "rw-results")
	f.subscription(t, "results-sub-rw", res)
	got := f.results(t, transport.Queue{ResultName: "results-rw"}, n, 30*time.Second)
	// Anything more would show up now.
	more := f.results(t, transport.Queue{ResultName: "results-rw"}, 1, 2*time.Second)
	seen := map[string]int{}
	for _, b := range append(got, more...) {
		r, err := wire.DecodeResult(b)
		if err != nil {
			t.Fatalf("result %s: %v", b, err)
		}
		seen[r.ID]++
	}
	mu.Lock()
	defer mu.Unlock()
	for i := range n {
		id := fmt.Sprint("rw-", i)
		if seen[id] != 1 {
			t.Errorf("%s: %d results, want 1", id, seen[id])
		}
		if calls[id] != 1 {
			t.Errorf("%s: %d gateway calls, want 1 (a result that cannot be written is not a reason to call again)", id, calls[id])
		}
	}
	if got := counter(t, reg, "sluice_results_total"); got != n {
		t.Errorf("sluice_results_total = %v, want %d", got, n)
	}
}

func counter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

func waitCounter(t *testing.T, reg *prometheus.Registry, name string, want float64, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for counter(t, reg, name) < want {
		if time.Now().After(deadline) {
			t.Fatalf("%s = %v, want %v within %s", name, counter(t, reg, name), want, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
