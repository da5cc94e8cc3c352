package main

import (
	"context"
	"fmt"
	"io"
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
	resp, err := cl.Files.Content(context.Background(), job.OutputFileID)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	checkEchoOutput(t, body, n)
	if got := calls.Load(); got != n {
		t.Errorf("gateway got %d calls, want %d", got, n)
	}
	stop()
}
