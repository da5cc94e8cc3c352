package redissortedset_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/sluice-io/sluice/core/app"
	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/gates/constant"
	"github.com/sluice-io/sluice/internal/simulator"
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/transports/internal/rigs/dispatcher"
	rss "github.com/sluice-io/sluice/transports/redissortedset"
	"github.com/sluice-io/sluice/transports/redissortedset/producer"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// go-redis' pool reaper and the HTTP transport's idle connections outlive a test briefly.
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		// After a failed dial (a killed cluster node) go-redis re-dials in the
		// background, one try a second, until it notices its pool closed.
		goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"),
		// app registers gcp-pubsub, whose client library starts OpenCensus' worker at init.
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
	)
}

// fixture is a redis-server, a producer on it and a gateway simulator.
type fixture struct {
	t     *testing.T
	redis *testenv.Redis
	prod  *producer.Producer
	sim   string
	// server is the gateway simulator behind sim.
	server *simulator.Server
	// redisURL and redisMode are the deployment's Redis (redis.URL, single,
	// unless a test sets them).
	redisURL, redisMode string
	// log receives the apps' logs (nil: discarded).
	log *slog.Logger
	// tune, when set, changes the deployment's configuration before its
	// app starts (runAppOn).
	tune func(*config.Config)
	// app is the deployment runAppOn started last.
	app *app.App
}

