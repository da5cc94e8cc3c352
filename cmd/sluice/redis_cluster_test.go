package main

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/internal/simulator"
	"github.com/sluice-io/sluice/internal/testenv"
)

// TestRedisCommandsCluster drives enqueue, queues, cancel, serve and
// results with --redis.mode cluster against a real Redis Cluster: two pools
// (hash-tagged names), a job cancelled across both, every result read once.
func TestRedisCommandsCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 6-node Redis Cluster")
	}
	c := testenv.StartRedisCluster(t, testenv.RedisClusterOptions{})
	t.Setenv("REDIS_URL", c.URL)
	sim := startSim(t, simulator.Config{})
	ctx := context.Background()
	dl := time.Now().Add(time.Hour)
	for _, pool := range []string{"pool-a", "pool-b"} {
		var in strings.Builder
		for i := range 20 {
			fmt.Fprintln(&in, flatLine(fmt.Sprintf("%s-%02d", pool, i), "keep", dl))
		}
		for i := range 5 {
			fmt.Fprintln(&in, flatLine(fmt.Sprintf("%s-gone-%02d", pool, i), "doomed", dl))
		}
		_, stderr, err := runCLI(t, ctx, in.String(), "enqueue", "--redis.mode", "cluster", "--pool", pool)
		if err != nil || !strings.Contains(stderr, "enqueued 25 request(s) to llm-d-async:requests:{"+pool+"}") {
			t.Fatalf("enqueue %s: %v\n%s", pool, err, stderr)
		}
	}
	out, _, err := runCLI(t, ctx, "", "queues", "--redis.mode", "cluster")
	if err != nil || !regexpLine(out, "llm-d-async:requests:{pool-a}", "25", "0", "0", "0") || !regexpLine(out, "llm-d-async:requests:{pool-b}", "25", "0", "0", "0") {
		t.Fatalf("queues: %v\n%s", err, out)
	}
	out, _, err = runCLI(t, ctx, "", "cancel", "--redis.mode", "cluster", "--job", "doomed")
	if err != nil || !strings.Contains(out, "10 waiting request(s)") {
		t.Fatalf("cancel across two pools: %v %s", err, out)
	}
	if _, stderr, err := runCLI(t, ctx, "x\n", "enqueue", "--pool", "pool-a"); err == nil || !strings.Contains(stderr+err.Error(), "cluster") {
		t.Fatalf("a cluster URL without --redis.mode cluster: %v %s, want a hint to set cluster mode", err, stderr)
	}

	cfg := fmt.Sprintf(`{"queues":[{"queue_name":"llm-d-async:requests:{pool-a}","igw_base_url":%q,"result_queue_name":"llm-d-async:results:{pool-a}:$batch"},`+
		`{"queue_name":"llm-d-async:requests:{pool-b}","igw_base_url":%q,"result_queue_name":"llm-d-async:results:{pool-b}:$batch"}]}`, sim, sim)
	results := serveAndCollect(t, ctx, 50, 30*time.Second,
		[]string{"serve", "--transport", "redis-sortedset", "--transport-config", cfg,
			"--redis.mode", "cluster", "--metrics-port", "-1", "--health-port", "-1", "--log-level", "warn"},
		[]string{"results", "--redis.mode", "cluster", "--pool", "pool-a", "-n", "20"},
		[]string{"results", "--redis.mode", "cluster", "--pool", "pool-b", "-n", "20"})
	if len(results) != 50 {
		t.Fatalf("%d results, want 50", len(results))
	}
	for id, res := range results {
		want := wire.CodeNone
		if strings.Contains(id, "-gone-") {
			want = wire.CodeCancelled
		}
		if res.ErrorCode != want {
			t.Errorf("%s: %+v", id, res)
		}
	}
}

// TestValidateClusterSlots: `sluice validate`, without a server, accepts
// a cluster queue whose result list is in another hash slot (upstream's
// names) with a warning that it takes the cross-slot settle, and one whose
// names share a hash tag without it.
func TestValidateClusterSlots(t *testing.T) {
	cfg := `{"queues":[{"queue_name":"llm-d-async:requests:pool-a","igw_base_url":"http://gw:80","result_queue_name":"llm-d-async:results:pool-a:$batch"}]}`
	url := "redis://127.0.0.1:1?addr=127.0.0.1:2"
	out, err := run(t, "validate", "--transport", "redis-sortedset", "--transport-config", cfg, "--redis.mode", "cluster", "--redis.url", url)
	if err != nil || !regexp.MustCompile(`(?m)^warning: transport_config\.queues\[0\]: .*different hash slots: results take the cross-slot settle`).MatchString(out) {
		t.Fatalf("validate with upstream's names: %q %v, want ok and a warning naming the cross-slot settle", out, err)
	}
	cfg = strings.NewReplacer("pool-a", "{pool-a}").Replace(cfg)
	out, err = run(t, "validate", "--transport", "redis-sortedset", "--transport-config", cfg, "--redis.mode", "cluster", "--redis.url", url)
	if err != nil || strings.Contains(out, "cross-slot") {
		t.Fatalf("validate with one hash tag: %q %v, want ok without a cross-slot warning", out, err)
	}
	bad := `{"queues":[{"queue_name":"plain}brace","igw_base_url":"http://gw:80"}]}`
	if out, err := run(t, "validate", "--transport", "redis-sortedset", "--transport-config", bad, "--redis.mode", "cluster", "--redis.url", url); err == nil || !strings.Contains(out+err.Error(), "hash tag") {
		t.Fatalf("validate with a lone brace: %q %v, want an error naming hash tags", out, err)
	}
}
