package main

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/internal/testenv"
	rss "github.com/sluice-io/sluice/transports/redissortedset"
	"github.com/sluice-io/sluice/transports/redissortedset/producer"
)

// ---- redis-sortedset on a Redis Cluster ----

// clusterSet is redis-sortedset with redis_mode cluster on a Redis Cluster
// of 3 masters with 2 replicas each, min_replicas_acked 1, results read as a
// batch processor reads them (the producer library's reader: leased and
// acked, both confirmed by a replica), so a failover shows what a consumer
// would see.
type clusterSet struct {
	c              *testenv.RedisCluster
	p              *producer.Producer
	queue, results string
	inner          *sortedSet // send, for the producer path
}

func openSortedSetCluster(ctx context.Context, r *rig, _ brokerTweak) (broker, error) {
	dir := filepath.Join(r.dir, "redis-cluster")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	c, err := testenv.StartRedisClusterProcesses(testenv.RedisClusterOptions{Replicas: 2}, dir)
	if err != nil {
		return nil, err
	}
	r.onClose(c.Stop)
	p, err := producer.Dial(c.URL, producer.Config{TopologyOptions: rss.TopologyOptions{Mode: "cluster"}, MinReplicasAcked: 1})
	if err != nil {
		return nil, err
	}
	q, res := p.Names().RequestQueue("chaos"), p.Names().ResultQueue("chaos", "")
	return &clusterSet{c: c, p: p, queue: q, results: res,
		inner: &sortedSet{url: c.URL, queue: q, results: res, c: p.Client(), p: p}}, nil
}

func (s *clusterSet) deployment(gw string) (string, map[string]any, string) {
	tr, tc, _ := s.inner.deployment(gw)
	tc["mode"] = "cluster"
	tc["min_replicas_acked"] = 1
	return tr, tc, s.c.URL
}

func (s *clusterSet) send(ctx context.Context, msgs []outMsg) error { return s.inner.send(ctx, msgs) }

// readResults reads with the producer library's durable reader: a result
// handed out is leased, recorded, then acked (retried through a failover).
func (s *clusterSet) readResults(ctx context.Context, l *ledger) {
	rd := s.p.Results(s.results, producer.ReaderOptions{Lease: 5 * time.Second, Batch: 500})
	for ctx.Err() == nil {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ls, err := rd.TryNext(cctx)
		cancel()
		if err != nil || len(ls) == 0 {
			sleep(ctx, 20*time.Millisecond)
			continue
		}
		now := time.Now()
		for _, x := range ls {
			id, code := resultID([]byte(x.Raw))
			l.record(id, code, now)
		}
		for deadline := time.Now().Add(30 * time.Second); ctx.Err() == nil && time.Now().Before(deadline); sleep(ctx, 50*time.Millisecond) {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := rd.Ack(cctx, ls...)
			cancel()
			if err == nil {
				break
			}
		}
	}
}

func (s *clusterSet) deadLetters(ctx context.Context) (int, error) {
	n, err := s.p.Client().LLen(ctx, s.p.Names().Queue(s.queue).Dead).Result()
	return int(n), err
}

func (s *clusterSet) close() { s.p.Close() }

// killQueueMaster cuts the replication of the queue's master (its replicas
// frozen, their links closed), lets writes go on for 300 ms, kills the
// master (SIGKILL) and lets the replicas go on: one is promoted. Only what
// a replica confirmed survives.
func (s *clusterSet) killQueueMaster(ctx context.Context) (string, error) {
	m, err := s.c.MasterOf(ctx, s.queue)
	if err != nil {
		return "", err
	}
	reps, err := s.c.ReplicasOf(ctx, m)
	if err != nil {
		return "", err
	}
	for _, i := range reps {
		if err := s.c.Nodes[i].Signal(syscall.SIGSTOP); err != nil {
			return "", err
		}
	}
	mc := redis.NewClient(&redis.Options{Addr: s.c.Nodes[m].Addr})
	err = mc.Do(ctx, "CLIENT", "KILL", "TYPE", "replica").Err()
	_ = mc.Close()
	sleep(ctx, 300*time.Millisecond)
	s.c.Nodes[m].Stop()
	for _, i := range reps {
		_ = s.c.Nodes[i].Signal(syscall.SIGCONT)
	}
	return s.c.Nodes[m].Addr, err
}

// runClusterMasterKill: two replicas drain 3,000 requests from a queue on a
// Redis Cluster; after a third are answered, the queue's master is cut off
// from its replicas and killed. With min_replicas_acked 1 nothing may be
// lost or read twice.
func runClusterMasterKill(ctx context.Context, e *env) *verdict {
	const n = 3000
	tc := transportCase{name: "redis-sortedset-cluster", open: openSortedSetCluster}
	return underLoad(ctx, e, tc, brokerFault{name: "redis-cluster-master-kill",
		gf: gatewayFaults{latencyMin: 20 * time.Millisecond, latencyMax: 80 * time.Millisecond}, n: n, quiet: 6 * time.Second,
		act: func(ctx context.Context, s *session, v *verdict) (time.Time, bool) {
			for s.l.tally().answered < n/3 && ctx.Err() == nil {
				sleep(ctx, 10*time.Millisecond)
			}
			v.extra["answered_at_kill"] = float64(s.l.tally().answered)
			if _, err := s.b.(*clusterSet).killQueueMaster(ctx); err != nil {
				v.fail("kill the master: %v", err)
				return time.Time{}, false
			}
			return time.Now(), true
		}})
}
