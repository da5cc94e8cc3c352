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
	"github.com/sluice-io/sluice/internal/redisclient"
	"github.com/sluice-io/sluice/internal/simulator"
	"github.com/sluice-io/sluice/internal/testenv"
	rss "github.com/sluice-io/sluice/transports/redissortedset"
	"github.com/sluice-io/sluice/transports/redissortedset/producer"
	"github.com/sluice-io/sluice/transports/transporttest"
)

// TestSentinel runs the transport in sentinel mode (upstream's mode
// sentinel, addrs, master_name) against a real master, its replica and
// three redis-sentinel processes: the conformance suite, then a failover
// in the middle of a drain.
func TestSentinel(t *testing.T) {
	s := testenv.StartRedisSentinel(t)
	opts := rss.Options{Server: rss.Server{URL: s.URL}, TopologyOptions: rss.TopologyOptions{Mode: "sentinel", Addrs: s.Sentinels[1:], MasterName: s.MasterName}}

	t.Run("Conformance", func(t *testing.T) {
		ro, err := rss.RedisOptions(s.URL, opts)
		if err != nil {
			t.Fatal(err)
		}
		if ro.Mode() != redisclient.Sentinel {
			t.Fatalf("mode %s, want sentinel", ro.Mode())
		}
		rc := ro.New()
		t.Cleanup(func() { _ = rc.Close() })
		var seq atomic.Int64
		transporttest.Run(t, transporttest.Harness{
			Features: transporttest.Features{
				Ordering: transporttest.ByDeadline, AtLeastOnce: true, DelayedRequeue: true,
				Results: true, Reopen: true, ConcurrentConsumers: true,
			},
			New: func(t testing.TB) transport.Transport {
				o := opts
				o.PollIntervalMS = 20
				tp, err := rss.New(o, nil)
				if err != nil {
					t.Fatal(err)
				}
				return tp
			},
			Queue: func(testing.TB) transport.Queue {
				n := seq.Add(1)
				return transport.Queue{ID: fmt.Sprint("q", n), Name: fmt.Sprint("llm-d-async:requests:sentinel-", n),
					ResultName: fmt.Sprint("llm-d-async:results:sentinel-", n, ":$batch")}
			},
			Publish: func(t testing.TB, q transport.Queue, payload []byte) {
				req, err := wire.Decode(payload)
				if err != nil {
					t.Fatal(err)
				}
				if err := rc.ZAdd(context.Background(), q.Name, redis.Z{Score: float64(req.Deadline.UnixMilli()) / 1000, Member: payload}).Err(); err != nil {
					t.Fatalf("ZADD %s: %v", q.Name, err)
				}
			},
			Results: func(t testing.TB, q transport.Queue, n int, timeout time.Duration) [][]byte {
				var out [][]byte
				for deadline := time.Now().Add(timeout); len(out) < n && time.Now().Before(deadline); {
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
	})

	t.Run("FailoverMidRun", func(t *testing.T) { sentinelFailover(t, s, opts) })
}

// sentinelFailover: N requests are enqueued (each confirmed by the replica,
// min_replicas_acked 1), one sluice drains them against the gateway
// simulator while a reader takes the results as a batch processor does
// (lease, then ack), all through the sentinels with min_replicas_acked 1.
// After a third of the results the sentinels promote the replica. Every
// request must reach the reader exactly once.
//
// Why none is lost and none doubled: a write the old master acknowledged
// after the promotion and before it was turned into a replica is lost (the
// harness turns it at once; Redis replication is asynchronous). Such a
// write is a claim (the request is then still waiting on the new master and
// is claimed again), a result with its fenced ack (WAIT finds no replica;
// the claim on the new master expires after lease_ms and the request runs
// again), or a reader's lease or ack (the reader's WAIT fails, so it counts
// nothing and asks again on the new master). What can repeat is a call to
// the gateway, never a result the reader is handed.
func sentinelFailover(t *testing.T, s *testenv.RedisSentinel, opts rss.Options) {
	ctx := context.Background()
	const n = 600
	p, err := producer.Dial(s.URL, producer.Config{TopologyOptions: opts.TopologyOptions, MinReplicasAcked: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	f := newSimFixture(t, simulator.Config{Latency: simulator.Fixed(40 * time.Millisecond)})
	f.prod = p
	f.redisURL = s.URL
	const pool = "sentinel-failover"
	q, list := p.Names().RequestQueue(pool), p.Names().ResultQueue(pool, "")
	reqs := make([]*wire.Request, n)
	for i := range reqs {
		reqs[i] = request(fmt.Sprintf("r-%04d", i), "", 3*time.Minute, nil)
	}
	if err := p.EnqueueMany(ctx, q, reqs); err != nil {
		t.Fatal(err)
	}
	o := opts
	o.MinReplicasAcked, o.LeaseMS, o.PollIntervalMS = 1, 2000, 50
	tp, err := rss.New(o, f.log)
	if err != nil {
		t.Fatal(err)
	}
	f.runAppQueues(tp, []string{q}, func(string) string { return list }, 8)
	rd := newClusterReader(p, []string{list})
	defer rd.stop()
	deadline := time.Now().Add(60 * time.Second)
	for rd.distinct() < n/3 {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d results before the failover", rd.distinct(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	before := rd.distinct()
	start := time.Now()
	now, err := s.Failover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("failover to %s with %d/%d results read took %s", now, before, n, time.Since(start).Round(time.Millisecond))
	deadline = time.Now().Add(60 * time.Second)
	for rd.distinct() < n {
		if time.Now().After(deadline) {
			d, err := rss.QueueDepth(ctx, p.Client(), p.Names(), q)
			t.Fatalf("%d of %d results 60 s after the failover; depth %+v %v", rd.distinct(), n, d, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("all %d results %s after the failover", n, time.Since(start).Round(time.Millisecond))
	// A late duplicate (a claim lost with the old master that expires and
	// runs again) would be read within one lease and reclaim interval.
	time.Sleep(3 * time.Second)
	rd.stop()
	lost, dup := 0, 0
	for i := range n {
		switch c := rd.seen[fmt.Sprintf("r-%04d", i)]; {
		case c == 0:
			lost++
		case c > 1:
			dup += c - 1
		}
	}
	// Calls to the gateway beyond n are requests run twice (a claim or a
	// result lost with the old master): allowed, and told.
	t.Logf("requests=%d lost=%d duplicated=%d (errors answered: %d); gateway calls %d", n, lost, dup, rd.failed, f.server.Stats().Requests)
	if lost != 0 || dup != 0 || rd.failed != 0 {
		t.Errorf("through a sentinel failover with min_replicas_acked 1: %d lost, %d duplicated, %d error results; want none", lost, dup, rd.failed)
	}
}
