package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/internal/simulator"
	"github.com/sluice-io/sluice/internal/testenv"
)

// TestGatePluginExample builds examples/gate-plugin as its README does
// (from its own module folder), pins it by its SHA-256 digest in the
// example's transport config, has `sluice validate` accept it, and runs
// `sluice serve` with it (on a real redis-server and the gateway
// simulator) until an admitted request is answered and a denied tenant's
// request ends GATE_DROPPED.
func TestGatePluginExample(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "gate-plugin")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Dir = filepath.Join("..", "..", "examples", "gate-plugin")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the example module: %v\n%s", err, out)
	}
	raw, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(raw)
	budget := writeFile(t, "budget", "1")

	data, err := os.ReadFile(filepath.Join("..", "..", "examples", "gate-plugin", "transport-config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	q0 := doc["queues"].([]any)[0].(map[string]any)
	params := q0["gate_params"].(map[string]any)
	params["path"], params["sha256"], params["file"] = bin, hex.EncodeToString(sum[:]), budget
	b, _ := json.Marshal(doc)
	cfgFile := writeFile(t, "transport-config.json", string(b))
	if out, err := run(t, "validate", "--transport", "memory", "--transport-config-file", cfgFile); err != nil || !strings.HasPrefix(out, "ok: transport memory") {
		t.Fatalf("validate: %q %v", out, err)
	}

	// serve it on redis-sortedset, where the test can produce and read.
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	c := testenv.RedisClient(t, r.URL)
	q0["igw_base_url"] = startSim(t, simulator.Config{})
	doc["url"] = r.URL
	b, _ = json.Marshal(doc)
	cfgFile = writeFile(t, "serve.json", string(b))
	queue, results := q0["queue_name"].(string), doc["result_queue_name"].(string)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, _, err := runCLI(t, ctx, "", "serve", "--transport", "redis-sortedset", "--transport-config-file", cfgFile,
			"--metrics-port", "-1", "--health-port", "-1", "--drain-timeout", "5s")
		done <- err
	}()
	deadline := time.Now().Add(time.Hour)
	for _, req := range []struct{ id, tenant string }{{"ok-1", "acme"}, {"deny-1", "blocked"}} {
		p := `{"id":"` + req.id + `","deadline":` + itoa(deadline.Unix()) + `,"payload":{"prompt":"hi"},"metadata":{"tenant":"` + req.tenant + `"}}`
		if err := c.ZAdd(context.Background(), queue, redis.Z{Score: float64(deadline.Unix()), Member: p}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	got := map[string]*wire.Result{}
	for range 2 {
		v, err := c.BRPop(context.Background(), 30*time.Second, results).Result()
		if err != nil {
			cancel()
			<-done
			t.Fatalf("results so far %v; no more within 30s: %v", got, err)
		}
		res, err := wire.DecodeResult([]byte(v[1]))
		if err != nil {
			t.Fatal(err)
		}
		got[res.ID] = res
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("serve: %v", err)
	}
	if r := got["ok-1"]; r == nil || !r.OK() {
		t.Errorf("admitted request: %+v, want a success", r)
	}
	if r := got["deny-1"]; r == nil || r.ErrorCode != wire.CodeGateDropped {
		t.Errorf("denied tenant: %+v, want %s", r, wire.CodeGateDropped)
	}
}
