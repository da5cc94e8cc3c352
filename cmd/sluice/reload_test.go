package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/internal/simulator"
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/transports/redissortedset/producer"
)

// TestTransportConfigWatch runs serve on a real redis-server with
// --transport-config-watch-interval and rewrites its --transport-config-file:
// a queue added is served; a queue removed while its requests are at the
// gateway answers each exactly once and claims nothing enqueued after; a
// broken file keeps the running queues and is counted in
// async_queue_config_reloads_total{result="error"}.
func TestTransportConfigWatch(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	t.Setenv("REDIS_URL", r.URL)
	sim := startSim(t, simulator.Config{Latency: simulator.Fixed(800 * time.Millisecond)})
	const results = "reload-results"
	file := filepath.Join(t.TempDir(), "transport.json")
	write := func(ids ...string) {
		t.Helper()
		var qs []map[string]any
		for _, id := range ids {
			qs = append(qs, map[string]any{"id": id, "queue_name": "rq:" + id, "igw_base_url": sim, "max_concurrency": 16})
		}
		b, _ := json.Marshal(map[string]any{"poll_interval_ms": 100, "result_queue_name": results, "queues": qs})
		swapFile(t, file, string(b))
	}
	write("a")
	metricsPort := freePort(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, _, err := runCLI(t, ctx, "", "serve", "--transport", "redis-sortedset", "--transport-config-file", file,
			"--transport-config-watch-interval", "50ms", "--metrics-port", metricsPort, "--health-port", "-1", "--log-level", "warn")
		done <- err
	}()
	if code := waitMetrics(t, metricsPort, done); code != http.StatusOK {
		t.Fatalf("/metrics: %d", code)
	}

	p, err := producer.Dial(r.URL, producer.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	opts, err := redis.ParseURL(r.URL)
	if err != nil {
		t.Fatal(err)
	}
	rc := redis.NewClient(opts)
	defer rc.Close()
	enqueue := func(queue string, ids ...string) {
		t.Helper()
		var reqs []*wire.Request
		for _, id := range ids {
			reqs = append(reqs, &wire.Request{ID: id, Deadline: time.Now().Add(time.Hour), Payload: json.RawMessage(`{"model":"m","prompt":"p"}`)})
		}
		if err := p.EnqueueMany(ctx, "rq:"+queue, reqs); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[string]int{}
	reader := p.Results(results, producer.ReaderOptions{})
	waitAnswered := func(ids ...string) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			all := true
			for _, id := range ids {
				all = all && seen[id] > 0
			}
			if all {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("not all of %v answered within 20s: %v", ids, seen)
			}
			ls, err := reader.TryNext(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range ls {
				if l.Err != nil || !l.Result.OK() {
					t.Fatalf("result %q: %v %+v", l.Raw, l.Err, l.Result)
				}
				seen[l.Result.ID]++
			}
			if err := reader.Ack(ctx, ls...); err != nil {
				t.Fatal(err)
			}
			if len(ls) == 0 {
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
	reloads := func(result string, want float64) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			got := scrapeReloads(t, metricsPort, result)
			if got == want {
				return
			}
			if got > want || time.Now().After(deadline) {
				t.Fatalf("reloads{result=%q} = %v, want %v", result, got, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	enqueue("a", "a-0")
	waitAnswered("a-0")

	write("a", "b")
	reloads("success", 1)
	enqueue("b", "b-0", "b-1", "b-2")
	waitAnswered("b-0", "b-1", "b-2")

	var slow []string
	for i := range 8 {
		slow = append(slow, fmt.Sprintf("slow-%d", i))
	}
	enqueue("a", slow...)
	deadline := time.Now().Add(20 * time.Second)
	for rc.ZCard(ctx, "rq:a").Val() > 0 { // all claimed: at the gateway for 800 ms
		if time.Now().After(deadline) {
			t.Fatal("a's requests were not claimed within 20s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	write("b")
	reloads("success", 2)
	enqueue("a", "late-0", "late-1")
	waitAnswered(slow...)
	for _, id := range slow {
		if seen[id] != 1 {
			t.Errorf("%s answered %d times, want once", id, seen[id])
		}
	}
	if n := rc.ZCard(ctx, "rq:a").Val(); n != 2 || seen["late-0"]+seen["late-1"] != 0 {
		t.Errorf("removed queue a: %d waiting (want the 2 late requests), late answered %d, %d times", n, seen["late-0"], seen["late-1"])
	}

	swapFile(t, file, `{"queues": [}`)
	reloads("error", 1)
	swapFile(t, file, `{"poll_interval_ms": 5000, "result_queue_name": "`+results+`", "queues": [{"id": "b", "queue_name": "rq:b", "igw_base_url": "`+sim+`", "max_concurrency": 16}]}`)
	reloads("error", 2) // a transport option: refused
	enqueue("b", "b-3")
	waitAnswered("b-3")
	reloads("success", 2)

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("serve: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not stop within 30s of cancel")
	}
}

// TestTransportConfigWatchFlag checks the flag's refusals.
func TestTransportConfigWatchFlag(t *testing.T) {
	file := filepath.Join(t.TempDir(), "q.json")
	swapFile(t, file, `[{"queue_name": "q", "igw_base_url": "http://127.0.0.1:1"}]`)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--transport-config-file", file, "--transport-config-watch-interval", "-1s"}, "must not be negative"},
		{[]string{"--transport-config", `{"queues": [{"queue_name": "q", "igw_base_url": "http://127.0.0.1:1"}]}`, "--transport-config-watch-interval", "1s"}, "cannot be combined with --transport-config"},
		{[]string{"--transport-config", `{"queues": [{"queue_name": "q", "igw_base_url": "http://127.0.0.1:1"}]}`, "--transport-config-file", file, "--transport-config-watch-interval", "1s"}, "cannot be combined with --transport-config"},
	} {
		args := append([]string{"serve", "--metrics-port", "-1", "--health-port", "-1"}, tc.args...)
		_, _, err := runCLI(t, context.Background(), "", args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("serve %v: err %v, want %q", tc.args, err, tc.want)
		}
		out, _, err := runCLI(t, context.Background(), "", append([]string{"validate"}, tc.args...)...)
		if err == nil || !strings.Contains(out, tc.want) {
			t.Errorf("validate %v: err %v, output %q, want %q", tc.args, err, out, tc.want)
		}
	}
}

func swapFile(t *testing.T, file, s string) {
	t.Helper()
	tmp := file + ".tmp"
	if err := os.WriteFile(tmp, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, file); err != nil {
		t.Fatal(err)
	}
}

// scrapeReloads reads async_queue_config_reloads_total{result} from /metrics.
func scrapeReloads(t *testing.T, port, result string) float64 {
	t.Helper()
	resp, err := http.Get("http://127.0.0.1:" + port + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	prefix := `llm_d_async_async_queue_config_reloads_total{result="` + result + `"} `
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), prefix); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	t.Fatalf("%s not in /metrics", strings.TrimSpace(prefix))
	return 0
}
