package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/internal/simulator"
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/transports/redissortedset/producer"
)

// runCLI runs the sluice command line in-process.
func runCLI(t *testing.T, ctx context.Context, stdin string, args ...string) (string, string, error) {
	t.Helper()
	root := newRoot()
	var out, errOut bytes.Buffer
	root.SetArgs(args)
	root.SetIn(strings.NewReader(stdin))
	root.SetOut(&out)
	root.SetErr(&errOut)
	err := root.ExecuteContext(ctx)
	return out.String(), errOut.String(), err
}

func startSim(t *testing.T, cfg simulator.Config) string {
	t.Helper()
	s, err := simulator.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	base, err := s.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return base
}

func flatLine(id, job string, deadline time.Time) string {
	return fmt.Sprintf(`{"id":%q,"deadline":%d,"payload":{"model":"m","prompt":"p"},"metadata":{"job_id":%q}}`, id, deadline.Unix(), job)
}

// TestRedisCommands drives enqueue, queues, cancel and results against a
// real redis-server and the legacy serve command line, in-process.
func TestRedisCommands(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{Password: "pw"})
	t.Setenv("REDIS_URL", r.URL)
	sim := startSim(t, simulator.Config{})
	ctx := context.Background()
	dl := time.Now().Add(time.Hour)

	var in strings.Builder
	for i := range 40 {
		fmt.Fprintln(&in, flatLine(fmt.Sprintf("req-%02d", i), "job-a", dl))
	}
	for i := range 10 {
		fmt.Fprintln(&in, flatLine(fmt.Sprintf("gone-%02d", i), "job-b", dl.Add(time.Minute)))
	}
	in.WriteString("{not json\n")
	_, stderr, err := runCLI(t, ctx, in.String(), "enqueue", "--pool", "pool-a", "--batch", "7")
	if ee, ok := err.(exitError); !ok || ee.code != 1 || !strings.Contains(stderr, "line 51:") ||
		!strings.Contains(stderr, "enqueued 50 request(s) to llm-d-async:requests:pool-a") {
		t.Fatalf("enqueue: %v\n%s", err, stderr)
	}
	out, _, err := runCLI(t, ctx, "", "queues")
	if err != nil || !regexpLine(out, "llm-d-async:requests:pool-a", "50", "0", "0", "0") {
		t.Fatalf("queues: %v\n%s", err, out)
	}
	out, _, err = runCLI(t, ctx, "", "cancel", "--job", "job-b")
	if err != nil || !strings.Contains(out, "10 waiting request(s)") {
		t.Fatalf("cancel: %v %s", err, out)
	}
	if _, _, err := runCLI(t, ctx, "", "cancel"); err == nil {
		t.Fatal("cancel without --job or --id succeeded")
	}

	// Legacy flags, a bare-array queues file, REDIS_URL with AUTH.
	qfile := filepath.Join(t.TempDir(), "queues.json")
	if err := os.WriteFile(qfile, []byte(fmt.Sprintf(`[{"queue_name":"llm-d-async:requests:pool-a","igw_base_url":%q,"request_path_url":"/v1/completions"}]`, sim)), 0o600); err != nil {
		t.Fatal(err)
	}
	// An upstream envelope message too.
	env := fmt.Sprintf(`{"request_kind":"redis","internal":{"retry_count":0,"request_token":"t"},"data":{"id":"env-1","deadline":%d,"payload":{"model":"m"}}}`, dl.Unix())
	p, err := producer.Dial(r.URL, producer.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.Client().Do(ctx, "ZADD", "llm-d-async:requests:pool-a", dl.Unix(), env).Err(); err != nil {
		t.Fatal(err)
	}
	results := serveAndCollect(t, ctx, 51, 20*time.Second,
		[]string{"serve", "--message-queue-impl=redis-sortedset", "--redis.ss.queues-config-file", qfile, "--redis.ss.result-queue-name", "R",
			"--metrics-port", "-1", "--health-port", "-1", "--log-level", "warn"},
		[]string{"results", "--queue", "R", "-n", "20"})
	if len(results) != 51 {
		t.Fatalf("%d results, want 51", len(results))
	}
	for id, res := range results {
		want := wire.CodeNone
		if strings.HasPrefix(id, "gone-") {
			want = wire.CodeCancelled
		}
		if res.ErrorCode != want {
			t.Fatalf("%s: %+v", id, res)
		}
		if strings.HasPrefix(id, "req-") && res.Metadata["job_id"] != "job-a" {
			t.Fatalf("%s: metadata not echoed: %+v", id, res)
		}
	}
	out, _, err = runCLI(t, ctx, "", "queues", "llm-d-async:requests:pool-a")
	if err != nil || !regexpLine(out, "llm-d-async:requests:pool-a", "0", "0", "0", "0") {
		t.Fatalf("queues after the run: %v\n%s", err, out)
	}
}

