package app

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/transports/redispubsub"
	"github.com/sluice-io/sluice/transports/redissortedset"
	"github.com/sluice-io/sluice/transports/redisstream"
)

// A result that cannot be written is kept and its write retried: the
// gateway is called once per request, sluice_results_total counts only what
// was written, and once the destination is fixed every result arrives
// exactly once. The destination is a Redis list key holding a string, so
// LPUSH fails with WRONGTYPE until the test deletes it.
func TestUnwritableResultIsNotReinferred(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server")
	}
	srv := testenv.StartRedis(t, testenv.RedisOptions{})
	cases := []struct {
		name  string
		build func(t *testing.T) (transport.Transport, string)
	}{
		{"redis-stream", func(t *testing.T) (transport.Transport, string) {
			tp, err := redisstream.New(redisstream.Options{Server: redisstream.Server{URL: srv.URL}, BlockMS: 50}, transport.Env{})
			if err != nil {
				t.Fatal(err)
			}
			return tp, redisstream.Name
		}},
		{"redis-sortedset", func(t *testing.T) (transport.Transport, string) {
			tp, err := redissortedset.New(redissortedset.Options{Server: redissortedset.Server{URL: srv.URL}, ResultRetryMS: 200}, nil)
			if err != nil {
				t.Fatal(err)
			}
			return tp, redissortedset.Name
		}},
		{"redis-pubsub", func(t *testing.T) (transport.Transport, string) {
			tp, err := redispubsub.New(redispubsub.Options{Server: redispubsub.Server{URL: srv.URL}, ResultMode: redispubsub.ResultList,
				RetryQueueName: "retry-" + t.Name()}, transport.Env{})
			if err != nil {
				t.Fatal(err)
			}
			return tp, redispubsub.Name
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tp, name := tc.build(t)
			testUnwritableResult(t, srv.URL, tp, name)
		})
	}
}

func testUnwritableResult(t *testing.T, url string, tp transport.Transport, name string) {
	const n = 20
	rc := testenv.RedisClient(t, url)
	ctx := context.Background()
	queue := "requests:" + name
	results := "results:" + name
	if err := rc.Set(ctx, results, "not a list", 0).Err(); err != nil {
		t.Fatal(err)
	}
	gw, gwURL := newGateway(t)
	reg := prometheus.NewRegistry()
	cfg := &config.Config{
		Transport: name, Concurrency: 2 * n, MetricsPort: -1, HealthPort: -1,
		DrainTimeout: config.Duration(5 * time.Second),
		TransportConfig: config.TransportConfig{ResultQueueName: results,
			Queues: []config.Queue{{Queue: transport.Queue{Name: queue}, IGWBaseURL: gwURL}}},
	}
	a, err := New(cfg, Options{Adapters: testAdapters(t), Transport: tp, Registry: reg, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- a.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		if err := <-errc; err != nil {
			t.Errorf("run: %v", err)
		}
	})

	rp := tp.(transport.RequestPublisher)
	far := time.Now().Add(time.Minute)
	for i := range n {
		id := fmt.Sprintf("%s-%d", name, i)
		publishRetrying(t, rp, transport.Queue{Name: queue}, request(id, far, nil))
	}
	// Every request was answered and its write failed at least once...
	defer func() {
		if t.Failed() {
			t.Logf("gateway calls of %s-0: %d; results_total %v; write errors %v; result key type %s",
				name, len(gw.attempts(name+"-0")), counterValue(t, reg, "sluice_results_total", "", ""),
				counterValue(t, reg, "sluice_result_write_errors_total", "", ""), rc.Type(ctx, results).Val())
			t.Logf("keys %v", rc.Keys(ctx, "*").Val())
		}
	}()
	waitUntil(t, 20*time.Second, "a failed write per request", func() bool {
		return counterValue(t, reg, "sluice_result_write_errors_total", "", "") >= n
	})
	// ...and keeps failing a while, without calling the gateway again.
	time.Sleep(2 * time.Second)
	for i := range n {
		id := fmt.Sprintf("%s-%d", name, i)
		if got := len(gw.attempts(id)); got != 1 {
			t.Errorf("%s: %d gateway calls while its result could not be written, want 1", id, got)
		}
	}
	if got := counterValue(t, reg, "sluice_results_total", "code", "ok"); got != 0 {
		t.Errorf("sluice_results_total{code=ok} = %v while no result could be written, want 0", got)
	}

	if err := rc.Del(ctx, results).Err(); err != nil { // the destination is writable again
		t.Fatal(err)
	}
	waitUntil(t, 45*time.Second, "every result written", func() bool {
		return rc.LLen(ctx, results).Val() >= n
	})
	time.Sleep(500 * time.Millisecond) // room for a duplicate to show up
	raw, err := rc.LRange(ctx, results, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, b := range raw {
		r, err := wire.DecodeResult([]byte(b))
		if err != nil {
			t.Fatalf("result %q: %v", b, err)
		}
		if !r.OK() {
			t.Errorf("result %s: not ok: %s", r.ID, b)
		}
		seen[r.ID]++
	}
	for i := range n {
		id := fmt.Sprintf("%s-%d", name, i)
		if seen[id] != 1 {
			t.Errorf("%s: %d results, want exactly 1", id, seen[id])
		}
		if got := len(gw.attempts(id)); got != 1 {
			t.Errorf("%s: %d gateway calls in all, want 1", id, got)
		}
	}
	if got := counterValue(t, reg, "sluice_results_total", "code", "ok"); got != n {
		t.Errorf("sluice_results_total{code=ok} = %v, want %d (one per written result)", got, n)
	}
}

// publishRetrying publishes a request, retrying while no subscriber hears it yet (Redis pub/sub).
func publishRetrying(t *testing.T, rp transport.RequestPublisher, q transport.Queue, payload []byte) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := rp.PublishRequest(context.Background(), q, payload)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("publish request: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitUntil polls cond until it holds or within passes.
func waitUntil(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %s", what, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// counterValue sums the counter name over the series whose label has
// value (every series when label is "").
func counterValue(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			match := label == ""
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					match = true
				}
			}
			if match {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}
