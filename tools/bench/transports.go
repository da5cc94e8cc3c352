package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/app"
	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/internal/simulator"
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/transports/redispubsub"
	"github.com/sluice-io/sluice/transports/redisstream"
)

// transportScenarios are the throughput scenarios of the redis-pubsub,
// redis-stream and gcp-pubsub transports: a default deployment (concurrency
// 64, constant gate), a 0-ms simulated gateway, real servers.
func transportScenarios() []scenario {
	return []scenario{
		{"redis-pubsub", runRedisPubSub, redisTransportTargets()},
		{"redis-stream", runRedisStream, redisTransportTargets()},
		{"gcp-pubsub", runGCPPubSub, gcpPubSubTargets()},
	}
}

// redisTransportTargets: redis-pubsub and redis-stream have no baseline.
func redisTransportTargets() []target {
	return []target{
		noFailures("failed"),
		reportedOnly("throughput", "the transport's rate at its defaults; no baseline to compare with"),
	}
}

// benchPayload is request i, due in an hour.
func benchPayload(i int, deadline time.Time) []byte {
	return fmt.Appendf(nil, `{"id":"b-%d","created":%d,"deadline":%d,"payload":{"model":"m","prompt":"What is 2+2?","max_tokens":16},"metadata":{"job_id":"bench","request_index":"%d"}}`,
		i, time.Now().Unix(), deadline.Unix(), i)
}

// transportRun is one deployment measured. With produce set, produce is
// called once sluice is ready (a transport that drops what it is not
// subscribed to yet) and the clock starts then; without it the backlog is
// there already and the clock starts when sluice is started, where a
// baseline's starts too. done reports how many results arrived; tally
// counts them by what they say once all are in.
type transportRun struct {
	transport string
	options   string
	redisURL  string
	queue     string
	results   string
	n         int
	produce   func(ctx context.Context) error
	done      func(ctx context.Context) (int64, error)
	tally     func(ctx context.Context) (resultTally, error)
}

func (r transportRun) measure(ctx context.Context) (sample, error) {
	rate, err := r.run(ctx)
	if err != nil {
		return sample{}, err
	}
	t, err := r.tally(ctx)
	if err != nil {
		return sample{}, err
	}
	rate.ok, rate.failed = t.ok, t.failed+max(0, r.n-t.total())
	return rate, nil
}

