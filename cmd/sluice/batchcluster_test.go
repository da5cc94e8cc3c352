package main

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/sluice-io/sluice/internal/testenv"
)

// TestServeBatchAPIOnRedisCluster: `sluice serve` on redis-sortedset in
// cluster mode (a real three-master Redis Cluster, the deployment's
// redis_mode) with the Batch API's state in the same cluster: a batch of
// 50 lines through the official client completes, each custom_id once in
// its output.
func TestServeBatchAPIOnRedisCluster(t *testing.T) {
	c := testenv.StartRedisCluster(t, testenv.RedisClusterOptions{Masters: 3, NoReplicas: true})
	gw, calls := echoGateway(t)
	batchAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	_, stop := serveConfig(t, fmt.Sprintf(`{
  "transport": "redis-sortedset", "redis_url": %q, "redis_mode": "cluster",
  "transport_config": {"result_queue_name": "results:{p}", "prefix": "cl-rss",
    "queues": [{"id": "batch", "queue_name": "cl-batch:{p}", "igw_base_url": %q}]},
  "batch_api": {"enabled": true, "listen": %q, "files": {"dir": %q}, "state": {"store": "redis", "prefix": "cl-state:"}}
}`, c.URL, gw, batchAddr, t.TempDir()), batchAddr)
	const n = 50
	cl, job := completeBatch(t, batchAddr, n, 30*time.Second)
	if job.RequestCounts.Completed != n || job.RequestCounts.Failed != 0 || job.OutputFileID == "" {
		t.Fatalf("batch %s %+v, want %d completed", job.Status, job.RequestCounts, n)
	}
	checkJobOutput(t, cl, job, n)
	if got := calls.Load(); got != n {
		t.Errorf("gateway got %d calls, want %d", got, n)
	}
	stop()
}

// TestServeBatchStateFollowsTransportURL: the Batch API's Redis state lives
// on the Redis the transport reaches (redis-sortedset's own url option), not
// on the deployment's redis_url, which is not set at all: the batch
// completes and its job keys are in the transport's Redis.
func TestServeBatchStateFollowsTransportURL(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	gw, _ := echoGateway(t)
	batchAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	_, stop := serveConfig(t, fmt.Sprintf(`{
  "transport": "redis-sortedset",
  "transport_config": {"url": %q, "result_queue_name": "results",
    "queues": [{"id": "batch", "queue_name": "batch", "igw_base_url": %q}]},
  "batch_api": {"enabled": true, "listen": %q, "files": {"dir": %q}, "state": {"store": "redis", "prefix": "own-url:"}}
}`, r.URL, gw, batchAddr, t.TempDir()), batchAddr)
	defer stop()
	const n = 10
	_, job := completeBatch(t, batchAddr, n, 30*time.Second)
	if job.RequestCounts.Completed != n {
		t.Fatalf("batch %s %+v, want %d completed", job.Status, job.RequestCounts, n)
	}
	keys, err := testenv.RedisClient(t, r.URL).Keys(context.Background(), "own-url:{"+job.ID+"}:*").Result()
	if err != nil || len(keys) == 0 {
		t.Fatalf("job %s's state keys in the transport's Redis: %v %v, want some", job.ID, keys, err)
	}
}

// TestServeBatchAPIOnRedisSentinel: `sluice serve` on redis-sortedset in
// sentinel mode (a real master, replica and three sentinels) with the Batch
// API's state on the same Redis: a batch completes, each custom_id once,
// and its job keys are on the master the sentinels name.
func TestServeBatchAPIOnRedisSentinel(t *testing.T) {
	s := testenv.StartRedisSentinel(t)
	gw, calls := echoGateway(t)
	batchAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	addrs, err := json.Marshal(s.Sentinels[1:])
	if err != nil {
		t.Fatal(err)
	}
	_, stop := serveConfig(t, fmt.Sprintf(`{
  "transport": "redis-sortedset", "redis_url": %q, "redis_mode": "sentinel", "redis_addrs": %s, "redis_master_name": %q,
  "transport_config": {"result_queue_name": "results",
    "queues": [{"id": "batch", "queue_name": "batch", "igw_base_url": %q}]},
  "batch_api": {"enabled": true, "listen": %q, "files": {"dir": %q}, "state": {"store": "redis", "prefix": "sn-state:"}}
}`, s.URL, addrs, s.MasterName, gw, batchAddr, t.TempDir()), batchAddr)
	defer stop()
	const n = 20
	cl, job := completeBatch(t, batchAddr, n, 30*time.Second)
	if job.RequestCounts.Completed != n || job.OutputFileID == "" {
		t.Fatalf("batch %s %+v, want %d completed", job.Status, job.RequestCounts, n)
	}
	checkJobOutput(t, cl, job, n)
	if got := calls.Load(); got != n {
		t.Errorf("gateway got %d calls, want %d", got, n)
	}
	keys, err := testenv.RedisClient(t, s.Master.URL).Keys(context.Background(), "sn-state:{"+job.ID+"}:*").Result()
	if err != nil || len(keys) == 0 {
		t.Fatalf("job %s's state keys on the master: %v %v, want some", job.ID, keys, err)
	}
}
