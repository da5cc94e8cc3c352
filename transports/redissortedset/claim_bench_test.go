package redissortedset_test

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/internal/testenv"
	rss "github.com/sluice-io/sluice/transports/redissortedset"
	"github.com/sluice-io/sluice/transports/redissortedset/producer"
)

// BenchmarkClaimSettle measures the transport's share of one request
// against a real redis-server: claims of up to 64, then each claimed
// request's result published from its own goroutine (as the core's
// handlers do) and its delivery settled. One op is one request; it reports
// Redis commands (script calls) per request beside allocations.
//
// The "envelope" case writes upstream's form (producer Config.Envelope):
// the claim then reads each member's claim id with cjson, and every result
// carries the request token and cleans upstream's request keys.
func BenchmarkClaimSettle(b *testing.B) {
	b.Run("flat", func(b *testing.B) { benchClaimSettle(b, producer.Config{}) })
	b.Run("envelope", func(b *testing.B) {
		benchClaimSettle(b, producer.Config{Envelope: true, ResultQueueName: rss.ResultQueueName("bench", "")})
	})
}

func benchClaimSettle(b *testing.B, cfg producer.Config) {
	r := testenv.StartRedis(b, testenv.RedisOptions{})
	c := testenv.RedisClient(b, r.URL)
	p, err := producer.Dial(r.URL, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	q := rss.RequestQueueName("bench")
	results := rss.ResultQueueName("bench", "")
	reqs := make([]*wire.Request, b.N)
	for i := range reqs {
		reqs[i] = &wire.Request{ID: "b-" + strconv.Itoa(i), Deadline: time.Now().Add(time.Hour),
			Payload: json.RawMessage(`{"model":"m","prompt":"What is 2+2?","max_tokens":16}`)}
	}
	if err := p.EnqueueMany(ctx, q, reqs); err != nil {
		b.Fatal(err)
	}
	tp, err := rss.New(rss.Options{Server: rss.Server{URL: r.URL}}, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = tp.Close() })
	src, sctx := openSource(b, tp, q, results)
	pub, err := tp.Publisher(transport.Queue{Name: q, ResultName: results})
	if err != nil {
		b.Fatal(err)
	}
	if err := c.ConfigResetStat(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	result := []byte(`{"id":"x","payload":"{\"choices\":[{\"text\":\"4\"}]}","status_code":200}`)
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	for done := 0; done < b.N; {
		ms, err := src.Claim(sctx, min(64, b.N-done))
		if err != nil {
			b.Fatal(err)
		}
		done += len(ms)
		for _, m := range ms {
			wg.Add(1)
			go func(m *message.Message) {
				defer wg.Done()
				out := message.NewMessage(m.UUID, result)
				out.Metadata = m.Metadata
				if err := pub.Publish(results, out); err != nil {
					b.Error(err)
				}
				src.Settle(m, true)
			}(m)
		}
		wg.Wait()
	}
	b.StopTimer()
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var calls, usec float64
	for _, line := range strings.Split(info, "\n") {
		if strings.HasPrefix(line, "cmdstat_evalsha:") || strings.HasPrefix(line, "cmdstat_eval:") {
			f := strings.SplitN(strings.SplitN(line, "calls=", 2)[1], ",", 2)[0]
			n, _ := strconv.ParseFloat(f, 64)
			calls += n
			u := strings.SplitN(strings.SplitN(line, "usec=", 2)[1], ",", 2)[0]
			us, _ := strconv.ParseFloat(u, 64)
			usec += us
		}
	}
	b.ReportMetric(calls/float64(b.N), "scripts/req")
	// Redis' own time in the scripts: less noisy than the wall time on a
	// shared machine.
	b.ReportMetric(usec/float64(b.N), "redis-µs/req")
}
