package redissortedset_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/internal/simulator"
	"github.com/sluice-io/sluice/internal/testenv"
	rss "github.com/sluice-io/sluice/transports/redissortedset"
	"github.com/sluice-io/sluice/transports/redissortedset/producer"
)

// TestCluster runs the transport on a Redis Cluster of 3 masters with two
// replicas each: queues spread over the masters, a job cancelled across
// them, a result list in another slot settled across slots (with crashes
// between the steps), and, last (it leaves one
// master without a replica), a master killed mid-run.
func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 6-node Redis Cluster")
	}
	// Two replicas per master: after the failover the promoted master still
	// has one, so min_replicas_acked 1 can still be met.
	c := testenv.StartRedisCluster(t, testenv.RedisClusterOptions{Replicas: 2})
	p, err := producer.Dial(c.URL, producer.Config{TopologyOptions: rss.TopologyOptions{Mode: "cluster"}, MinReplicasAcked: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	f := newSimFixture(t, simulator.Config{Latency: simulator.Fixed(50 * time.Millisecond)})
	f.prod = p
	f.redisURL, f.redisMode = c.URL, "cluster"
	if path := os.Getenv("SLUICE_TEST_LOG"); path != "" {
		lf, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = lf.Close() })
		f.log = slog.New(slog.NewTextHandler(lf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	pools := poolsOnDistinctMasters(t, c, p.Names(), 3)

	t.Run("SlotMismatch", func(t *testing.T) {
		tp := f.transport(rss.Options{Server: rss.Server{URL: c.URL}, TopologyOptions: rss.TopologyOptions{Mode: "cluster"}})
		defer tp.Close()
		if _, err := tp.Source(transport.Queue{Name: p.Names().RequestQueue(pools[0]), ResultName: "llm-d-async:results:other:$batch"}); err != nil {
			t.Fatalf("a result list in another slot (the cross-slot settle): %v", err)
		}
		if err := p.Enqueue(context.Background(), "plain}brace", request("x", "", time.Minute, nil)); err == nil || !strings.Contains(err.Error(), "hash tag") {
			t.Fatalf("a queue name with a lone brace: %v, want an error naming hash tags", err)
		}
	})

	t.Run("CancelJobAcrossMasters", func(t *testing.T) {
		ctx := context.Background()
		const job = "doomed"
		var queues []string
		for i, pool := range pools[:2] {
			q := p.Names().RequestQueue(pool + "-cancel")
			queues = append(queues, q)
			if err := p.EnqueueMany(ctx, q, []*wire.Request{
				request(fmt.Sprint("c", i, "-a"), job, time.Hour, nil), request(fmt.Sprint("c", i, "-b"), job, time.Hour, nil)}); err != nil {
				t.Fatal(err)
			}
		}
		n, err := p.CancelJob(ctx, job)
		if err != nil {
			t.Fatal(err)
		}
		if n != 4 {
			t.Fatalf("CancelJob moved %d waiting requests to the front, want 4", n)
		}
		for _, q := range queues {
			z, err := p.Client().ZRangeWithScores(ctx, q, 0, -1).Result()
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range z {
				if m.Score != 0 {
					t.Errorf("%s: a cancelled request still has score %v", q, m.Score)
				}
			}
			if n, _ := p.Client().Exists(ctx, p.Names().Queue(q).JobPrefix+job).Result(); n != 0 {
				t.Errorf("%s: the job index outlived the cancellation", q)
			}
		}
		tp := f.transport(rss.Options{Server: rss.Server{URL: c.URL}, TopologyOptions: rss.TopologyOptions{Mode: "cluster"}, PollIntervalMS: 50})
		stop := f.runAppQueues(tp, queues, func(q string) string { return strings.Replace(q, ":requests:", ":results:", 1) + ":$batch" }, 4)
		for _, q := range queues {
			got := f.collect(strings.Replace(q, ":requests:", ":results:", 1)+":$batch", 2, 20*time.Second)
			for id, r := range got {
				if r.ErrorCode != wire.CodeCancelled {
					t.Errorf("%s: %s answered %s, want CANCELLED", q, id, r.ErrorCode)
				}
			}
		}
		stop()
	})

	t.Run("CrossSlotDrain", func(t *testing.T) { crossSlotDrain(t, f, c) })
	t.Run("CrossSlotCrash", func(t *testing.T) { crossSlotCrash(t, f, c) })
	t.Run("SameSlotOneScript", func(t *testing.T) { sameSlotOneScript(t, f, c) })

	t.Run("MasterKilledMidRun", func(t *testing.T) {
		clusterFailover(t, f, c, pools)
	})
}

// clusterFailover: two sluice replicas drain three queues (one per master)
// while a reader takes the results as they come, all with
// min_replicas_acked 1. After a third of the results, the replicas of the
// first queue's master are frozen and cut off (replication stalls, as
// under a network partition), writes go on for 300 ms, the master is
// killed and the replicas resume; one of them is promoted. Every request must reach the reader
// exactly once: what the master acknowledged in those 300 ms without a
// replica holding it is what a failover loses.
func clusterFailover(t *testing.T, f *fixture, c *testenv.RedisCluster, pools []string) {
	ctx := context.Background()
	const perQueue = 1000
	names := f.prod.Names()
	var queues, lists []string
	for _, pool := range pools {
		q := names.RequestQueue(pool)
		queues, lists = append(queues, q), append(lists, names.ResultQueue(pool, ""))
		reqs := make([]*wire.Request, perQueue)
		for i := range reqs {
			reqs[i] = request(fmt.Sprintf("%s-%04d", pool, i), "", 3*time.Minute, nil)
		}
		if err := f.prod.EnqueueMany(ctx, q, reqs); err != nil {
			t.Fatal(err)
		}
	}
	total := perQueue * len(pools)
	resultOf := func(q string) string { return lists[indexOf(queues, q)] }
	for range 2 {
		tp, err := rss.New(rss.Options{Server: rss.Server{URL: c.URL}, TopologyOptions: rss.TopologyOptions{Mode: "cluster"}, MinReplicasAcked: 1, LeaseMS: 4000, PollIntervalMS: 50}, f.log)
		if err != nil {
			t.Fatal(err)
		}
		f.runAppQueues(tp, queues, resultOf, 16)
	}
	rd := newClusterReader(f.prod, lists)
	defer rd.stop()
	deadline := time.Now().Add(60 * time.Second)
	for rd.distinct() < total/3 {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d results before the kill", rd.distinct(), total)
		}
		time.Sleep(10 * time.Millisecond)
	}
	victim, err := c.MasterOf(ctx, queues[0])
	if err != nil || victim < 0 {
		t.Fatalf("master of %s: %d, %v", queues[0], victim, err)
	}
	reps, err := c.ReplicasOf(ctx, victim)
	if err != nil || len(reps) == 0 {
		t.Fatalf("replicas of %s: %v, %v", c.Nodes[victim].Addr, reps, err)
	}
	for _, r := range reps {
		if err := c.Nodes[r].Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
	}
	// Cut the replication links too (a frozen replica would still find what
	// the master had sent in its socket buffer): what the master writes
	// from now on reaches no replica.
	mc := redis.NewClient(&redis.Options{Addr: c.Nodes[victim].Addr})
	err = mc.Do(ctx, "CLIENT", "KILL", "TYPE", "replica").Err()
	_ = mc.Close()
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	before := rd.distinct()
	c.Nodes[victim].Stop() // SIGKILL
	for _, r := range reps {
		if err := c.Nodes[r].Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
	}
	killed := time.Now()
	t.Logf("froze %d replica(s), then killed master %s of %s with %d/%d results read", len(reps), c.Nodes[victim].Addr, queues[0], before, total)
	deadline = time.Now().Add(90 * time.Second)
	for rd.distinct() < total {
		if time.Now().After(deadline) {
			for i, q := range queues {
				d, err := rss.QueueDepth(ctx, f.prod.Client(), names, q)
				t.Logf("%s: depth %+v %v; results list %s", q, d, err, lists[i])
			}
			t.Fatalf("%d of %d results 90 s after the kill", rd.distinct(), total)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("all %d results %s after the kill", total, time.Since(killed).Round(time.Millisecond))
	time.Sleep(6 * time.Second) // a late duplicate (an expired lease run again) would be read by now
	rd.stop()
	lost, dup := 0, 0
	for _, pool := range pools {
		for i := range perQueue {
			switch n := rd.seen[fmt.Sprintf("%s-%04d", pool, i)]; {
			case n == 0:
				lost++
			case n > 1:
				dup += n - 1
			}
		}
	}
	t.Logf("requests=%d lost=%d duplicated=%d (errors answered: %d)", total, lost, dup, rd.failed)
	if lost != 0 || dup != 0 || rd.failed != 0 {
		t.Errorf("with min_replicas_acked 1: %d lost, %d duplicated, %d error results; want none", lost, dup, rd.failed)
	}
}

// clusterReader reads result lists as a batch processor does (lease, then
// ack), through failovers, counting the results it is handed per id.
type clusterReader struct {
	mu     sync.Mutex
	seen   map[string]int
	failed int
	done   chan struct{}
	wg     sync.WaitGroup
	once   sync.Once
}

func newClusterReader(p *producer.Producer, lists []string) *clusterReader {
	rd := &clusterReader{seen: map[string]int{}, done: make(chan struct{})}
	for _, l := range lists {
		r := p.Results(l, producer.ReaderOptions{Lease: 3 * time.Second, Batch: 200, PollInterval: 20 * time.Millisecond})
		rd.wg.Add(1)
		go func() {
			defer rd.wg.Done()
			for {
				select {
				case <-rd.done:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				ls, err := r.TryNext(ctx)
				cancel()
				if err != nil || len(ls) == 0 {
					time.Sleep(20 * time.Millisecond) // empty, or failing over
					continue
				}
				rd.mu.Lock()
				for _, l := range ls {
					if l.Err == nil {
						rd.seen[l.Result.ID]++
						if l.Result.ErrorCode != "" {
							rd.failed++
						}
					}
				}
				rd.mu.Unlock()
				for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					err := r.Ack(ctx, ls...)
					cancel()
					if err == nil {
						break
					}
				}
			}
		}()
	}
	return rd
}

func (rd *clusterReader) distinct() int {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	return len(rd.seen)
}

func (rd *clusterReader) stop() {
	rd.once.Do(func() { close(rd.done) })
	rd.wg.Wait()
}

// poolsOnDistinctMasters returns n pool names whose request queues are
// served by n different masters.
func poolsOnDistinctMasters(t *testing.T, c *testenv.RedisCluster, names producer.Names, n int) []string {
	t.Helper()
	pool := func(i int) string { return fmt.Sprint("pool-", i) }
	is, err := c.SpreadOverMasters(context.Background(), func(i int) string { return names.RequestQueue(pool(i)) })
	if err != nil || len(is) < n {
		t.Fatalf("pools on %d masters: %v, %v", n, is, err)
	}
	out := make([]string, n)
	for m := range out {
		out[m] = pool(is[m])
	}
	return out
}

func indexOf(xs []string, x string) int {
	for i, v := range xs {
		if v == x {
			return i
		}
	}
	return -1
}
