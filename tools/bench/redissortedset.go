package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/internal/redisclient"
	"github.com/sluice-io/sluice/internal/simulator"
	"github.com/sluice-io/sluice/internal/testenv"
	rss "github.com/sluice-io/sluice/transports/redissortedset"
	"github.com/sluice-io/sluice/transports/redissortedset/producer"
)

// redisSortedSetTargets: the bound on what the framework may cost
// against the plain loop, and no failed call on either side.
func redisSortedSetTargets() []target {
	return []target{
		minimum("ratio", 0.70, "sluice at its defaults against the plain batched loop doing the same crash-safe work"),
		noFailures("failed"),
		noFailures("baseline_failed"),
	}
}

// runRedisSortedSet measures sluice on the redis-sortedset transport with
// default settings (100k requests, 0-ms simulated gateway, real
// redis-server) against a baseline measured in the same run: the plain
// batched loop of redissortedset_baseline.go doing the same Redis and HTTP
// work (batched Lua claim into leases, POST, fenced result writes in
// batches) without the framework. Both start from the same full queue,
// written by the producer library; the order alternates run by run, and
// both are timed the same way (timeRedisSide).
func runRedisSortedSet(ctx context.Context, o options) (figures, error) {
	const n = 100_000
	r, err := testenv.StartRedisProcess(testenv.RedisOptions{})
	if err != nil {
		return nil, err
	}
	defer r.Stop()
	sim, err := simulator.New(simulator.Config{Capacity: 64})
	if err != nil {
		return nil, err
	}
	gw, err := sim.Start("127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	defer sim.Close()
	p, pc, err := benchProducer(r.URL)
	if err != nil {
		return nil, err
	}
	defer pc.Close()
	reqs := make([]*wire.Request, n)
	dl := time.Now().Add(time.Hour)
	for i := range reqs {
		reqs[i] = &wire.Request{ID: "b-" + strconv.Itoa(i), Deadline: dl, Created: time.Now(),
			Payload:  json.RawMessage(`{"model":"m","prompt":"What is 2+2?","max_tokens":16}`),
			Metadata: map[string]string{"job_id": "bench", "request_index": strconv.Itoa(i)}}
	}
	fill := func(ctx context.Context) error {
		if err := p.Client().FlushDB(ctx).Err(); err != nil {
			return err
		}
		return p.EnqueueMany(ctx, rss.RequestQueueName("bench"), reqs)
	}
	lists := []string{rss.ResultQueueName("bench", "")}
	var sl, base samples
	err = alternate(ctx, o.runs,
		func(ctx context.Context, _ int) error {
			if err := fill(ctx); err != nil {
				return err
			}
			s, err := benchSluiceRedis(ctx, r.URL, gw, p.Client(), n)
			if err != nil {
				return fmt.Errorf("sluice: %w", err)
			}
			sl = append(sl, s)
			return nil
		},
		func(ctx context.Context, _ int) error {
			if err := fill(ctx); err != nil {
				return err
			}
			s, err := timeRedisSide(ctx, p.Client(), lists, n, func(ctx context.Context) error {
				return benchBaselineRedis(ctx, p.Client(), gw)
			})
			if err != nil {
				return fmt.Errorf("baseline: %w", err)
			}
			base = append(base, s)
			return nil
		})
	if err != nil {
		return nil, err
	}
	f := pairFigures("redis-sortedset", sl, base)
	f["requests"], f["rss_mb"] = n, rssMB()
	return f, nil
}

// benchSluiceRedis runs a default sluice deployment until n results are in
// the result list.
func benchSluiceRedis(ctx context.Context, url, gw string, c redis.UniversalClient, n int) (sample, error) {
	return benchSluiceQueues(ctx, url, "", gw, c, []string{rss.RequestQueueName("bench")}, []string{rss.ResultQueueName("bench", "")}, n, 0)
}

// timeRedisSide times one side over a full queue: the clock starts just
// before launch (which runs the side until ctx ends, or until it is done)
// and stops when the lists hold n results in all, polled the same way
// whichever side runs. The results are then read and counted (resultTally):
// the sample's ok results are the throughput, the rest (and any missing)
// failed.
func timeRedisSide(ctx context.Context, c redis.UniversalClient, lists []string, n int, launch func(ctx context.Context) error) (sample, error) {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var sideErr error
	stopped := make(chan struct{})
	start := time.Now()
	go func() { sideErr = launch(rctx); close(stopped) }()
	el, first, werr := waitFirstAndAll(ctx, c, lists, n, start, stopped)
	cancel()
	<-stopped
	if sideErr != nil && !errors.Is(sideErr, context.Canceled) {
		return sample{}, sideErr
	}
	if werr != nil {
		return sample{}, werr
	}
	t, err := tallyLists(ctx, c, lists...)
	if err != nil {
		return sample{}, err
	}
	return sample{ok: t.ok, failed: t.failed + max(0, n-t.total()), seconds: el.Seconds(), first: first}, nil
}

func waitResults(ctx context.Context, c redis.UniversalClient, list string, n int, start time.Time) (time.Duration, error) {
	return waitResultsIn(ctx, c, []string{list}, n, start, nil)
}

// benchProducer is the producer library on a client whose timeouts allow a
// large pipelined enqueue on a busy machine (the default 3 s does not
// always); close the client when done.
func benchProducer(url string) (*producer.Producer, redis.UniversalClient, error) {
	return benchProducerMode(url, "")
}

// benchProducerMode is benchProducer in a Redis mode (single or cluster).
func benchProducerMode(url, mode string) (*producer.Producer, redis.UniversalClient, error) {
	ro, err := rss.RedisOptions(url, rss.Options{TopologyOptions: rss.TopologyOptions{Mode: mode}})
	if err != nil {
		return nil, nil, err
	}
	ro.Tune(func(c *redisclient.Common) { c.ReadTimeout, c.WriteTimeout = time.Minute, time.Minute })
	c := ro.New()
	return producer.New(c, producer.Config{}), c, nil
}