// run runs the deployment until n results are in; the sample has the time only.
func (r transportRun) run(ctx context.Context) (sample, error) {
	sim, err := simulator.New(simulator.Config{Capacity: 64})
	if err != nil {
		return sample{}, err
	}
	gw, err := sim.Start("127.0.0.1:0")
	if err != nil {
		return sample{}, err
	}
	defer sim.Close()
	tc, err := config.ParseQueues([]byte(r.options), "bench")
	if err != nil {
		return sample{}, err
	}
	tc.Queues = []config.Queue{{Queue: transport.Queue{Name: r.queue}, IGWBaseURL: gw}}
	tc.ResultQueueName = r.results
	cfg := &config.Config{Transport: r.transport, TransportConfig: tc, MetricsPort: -1, HealthPort: -1, RedisURL: r.redisURL}
	a, err := newApp(cfg, app.Options{})
	if err != nil {
		return sample{}, err
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	runErr := make(chan error, 1)
	start := time.Now()
	go func() { runErr <- a.Run(rctx) }()
	if r.produce != nil {
		for !a.Pipeline().Ready() {
			select {
			case err := <-runErr:
				return sample{}, fmt.Errorf("sluice stopped: %w", err)
			case <-time.After(5 * time.Millisecond):
			}
		}
		start = time.Now()
		if err := r.produce(ctx); err != nil {
			return sample{}, fmt.Errorf("produce: %w", err)
		}
	}
	limit := time.After(5 * time.Minute)
	var first time.Duration
	for {
		got, err := r.done(ctx)
		if err != nil {
			return sample{}, err
		}
		if got > 0 && first == 0 {
			first = time.Since(start)
		}
		if got >= int64(r.n) {
			break
		}
		select {
		case err := <-runErr:
			return sample{}, fmt.Errorf("sluice stopped: %v", err)
		case <-limit:
			return sample{}, fmt.Errorf("only %d of %d results after 5m", got, r.n)
		case <-ctx.Done():
			return sample{}, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	elapsed := time.Since(start)
	cancel()
	if err := <-runErr; err != nil {
		return sample{}, err
	}
	return sample{seconds: elapsed.Seconds(), first: first}, nil
}

func redisClient(url string) (*redis.Client, error) {
	o, err := redis.ParseURL(url)
	if err != nil {
		return nil, err
	}
	return redis.NewClient(o), nil
}

// runRedisPubSub: 20k requests PUBLISHed once sluice is subscribed; results LPUSHed to a list.
func runRedisPubSub(ctx context.Context, o options) (figures, error) {
	return redisScenario(ctx, o, func(c redis.UniversalClient, url string, dl time.Time) transportRun {
		return transportRun{transport: redispubsub.Name, options: `{"result_mode":"list"}`, redisURL: url,
			queue: "request-queue", results: "result-list", n: redisScenarioRequests,
			produce: func(ctx context.Context) error {
				for c.PubSubNumSub(ctx, "request-queue").Val()["request-queue"] == 0 {
					time.Sleep(time.Millisecond)
				}
				return pipelined(ctx, c, redisScenarioRequests, func(pipe redis.Pipeliner, j int) {
					pipe.Publish(ctx, "request-queue", benchPayload(j, dl))
				})
			},
			done:  func(ctx context.Context) (int64, error) { return c.LLen(ctx, "result-list").Result() },
			tally: func(ctx context.Context) (resultTally, error) { return tallyLists(ctx, c, "result-list") },
		}
	})
}

// runRedisStream: 20k requests XADDed once sluice reads the stream; results LPUSHed to a list.
func runRedisStream(ctx context.Context, o options) (figures, error) {
	return redisScenario(ctx, o, func(c redis.UniversalClient, url string, dl time.Time) transportRun {
		return transportRun{transport: redisstream.Name, options: `{}`, redisURL: url,
			queue: "requests", results: "results", n: redisScenarioRequests,
			produce: func(ctx context.Context) error {
				return pipelined(ctx, c, redisScenarioRequests, func(pipe redis.Pipeliner, j int) {
					pipe.XAdd(ctx, &redis.XAddArgs{Stream: "requests", Values: []any{"_watermill_message_uuid", strconv.Itoa(j), "payload", benchPayload(j, dl)}})
				})
			},
			done:  func(ctx context.Context) (int64, error) { return c.LLen(ctx, "results").Result() },
			tally: func(ctx context.Context) (resultTally, error) { return tallyLists(ctx, c, "results") },
		}
	})
}

// redisScenarioRequests is how many requests a Redis transport scenario sends.
const redisScenarioRequests = 20_000

// redisScenario starts a redis-server and measures the run that newRun
// describes o.runs times, on an emptied database each time.
func redisScenario(ctx context.Context, o options, newRun func(c redis.UniversalClient, url string, deadline time.Time) transportRun) (figures, error) {
	srv, err := testenv.StartRedisProcess(testenv.RedisOptions{})
	if err != nil {
		return nil, err
	}
	defer srv.Stop()
	c, err := redisClient(srv.URL)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	run := newRun(c, srv.URL, time.Now().Add(time.Hour))
	var ss samples
	for range o.runs {
		if err := c.FlushDB(ctx).Err(); err != nil {
			return nil, err
		}
		s, err := run.measure(ctx)
		if err != nil {
			return nil, err
		}
		ss = append(ss, s)
	}
	return figures{"requests": float64(run.n), "throughput": median(ss.rates()), "failed": ss.failed()}, nil
}

// pipelined sends n commands, 500 per round trip; add queues command j.
func pipelined(ctx context.Context, c redis.UniversalClient, n int, add func(pipe redis.Pipeliner, j int)) error {
	for i := 0; i < n; i += 500 {
		pipe := c.Pipeline()
		for j := i; j < min(i+500, n); j++ {
			add(pipe, j)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return err
		}
	}
	return nil
}
