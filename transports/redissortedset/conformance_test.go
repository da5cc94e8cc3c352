package redissortedset_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/internal/testenv"
	rss "github.com/sluice-io/sluice/transports/redissortedset"
	"github.com/sluice-io/sluice/transports/transporttest"
)

func TestConformance(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	rc := testenv.RedisClient(t, r.URL)
	var seq atomic.Int64
	transporttest.Run(t, transporttest.Harness{
		Features: transporttest.Features{
			Ordering:       transporttest.ByDeadline,
			AtLeastOnce:    true,
			DelayedRequeue: true,
			// not RequeueKeepsPlace: Publish writes plain ZADDs (upstream's
			// v0.9 producer), and members of equal scores sort by their
			// bytes; a request of sluice's producer or with upstream's
			// enqueue sequence keeps its place (TestModelSortedSet, planted
			// bugs retry-loses-order and requeue-loses-order)
			Results:             true,
			Reopen:              true,
			ConcurrentConsumers: true,
		},
		New: func(t testing.TB) transport.Transport {
			tp, err := rss.New(rss.Options{Server: rss.Server{URL: r.URL}, PollIntervalMS: 20}, nil)
			if err != nil {
				t.Fatal(err)
			}
			return tp
		},
		Queue: func(testing.TB) transport.Queue {
			n := seq.Add(1)
			return transport.Queue{ID: fmt.Sprint("q", n), Name: fmt.Sprint("llm-d-async:requests:pool-", n), ResultName: fmt.Sprint("llm-d-async:results:pool-", n, ":$batch")}
		},
		Publish: func(t testing.TB, q transport.Queue, payload []byte) {
			req, err := wire.Decode(payload)
			if err != nil {
				t.Fatal(err)
			}
			score := float64(req.Deadline.UnixMilli()) / 1000
			if err := rc.ZAdd(context.Background(), q.Name, redis.Z{Score: score, Member: payload}).Err(); err != nil {
				t.Fatalf("ZADD %s: %v", q.Name, err)
			}
		},
		Results: func(t testing.TB, q transport.Queue, n int, timeout time.Duration) [][]byte {
			var out [][]byte
			deadline := time.Now().Add(timeout)
			for len(out) < n && time.Now().Before(deadline) {
				v, err := rc.BRPop(context.Background(), time.Second, q.ResultName).Result()
				if err == redis.Nil {
					continue
				}
				if err != nil {
					t.Fatalf("BRPOP: %v", err)
				}
				out = append(out, []byte(v[1]))
			}
			return out
		},
	})
}
