package main

import (
	"context"
	"encoding/json"
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

// runRedisSortedSet measures sluice on the redis-sortedset transport with
// default settings (100k requests, 0-ms simulated gateway, real
// redis-server) against a baseline measured in the same run: the plain
// batched loop of redissortedset_baseline.go doing the same Redis and HTTP
// work (batched Lua claim into leases, POST, fenced result writes in
// batches) without the framework. Both start from the same full queue,
// written by the producer library; runs alternate between the two.
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
	var sluiceRate, baseRate []float64
	for range o.runs {
		if err := p.Client().FlushDB(ctx).Err(); err != nil {
			return nil, err
		}
		if err := p.EnqueueMany(ctx, rss.RequestQueueName("bench"), reqs); err != nil {
			return nil, err
		}
		rate, err := benchSluiceRedis(ctx, r.URL, gw, p.Client(), n)
		if err != nil {
			return nil, fmt.Errorf("sluice: %w", err)
		}
		sluiceRate = append(sluiceRate, rate)

		if err := p.Client().FlushDB(ctx).Err(); err != nil {
			return nil, err
		}
		if err := p.EnqueueMany(ctx, rss.RequestQueueName("bench"), reqs); err != nil {
			return nil, err
		}
		rate, err = benchBaselineRedis(ctx, p.Client(), gw, n)
		if err != nil {
			return nil, fmt.Errorf("baseline: %w", err)
		}
		baseRate = append(baseRate, rate)
	}
	t, b := median(sluiceRate), median(baseRate)
	return figures{"requests": n, "throughput": t, "baseline": b, "ratio": t / b, "rss_mb": rssMB()}, nil
}

// benchSluiceRedis runs a default sluice deployment until n results are in
// the result list and returns requests per second.
func benchSluiceRedis(ctx context.Context, url, gw string, c redis.UniversalClient, n int) (float64, error) {
	return benchSluiceQueues(ctx, url, "", gw, c, []string{rss.RequestQueueName("bench")}, []string{rss.ResultQueueName("bench", "")}, n, 0)
}

func waitResults(ctx context.Context, c redis.UniversalClient, list string, n int, start time.Time) (time.Duration, error) {
	return waitResultsIn(ctx, c, []string{list}, n, start)
}

// benchProducer is the producer library on a client whose timeouts allow a
// large pipelined enqueue on a busy machine (the default 3 s does not
// always); close the client when done.
func benchProducer(url string) (*producer.Producer, redis.UniversalClient, error) {
	return benchProducerMode(url, "")
}

// benchProducerMode is benchProducer in a Redis mode (single or cluster).
func benchProducerMode(url, mode string) (*producer.Producer, redis.UniversalClient, error) {
	ro, err := rss.RedisOptions(url, rss.Options{Mode: mode})
	if err != nil {
		return nil, nil, err
	}
	ro.Tune(func(c *redisclient.Common) { c.ReadTimeout, c.WriteTimeout = time.Minute, time.Minute })
	c := ro.New()
	return producer.New(c, producer.Config{}), c, nil
}