// regexpLine reports whether out has a line made of exactly fields.
// serveAndCollect runs the serve command line serve in-process while it
// reads results with each results command line in turn, until n distinct
// results (a second result for an id fails the test) or within; then it
// stops serve and fails the test if serve failed.
func serveAndCollect(t *testing.T, ctx context.Context, n int, within time.Duration, serve []string, results ...[]string) map[string]*wire.Result {
	t.Helper()
	sctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var serveErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _, serveErr = runCLI(t, sctx, "", serve...)
	}()
	got := map[string]*wire.Result{}
	deadline := time.Now().Add(within)
	for len(got) < n && time.Now().Before(deadline) {
		for _, args := range results {
			out, _, err := runCLI(t, ctx, "", args...)
			if err != nil {
				stop()
				wg.Wait()
				t.Fatal(err)
			}
			for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
				if line == "" {
					continue
				}
				res, err := wire.DecodeResult([]byte(line))
				if err != nil {
					t.Fatalf("result line %q: %v", line, err)
				}
				if got[res.ID] != nil {
					t.Fatalf("second result for %s", res.ID)
				}
				got[res.ID] = res
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	wg.Wait()
	if serveErr != nil {
		t.Fatalf("serve: %v", serveErr)
	}
	return got
}

func regexpLine(out string, fields ...string) bool {
	for _, line := range strings.Split(out, "\n") {
		if strings.Join(strings.Fields(line), " ") == strings.Join(fields, " ") {
			return true
		}
	}
	return false
}

// TestServeSurvivesKill9 runs `sluice serve` as a child process against a
// slow gateway, kills it with SIGKILL several times mid-run and restarts
// it: every request must end with exactly one result and every set empty.
func TestServeSurvivesKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sluice binary; skipped with -short")
	}
	bin := filepath.Join(t.TempDir(), "sluice")
	build := exec.Command("go", "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	sim := startSim(t, simulator.Config{Latency: simulator.Uniform(200*time.Millisecond, 600*time.Millisecond)})
	ctx := context.Background()
	const queue, results, n = "llm-d-async:requests:crash", "crash-results", 300

	// The object form of the queues file, with short leases so the test is quick.
	cfg, _ := json.Marshal(map[string]any{
		"lease_ms": 1500, "heartbeat_ms": 300, "reclaim_interval_ms": 200, "max_deliveries": 50, "poll_interval_ms": 200,
		"queues": []map[string]any{{"queue_name": queue, "igw_base_url": sim}},
	})
	qfile := filepath.Join(t.TempDir(), "queues.json")
	if err := os.WriteFile(qfile, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := producer.Dial(r.URL, producer.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var reqs []*wire.Request
	for i := range n {
		reqs = append(reqs, &wire.Request{ID: fmt.Sprintf("c-%03d", i), Deadline: time.Now().Add(time.Hour),
			Payload: json.RawMessage(`{"model":"m"}`), Metadata: map[string]string{"job_id": "crash"}})
	}
	if err := p.EnqueueMany(ctx, queue, reqs); err != nil {
		t.Fatal(err)
	}

	start := func() *exec.Cmd {
		cmd := exec.Command(bin, "serve", "--message-queue-impl=redis-sortedset",
			"--redis.ss.queues-config-file", qfile, "--redis.ss.result-queue-name", results,
			"--concurrency", "32", "--metrics-port", "-1", "--health-port", "-1", "--log-level", "warn")
		cmd.Env = append(os.Environ(), "REDIS_URL="+r.URL)
		var logs bytes.Buffer
		cmd.Stdout, cmd.Stderr = &logs, &logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if cmd.ProcessState == nil {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
			}
		})
		return cmd
	}

	seen := map[string]int{}
	reader := p.Results(results, producer.ReaderOptions{Batch: 500})
	drain := func() {
		ls, err := reader.TryNext(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range ls {
			if l.Err != nil {
				t.Fatalf("result %q: %v", l.Raw, l.Err)
			}
			seen[l.Result.ID]++
			if !l.Result.OK() {
				t.Errorf("result %s: %+v", l.Result.ID, l.Result)
			}
		}
		if err := reader.Ack(ctx, ls...); err != nil {
			t.Fatal(err)
		}
	}
	for kill := 0; kill < 4; kill++ {
		cmd := start()
		time.Sleep(time.Duration(700+200*kill) * time.Millisecond)
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait()
		drain()
		t.Logf("after kill %d: %d results", kill+1, len(seen))
	}
	cmd := start()
	deadline := time.Now().Add(40 * time.Second)
	for len(seen) < n && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		drain()
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("serve after SIGTERM: %v", err)
	}
	drain()
	for _, rq := range reqs {
		if seen[rq.ID] != 1 {
			t.Errorf("%s: %d results", rq.ID, seen[rq.ID])
		}
	}
	c := p.Client()
	for _, k := range []string{queue, queue + ":claims-idx", queue + ":leases", queue + ":delayed", results + ":pending"} {
		if n := c.ZCard(ctx, k).Val(); n != 0 {
			t.Errorf("%s holds %d", k, n)
		}
	}
	for _, k := range []string{queue + ":claimed", queue + ":claim-owners", queue + ":leased", queue + ":redeliveries"} {
		if n := c.HLen(ctx, k).Val(); n != 0 {
			t.Errorf("%s holds %d", k, n)
		}
	}
	if n := c.LLen(ctx, results).Val(); n != 0 {
		t.Errorf("%s holds %d", results, n)
	}
	t.Logf("reclaimed after kills: %s", c.HGet(ctx, queue+":stats", "reclaimed").Val())
}

