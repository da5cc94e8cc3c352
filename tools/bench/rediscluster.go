package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/app"
	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/internal/redisclient"
	"github.com/sluice-io/sluice/internal/simulator"
	"github.com/sluice-io/sluice/internal/testenv"
	rss "github.com/sluice-io/sluice/transports/redissortedset"
	"github.com/sluice-io/sluice/transports/redissortedset/producer"
)

// redisClusterTargets: the single node's bound, at the baseline's
// parallelism; the default concurrency's ratio is reported (with a 0-ms
// gateway it measures the in-flight depth, not the framework).
func redisClusterTargets() []target {
	return []target{
		minimum("ratio", 0.70, "the redis-sortedset bound, on a cluster, sluice at 256 in flight against the plain loop"),
		reportedOnly("ratio_default_concurrency", "at 64 in flight the rate is in-flight depth over Redis round trips"),
		reportedOnly("ratio_cross_slot", "upstream's names (result lists in other hash slots): three round trips per settle batch instead of one"),
		noFailures("failed"),
		noFailures("baseline_failed"),
	}
}

// runRedisCluster measures sluice on the redis-sortedset transport in
// cluster mode: a Redis Cluster of 3 masters with a replica each on
// loopback, three queues (one pool per master, 20,000 requests each), a
// 0-ms simulated gateway. The baseline, in the same run on the same
// cluster, is the plain batched loop of the redis-sortedset scenario
// (redissortedset_baseline.go) run on the three queues at once, with
// baseWorkers goroutines per queue. sluice runs with concurrency
// baseWorkers: 256 requests in flight in all, the workers of its one pool,
// shared by the three queues (throughput, ratio), and at its default
// concurrency (throughput_default_concurrency, ratio_default_concurrency):
// with a 0-ms gateway the rate is the in-flight depth over Redis round
// trips, so the default's 64 measures the limit, not the overhead. The
// order alternates run by run (sluice at 256, sluice at the default, the
// baseline; then the reverse); failed counts every sluice setup.
//
// The cross-slot variant (throughput_cross_slot, ratio_cross_slot) runs
// sluice at 256 in flight on three queues with upstream's names
// (llm-d-async:requests:<pool>, llm-d-async:results:<pool>:$batch: no hash
// tag, so each result list is in another slot than its queue, and the
// results are written by the three-step cross-slot settle), one queue per
// master, against the same baseline; cross_slot_queues counts the queues
// whose list is indeed in another slot.
func runRedisCluster(ctx context.Context, o options) (figures, error) {
	const perQueue = 20_000
	c, stop, err := startBenchCluster()
	if err != nil {
		return nil, err
	}
	defer stop()
	sim, err := simulator.New(simulator.Config{Capacity: 256})
	if err != nil {
		return nil, err
	}
	gw, err := sim.Start("127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	defer sim.Close()
	p, pc, err := benchProducerMode(c.URL, "cluster")
	if err != nil {
		return nil, err
	}
	defer pc.Close()
	pools, err := clusterPools(ctx, c, p.Names(), 3)
	if err != nil {
		return nil, err
	}
	var queues, lists []string
	for _, pool := range pools {
		queues, lists = append(queues, p.Names().RequestQueue(pool)), append(lists, p.Names().ResultQueue(pool, ""))
	}
	xqueue := func(pool string) string { return "llm-d-async:requests:" + pool }
	xis, err := c.SpreadOverMasters(ctx, func(i int) string { return xqueue("benchx-" + strconv.Itoa(i)) })
	if err != nil {
		return nil, err
	}
	var xqueues, xlists []string
	cross := 0
	for _, i := range xis {
		pool := "benchx-" + strconv.Itoa(i)
		xqueues, xlists = append(xqueues, xqueue(pool)), append(xlists, "llm-d-async:results:"+pool+":$batch")
		if redisclient.Slot(xqueues[len(xqueues)-1]) != redisclient.Slot(xlists[len(xlists)-1]) {
			cross++
		}
	}
	fillQueues := func(ctx context.Context, queues []string) error {
		if err := flushAll(ctx, pc); err != nil {
			return err
		}
		dl := time.Now().Add(time.Hour)
		for qi, q := range queues {
			reqs := make([]*wire.Request, perQueue)
			for i := range reqs {
				reqs[i] = &wire.Request{ID: "c" + strconv.Itoa(qi) + "-" + strconv.Itoa(i), Deadline: dl, Created: time.Now(),
					Payload:  json.RawMessage(`{"model":"m","prompt":"What is 2+2?","max_tokens":16}`),
					Metadata: map[string]string{"job_id": "bench"}}
			}
			if err := p.EnqueueMany(ctx, q, reqs); err != nil {
				return err
			}
		}
		return nil
	}
	fill := func(ctx context.Context) error { return fillQueues(ctx, queues) }
	n := perQueue * len(queues)
	var sl, def, base, xs samples
	sluiceAt := func(concurrency int, into *samples, what string) side {
		return func(ctx context.Context, _ int) error {
			if err := fill(ctx); err != nil {
				return err
			}
			s, err := benchSluiceQueues(ctx, c.URL, "cluster", gw, pc, queues, lists, n, concurrency)
			if err != nil {
				return fmt.Errorf("%s: %w", what, err)
			}
			*into = append(*into, s)
			return nil
		}
	}
	err = alternate(ctx, o.runs,
		sluiceAt(baseWorkers, &sl, "sluice"),
		sluiceAt(0, &def, "sluice at default concurrency"),
		func(ctx context.Context, _ int) error {
			if err := fillQueues(ctx, xqueues); err != nil {
				return err
			}
			s, err := benchSluiceQueues(ctx, c.URL, "cluster", gw, pc, xqueues, xlists, perQueue*len(xqueues), baseWorkers)
			if err != nil {
				return fmt.Errorf("sluice cross-slot: %w", err)
			}
			xs = append(xs, s)
			return nil
		},
		func(ctx context.Context, _ int) error {
			if err := fill(ctx); err != nil {
				return err
			}
			s, err := timeRedisSide(ctx, pc, lists, n, func(ctx context.Context) error {
				return benchBaselineCluster(ctx, pc, gw, queues, lists)
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
	f := pairFigures("redis-cluster", sl, base)
	f["requests"], f["masters"], f["concurrency"], f["rss_mb"] = float64(n), float64(c.Masters), baseWorkers, rssMB()
	f["throughput_default_concurrency"] = median(def.rates())
	f["ratio_default_concurrency"] = medianRatio(def.rates(), base.rates())
	f["throughput_cross_slot"] = median(xs.rates())
	f["ratio_cross_slot"] = medianRatio(xs.rates(), base.rates())
	f["cross_slot_queues"] = float64(cross)
	f["failed"] += def.failed() + xs.failed()
	return f, nil
}

// benchSluiceQueues runs one sluice deployment on queues (each answered to
// the list of the same index) in Redis mode mode, with concurrency workers
// (0: the default) shared by the queues, until n results are written
// (timeRedisSide).
func benchSluiceQueues(ctx context.Context, url, mode, gw string, c redis.UniversalClient, queues, lists []string, n, concurrency int) (sample, error) {
	qs := make([]config.Queue, len(queues))
	for i, q := range queues {
		qs[i] = config.Queue{Queue: transport.Queue{Name: q, ResultName: lists[i]}, IGWBaseURL: gw}
	}
	cfg := &config.Config{
		Transport:       rss.Name,
		TransportConfig: config.TransportConfig{ResultQueueName: lists[0], Queues: qs},
		MetricsPort:     -1, HealthPort: -1, RedisURL: url, RedisMode: mode, Concurrency: concurrency,
	}
	a, err := newApp(cfg, app.Options{})
	if err != nil {
		return sample{}, err
	}
	return timeRedisSide(ctx, c, lists, n, a.Run)
}

// benchBaselineCluster runs the plain loop on every queue at once, each
// with the single-node scenario's shape, until they are drained.
func benchBaselineCluster(ctx context.Context, c redis.UniversalClient, gw string, queues, lists []string) error {
	var wg sync.WaitGroup
	errs := make([]error, len(queues))
	for i := range queues {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = benchBaselineRedisQueue(ctx, c, gw, queues[i], lists[i], baseWorkers, baseBatch)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// waitResultsIn waits until the lists hold n results in all and returns
// the time since start. stopped (nil: not watched) is closed when the
// measured side ends (a side that drained its queue, or failed): the count
// must then reach n by the next poll.
func waitResultsIn(ctx context.Context, c redis.UniversalClient, lists []string, n int, start time.Time, stopped <-chan struct{}) (time.Duration, error) {
	el, _, err := waitFirstAndAll(ctx, c, lists, n, start, stopped)
	return el, err
}

// waitFirstAndAll is waitResultsIn that also returns the time to the first
// result seen.
func waitFirstAndAll(ctx context.Context, c redis.UniversalClient, lists []string, n int, start time.Time, stopped <-chan struct{}) (all, first time.Duration, err error) {
	limit := time.After(5 * time.Minute)
	ended := false
	for {
		got := int64(0)
		for _, l := range lists {
			v, err := c.LLen(ctx, l).Result()
			if err != nil {
				return 0, 0, err
			}
			got += v
		}
		if got > 0 && first == 0 {
			first = time.Since(start)
		}
		if got >= int64(n) {
			return time.Since(start), first, nil
		}
		if ended {
			return 0, 0, fmt.Errorf("stopped with %d of %d results", got, n)
		}
		select {
		case <-ctx.Done():
			return 0, 0, ctx.Err()
		case <-limit:
			return 0, 0, fmt.Errorf("only %d of %d results after 5m", got, n)
		case <-stopped:
			ended = true
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// startBenchCluster starts a Redis Cluster of 3 masters with a replica
// each; stop stops it and removes its files.
func startBenchCluster() (c *testenv.RedisCluster, stop func(), err error) {
	dir, err := os.MkdirTemp("", "sluice-bench-cluster-")
	if err != nil {
		return nil, nil, err
	}
	c, err = testenv.StartRedisClusterProcesses(testenv.RedisClusterOptions{}, dir)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, nil, err
	}
	return c, func() { c.Stop(); _ = os.RemoveAll(dir) }, nil
}

// clusterPools returns n pool names whose queues are on n different masters.
func clusterPools(ctx context.Context, c *testenv.RedisCluster, names producer.Names, n int) ([]string, error) {
	pool := func(i int) string { return "bench-" + strconv.Itoa(i) }
	is, err := c.SpreadOverMasters(ctx, func(i int) string { return names.RequestQueue(pool(i)) })
	if err != nil {
		return nil, err
	}
	if len(is) < n {
		return nil, fmt.Errorf("%d masters, want %d", len(is), n)
	}
	out := make([]string, n)
	for m := range out {
		out[m] = pool(is[m])
	}
	return out, nil
}

// flushAll empties every database of c (every master of a cluster).
func flushAll(ctx context.Context, c redis.UniversalClient) error {
	if cc, ok := c.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error { return m.FlushDB(ctx).Err() })
	}
	return c.FlushDB(ctx).Err()
}