func newFixture(t *testing.T, simCfg simulator.Config) *fixture {
	t.Helper()
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	p, err := producer.Dial(r.URL, producer.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	f := newSimFixture(t, simCfg)
	f.redis, f.prod, f.redisURL = r, p, r.URL
	return f
}

// newSimFixture is a fixture with only its gateway simulator: the test
// sets its Redis.
func newSimFixture(t *testing.T, simCfg simulator.Config) *fixture {
	t.Helper()
	f := &fixture{t: t}
	s, err := simulator.New(simCfg)
	if err != nil {
		t.Fatal(err)
	}
	base, err := s.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	f.sim, f.server = base, s
	return f
}

// request builds a request due in ttl.
func request(id, job string, ttl time.Duration, headers map[string]string) *wire.Request {
	r := &wire.Request{ID: id, Deadline: time.Now().Add(ttl), Created: time.Now(),
		Payload: json.RawMessage(`{"model":"m","prompt":"hi"}`), Headers: headers}
	if job != "" {
		r.Metadata = map[string]string{"job_id": job}
	}
	return r
}

func (f *fixture) transport(opts rss.Options) *rss.Transport {
	f.t.Helper()
	if opts.URL == "" {
		opts.URL = f.redisURL
	}
	tp, err := rss.New(opts, nil)
	if err != nil {
		f.t.Fatal(err)
	}
	return tp
}

// runApp runs a sluice deployment on queue → results with tp until the
// returned stop is called (also at cleanup).
func (f *fixture) runApp(tp *rss.Transport, queue, results string, concurrency int) (stop func()) {
	f.t.Helper()
	return f.runAppOn(tp, []config.Queue{{Queue: transport.Queue{Name: queue}, IGWBaseURL: f.sim}}, results, concurrency)
}

// runAppQueues is runApp on many queues, each with its own result list
// resultOf(queue).
func (f *fixture) runAppQueues(tp *rss.Transport, queues []string, resultOf func(string) string, concurrency int) (stop func()) {
	f.t.Helper()
	qs := make([]config.Queue, len(queues))
	for i, q := range queues {
		qs[i] = config.Queue{Queue: transport.Queue{Name: q, ResultName: resultOf(q)}, IGWBaseURL: f.sim}
	}
	return f.runAppOn(tp, qs, resultOf(queues[0]), concurrency)
}

// runAppOn runs a sluice deployment on qs, whose default result list is
// results, until the returned stop is called (also at cleanup).
func (f *fixture) runAppOn(tp *rss.Transport, qs []config.Queue, results string, concurrency int) (stop func()) {
	f.t.Helper()
	cfg := &config.Config{
		Transport:   rss.Name,
		Concurrency: concurrency,
		TransportConfig: config.TransportConfig{
			ResultQueueName: results,
			Queues:          qs,
		},
		MetricsPort:  -1,
		HealthPort:   -1,
		DrainTimeout: config.Duration(5 * time.Second),
		RedisURL:     f.redisURL,
		RedisMode:    f.redisMode,
		Retry:        config.Retry{Base: config.Duration(200 * time.Millisecond), Max: config.Duration(time.Second)},
	}
	if f.tune != nil {
		f.tune(cfg)
	}
	ad := app.NewAdapters()
	if err := ad.Gates.Register(constant.Type, constant.Factory); err != nil {
		f.t.Fatal(err)
	}
	f.app, stop = dispatcher.Run(f.t, cfg, app.Options{Adapters: ad, Transport: tp, Logger: f.log})
	return stop
}

// collect reads n results from list (acking them) within d.
func (f *fixture) collect(list string, n int, d time.Duration) map[string]*wire.Result {
	f.t.Helper()
	r := f.prod.Results(list, producer.ReaderOptions{Batch: 500, PollInterval: 20 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	out := map[string]*wire.Result{}
	for len(out) < n {
		ls, err := r.Next(ctx)
		if err != nil {
			f.t.Fatalf("collected %d of %d results: %v", len(out), n, err)
		}
		for _, l := range ls {
			if l.Err != nil {
				f.t.Fatalf("bad result %q: %v", l.Raw, l.Err)
			}
			if _, dup := out[l.Result.ID]; dup {
				f.t.Errorf("second result for %s", l.Result.ID)
			}
			out[l.Result.ID] = l.Result
		}
		if err := r.Ack(ctx, ls...); err != nil {
			f.t.Fatal(err)
		}
	}
	return out
}

// expectNoMore checks that list stays empty for d.
func (f *fixture) expectNoMore(list string, d time.Duration) {
	f.t.Helper()
	time.Sleep(d)
	n, err := f.prod.Client().LLen(context.Background(), list).Result()
	if err != nil {
		f.t.Fatal(err)
	}
	if n != 0 {
		f.t.Errorf("%d unexpected extra result(s) in %s", n, list)
	}
}

// depth returns the queue's depths.
// waitInFlight waits until queue has n requests in flight and none
// waiting, delayed or dead.
func (f *fixture) waitInFlight(queue string, n int, timeout time.Duration) {
	f.t.Helper()
	want := fmt.Sprintf("waiting=0 inflight=%d delayed=0 dead=0", n)
	deadline := time.Now().Add(timeout)
	for f.depth(queue) != want {
		if time.Now().After(deadline) {
			f.t.Fatalf("requests not in flight: %s", f.depth(queue))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (f *fixture) depth(queue string) string {
	f.t.Helper()
	d, err := rss.QueueDepth(context.Background(), f.prod.Client(), f.prod.Names(), queue)
	if err != nil {
		f.t.Fatal(err)
	}
	return fmt.Sprintf("waiting=%d inflight=%d delayed=%d dead=%d", d.Waiting, d.InFlight, d.Delayed, d.DeadLettered)
}

func ids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%04d", prefix, i)
	}
	return out
}

func redisZ(score float64, member string) redis.Z { return redis.Z{Score: score, Member: member} }

// openSource opens tp's source of queue q (results to results) for the
// rest of the test: closed, and its context cancelled, at cleanup.
func openSource(tb testing.TB, tp *rss.Transport, q, results string) (transport.Source, context.Context) {
	tb.Helper()
	src, err := tp.Source(transport.Queue{Name: q, ResultName: results})
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tb.Cleanup(func() { cancel(); _ = src.Close() })
	if err := src.Open(ctx); err != nil {
		tb.Fatal(err)
	}
	return src, ctx
}