// TestEnqueueIdempotent: `sluice enqueue --idempotent` run twice on one
// file queues each request once; a line whose id was submitted as another
// request is a conflict (exit status 1), the rest still go in.
func TestEnqueueIdempotent(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	t.Setenv("REDIS_URL", r.URL)
	ctx := context.Background()
	dl := time.Unix(4_000_000_000, 0)
	var in strings.Builder
	for i := range 12 {
		fmt.Fprintln(&in, flatLine(fmt.Sprintf("idem-%02d", i), "job-i", dl))
	}
	for run := range 2 {
		_, stderr, err := runCLI(t, ctx, in.String(), "enqueue", "--pool", "pool-i", "--batch", "5", "--idempotent", "--retention", "2h")
		want := "submitted 12 request(s) to llm-d-async:requests:pool-i in"
		already := fmt.Sprintf("(%d already submitted before", run*12)
		if err != nil || !strings.Contains(stderr, want) || !strings.Contains(stderr, already) {
			t.Fatalf("run %d: %v\n%s", run, err, stderr)
		}
	}
	changed := strings.Replace(flatLine("idem-03", "job-i", dl), `"prompt":"p"`, `"prompt":"q"`, 1) + "\n" + flatLine("idem-12", "job-i", dl) + "\n"
	_, stderr, err := runCLI(t, ctx, changed, "enqueue", "--pool", "pool-i", "--idempotent")
	if ee, ok := err.(exitError); !ok || ee.code != 1 || !strings.Contains(stderr, "line 1: id idem-03 was submitted before as a different request") {
		t.Fatalf("conflict: %v\n%s", err, stderr)
	}
	out, _, err := runCLI(t, ctx, "", "queues", "llm-d-async:requests:pool-i")
	if err != nil || !regexpLine(out, "llm-d-async:requests:pool-i", "13", "0", "0", "0") {
		t.Fatalf("queues: %v\n%s", err, out)
	}
	c := testenv.RedisClient(t, r.URL)
	if ttl := c.PTTL(ctx, "llm-d-async:submission:idem-00").Val(); ttl <= time.Hour || ttl > 2*time.Hour {
		t.Errorf("record kept for %s, want --retention 2h", ttl)
	}
}

// TestOperatorQueueNames: the batch-gateway after July names its queues
// (async_dispatch.models.<model>.request_queue_name, #629): `sluice
// enqueue`, `queues`, `cancel` and `migrate` take and show such names as
// they are, deriving nothing from an llm-d-async: prefix.
func TestOperatorQueueNames(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	t.Setenv("REDIS_URL", r.URL)
	ctx := context.Background()
	const q = "acme/batch-q"
	dl := time.Now().Add(time.Hour)
	var in strings.Builder
	for i := range 5 {
		fmt.Fprintln(&in, flatLine(fmt.Sprintf("op-%d", i), "batch_9", dl))
	}
	if _, stderr, err := runCLI(t, ctx, in.String(), "enqueue", "--queue", q); err != nil || !strings.Contains(stderr, "enqueued 5 request(s) to "+q) {
		t.Fatalf("enqueue: %v\n%s", err, stderr)
	}
	out, _, err := runCLI(t, ctx, "", "queues")
	if err != nil || !regexpLine(out, q, "5", "0", "0", "0") || strings.Contains(out, "llm-d-async:requests") {
		t.Fatalf("queues: %v\n%s", err, out)
	}
	if out, _, err := runCLI(t, ctx, "", "migrate", "--to-upstream", "--dry-run", "--queue", q); err != nil || !strings.Contains(out, q) || strings.Contains(out, "llm-d-async:requests") {
		t.Fatalf("migrate: %v\n%s", err, out)
	}
	if out, _, err := runCLI(t, ctx, "", "cancel", "--job", "batch_9"); err != nil || !strings.Contains(out, "5 waiting request(s)") {
		t.Fatalf("cancel: %v\n%s", err, out)
	}
}
