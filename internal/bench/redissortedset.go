package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/app"
	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/internal/simulator"
	"github.com/sluice-io/sluice/internal/testenv"
	rss "github.com/sluice-io/sluice/transports/redissortedset"
	"github.com/sluice-io/sluice/transports/redissortedset/producer"
)

// runRedisSortedSet measures sluice on the redis-sortedset transport with
// default settings (100k requests, 0-ms simulated gateway, real
// redis-server) against a baseline: a minimal loop doing the same Redis and
// HTTP work (batched Lua claim into leases, POST, fenced result write)
// without the framework, with the same concurrency (64).
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
	p, err := producer.Dial(r.URL, producer.Config{})
	if err != nil {
		return nil, err
	}
	defer p.Close()
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
func benchSluiceRedis(ctx context.Context, url, gw string, c *redis.Client, n int) (float64, error) {
	results := rss.ResultQueueName("bench", "")
	cfg := &config.Config{
		Transport: rss.Name,
		TransportConfig: config.TransportConfig{ResultQueueName: results,
			Queues: []config.Queue{{Queue: transport.Queue{Name: rss.RequestQueueName("bench")}, IGWBaseURL: gw}}},
		MetricsPort: -1, HealthPort: -1, RedisURL: url,
	}
	a, err := newApp(cfg, app.Options{})
	if err != nil {
		return 0, err
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- a.Run(rctx) }()
	elapsed, werr := waitResults(ctx, c, results, n, start)
	cancel()
	if err := <-done; err != nil {
		return 0, err
	}
	if werr != nil {
		return 0, werr
	}
	return float64(n) / elapsed.Seconds(), nil
}

func waitResults(ctx context.Context, c *redis.Client, list string, n int, start time.Time) (time.Duration, error) {
	limit := time.After(5 * time.Minute)
	for {
		got, err := c.LLen(ctx, list).Result()
		if err != nil {
			return 0, err
		}
		if got >= int64(n) {
			return time.Since(start), nil
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-limit:
			return 0, fmt.Errorf("only %d of %d results after 5m", got, n)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// Baseline scripts: the least a crash-safe dispatcher must do per request.
var (
	baseClaim = redis.NewScript(`
local t = redis.call('TIME')
local exp = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + 15000
local p = redis.call('ZPOPMIN', KEYS[1], tonumber(ARGV[1]))
local out, h, z = {}, {}, {}
for i = 1, #p, 2 do
  local tok = ARGV[2] .. i
  h[#h + 1] = tok; h[#h + 1] = p[i]
  z[#z + 1] = exp; z[#z + 1] = tok
  out[#out + 1] = tok; out[#out + 1] = p[i]
end
if #p > 0 then
  redis.call('HSET', KEYS[3], unpack(h))
  redis.call('ZADD', KEYS[2], unpack(z))
end
return out
`)
	baseAck = redis.NewScript(`
if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
  redis.call('HDEL', KEYS[2], ARGV[1])
  redis.call('LPUSH', KEYS[3], ARGV[2])
  return 1
end
return 0
`)
)

// benchBaselineRedis is the minimal loop: one claimer fills free slots in
// batches (up to 256 per Lua call), 64 workers POST and write results.
func benchBaselineRedis(ctx context.Context, c *redis.Client, gw string, n int) (float64, error) {
	const workers = 64
	q := rss.RequestQueueName("bench")
	ks := []string{q, q + ":base-leases", q + ":base-leased"}
	results := rss.ResultQueueName("bench", "")
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: workers, MaxConnsPerHost: workers}}
	defer client.CloseIdleConnections()
	type item struct{ tok, member string }
	slots := make(chan struct{}, workers)
	for range workers {
		slots <- struct{}{}
	}
	work := make(chan item, 512)
	var done atomic.Int64
	var firstErr error
	var errOnce sync.Once
	fail := func(err error) { errOnce.Do(func() { firstErr = err }) }
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for it := range work {
				req, err := wire.Decode([]byte(it.member))
				if err != nil {
					fail(err)
					cancel()
					return
				}
				hr, _ := http.NewRequestWithContext(rctx, http.MethodPost, gw+"/v1/completions", bytes.NewReader(req.Payload))
				hr.Header.Set("Content-Type", "application/json")
				resp, err := client.Do(hr)
				if err != nil {
					fail(err)
					cancel()
					return
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				res := wire.Result{ID: req.ID, StatusCode: resp.StatusCode, Payload: string(body), Metadata: req.Metadata}
				if err := baseAck.Run(rctx, c, []string{ks[1], ks[2], results}, it.tok, res.Marshal()).Err(); err != nil {
					fail(err)
					cancel()
					return
				}
				done.Add(1)
				slots <- struct{}{}
			}
		}()
	}
	start := time.Now()
	seq := 0
claim:
	for done.Load() < int64(n) {
		select {
		case <-slots:
		case <-rctx.Done():
			break claim
		case <-time.After(10 * time.Millisecond):
			continue
		}
		free := 1
	more:
		for free < 256 {
			select {
			case <-slots:
				free++
			default:
				break more
			}
		}
		seq++
		got, err := baseClaim.Run(rctx, c, ks, free, "base:"+strconv.Itoa(seq)+":").StringSlice()
		if err != nil {
			fail(err)
			break
		}
		for i := 0; i+1 < len(got); i += 2 {
			work <- item{got[i], got[i+1]}
		}
		for range free - len(got)/2 {
			slots <- struct{}{}
		}
		if len(got) == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	elapsed := time.Since(start)
	close(work)
	wg.Wait()
	if firstErr != nil && !errors.Is(firstErr, context.Canceled) {
		return 0, firstErr
	}
	if got := done.Load(); got < int64(n) {
		return 0, fmt.Errorf("baseline finished %d of %d", got, n)
	}
	return float64(n) / elapsed.Seconds(), nil
}
