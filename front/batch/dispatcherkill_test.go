package batch_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/sluice-io/sluice/core/submit"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/front/batch"
	"github.com/sluice-io/sluice/front/batch/redisstate"
	"github.com/sluice-io/sluice/front/filestore/disk"
	"github.com/sluice-io/sluice/internal/testenv"
	rss "github.com/sluice-io/sluice/transports/redissortedset"
	"github.com/sluice-io/sluice/transports/redissortedset/producer"
	rstream "github.com/sluice-io/sluice/transports/redisstream"
)

// countingGateway answers every chat completion after d, counting calls
// per message content and the calls in flight.
type countingGateway struct {
	url    string
	active atomic.Int64
	mu     sync.Mutex
	calls  map[string]int
}

func startCountingGateway(t *testing.T, d time.Duration) *countingGateway {
	t.Helper()
	g := &countingGateway{calls: map[string]int{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var in struct {
			Messages []struct {
				Content string `json:"content"`
			} `json:"messages"`
		}
		if json.Unmarshal(body, &in) != nil || len(in.Messages) == 0 {
			return // a probe
		}
		g.active.Add(1)
		defer g.active.Add(-1)
		g.mu.Lock()
		g.calls[in.Messages[0].Content]++
		g.mu.Unlock()
		select {
		case <-time.After(d):
		case <-r.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"echo %s"},"finish_reason":"stop"}]}`,
			in.Messages[0].Content)
	}))
	t.Cleanup(srv.Close)
	g.url = srv.URL
	return g
}

func (g *countingGateway) total() (calls, distinct int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, n := range g.calls {
		calls += n
	}
	return calls, len(g.calls)
}

// dispatcher is one `sluice serve` child process.
type dispatcher struct {
	cmd  *exec.Cmd
	logs bytes.Buffer // written by the process's output copiers until done
	done chan struct{}
}

// buildSluice builds cmd/sluice into a temporary directory.
func buildSluice(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "sluice")
	out, err := exec.Command("go", "build", "-o", bin, "../../cmd/sluice").CombinedOutput()
	if err != nil {
		t.Fatalf("go build ./cmd/sluice: %v\n%s", err, out)
	}
	return bin
}

// TestKillDispatcherMidJob: the Batch API front runs beside a separate
// `sluice serve` dispatcher (the built binary, on a real redis-server); the
// dispatcher is killed with SIGKILL while a quarter of a 300-line job is
// answered and calls are in flight, a new one is started, and the job
// completes with every custom_id exactly once across the output and error
// files. On redis-sortedset (the killed one's leases lapse) and on
// redis-stream (its pending entries are taken over).
func TestKillDispatcherMidJob(t *testing.T) {
	bin := buildSluice(t)
	for _, tc := range []struct {
		transport string
		// options are the transport's, with short leases, so that the
		// killed dispatcher's requests come back within two seconds.
		options  map[string]any
		producer func(t *testing.T, url string) submit.Producer
	}{
		{rss.Name, map[string]any{"lease_ms": 1500, "heartbeat_ms": 300, "reclaim_interval_ms": 200, "poll_interval_ms": 50},
			func(t *testing.T, url string) submit.Producer {
				p, err := producer.Dial(url, producer.Config{})
				if err != nil {
					t.Fatal(err)
				}
				return producer.NewSubmitter(p, submit.ReaderOptions{})
			}},
		{rstream.Name, map[string]any{"claim_idle_ms": 1500, "heartbeat_ms": 300, "block_ms": 50},
			func(t *testing.T, url string) submit.Producer {
				p, err := rstream.DialProducer(rstream.Options{Server: rstream.Server{URL: url}}, transport.Env{}, submit.ReaderOptions{})
				if err != nil {
					t.Fatal(err)
				}
				return p
			}},
	} {
		t.Run(tc.transport, func(t *testing.T) {
			killDispatcherMidJob(t, bin, tc.transport, tc.options, tc.producer)
		})
	}
}

func killDispatcherMidJob(t *testing.T, bin, transportName string, options map[string]any, newProducer func(*testing.T, string) submit.Producer) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	gw := startCountingGateway(t, 40*time.Millisecond)
	const queue, n = "dkill-q", 300

	// The front, in this process: Redis state, the transport's producer.
	state, err := redisstate.Dial(r.URL, "", transport.Env{})
	if err != nil {
		t.Fatal(err)
	}
	files, err := disk.Open(disk.Config{Dir: filepath.Join(t.TempDir(), "files")})
	if err != nil {
		t.Fatal(err)
	}
	p := newProducer(t, r.URL)
	svc, err := batch.New(batch.Config{Queue: queue, ScanInterval: 100 * time.Millisecond}, state, files, p, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	svcDone := make(chan error, 1)
	go func() { svcDone <- svc.Run(ctx) }()
	api := httptest.NewServer(svc.Handler())
	t.Cleanup(func() {
		api.Close()
		cancel()
		if err := <-svcDone; err != nil {
			t.Errorf("batch service: %v", err)
		}
		_ = state.Close()
		_ = p.Close()
	})
	rg := &rig{client: openai.NewClient(option.WithBaseURL(api.URL+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))}

	// The dispatcher.
	tcfg := map[string]any{"result_queue_name": "dkill-default-results",
		"queues": []map[string]any{{"queue_name": queue, "igw_base_url": gw.url}}}
	for k, v := range options {
		tcfg[k] = v
	}
	cfg, _ := json.Marshal(map[string]any{
		"transport": transportName, "redis_url": r.URL, "concurrency": 8,
		"metrics_port": -1, "health_port": -1, "transport_config": tcfg,
	})
	cfgFile := filepath.Join(t.TempDir(), "sluice.json")
	if err := os.WriteFile(cfgFile, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	startDispatcher := func() *dispatcher {
		d := &dispatcher{cmd: exec.Command(bin, "serve", "--config", cfgFile, "--log-level", "warn"), done: make(chan struct{})}
		d.cmd.Stdout, d.cmd.Stderr = &d.logs, &d.logs
		testenv.DieWithParent(d.cmd)
		if err := d.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() {
			_ = d.cmd.Wait()
			close(d.done)
		}()
		t.Cleanup(func() {
			_ = d.cmd.Process.Kill()
			<-d.done
			if t.Failed() {
				t.Logf("dispatcher %d log:\n%s", d.cmd.Process.Pid, d.logs.String())
			}
		})
		return d
	}

	first := startDispatcher()
	b := rg.create(t, rg.upload(t, jsonl(n, nil)).ID)
	deadline := time.Now().Add(30 * time.Second)
	var atKill openai.BatchRequestCounts
	for {
		got, err := rg.client.Batches.Get(context.Background(), b.ID)
		if err == nil && got.RequestCounts.Completed >= n/4 && gw.active.Load() > 0 {
			if got.RequestCounts.Completed == n {
				t.Fatalf("the job finished before the kill; make the gateway slower")
			}
			atKill = got.RequestCounts
			break
		}
		select {
		case <-first.done:
			t.Fatalf("the dispatcher ended by itself: %v", first.cmd.ProcessState)
		default:
		}
		if time.Now().After(deadline) {
			if err != nil {
				t.Fatalf("no progress before the kill: %v", err)
			}
			t.Fatalf("no progress before the kill: %s %+v, %d call(s) in flight", got.Status, got.RequestCounts, gw.active.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
	inFlight := gw.active.Load()
	if err := first.cmd.Process.Kill(); err != nil { // SIGKILL
		t.Fatal(err)
	}
	<-first.done
	if inFlight == 0 {
		t.Fatalf("no gateway call in flight at the kill")
	}
	t.Logf("killed the dispatcher with %d of %d answered and %d call(s) in flight", atKill.Completed, n, inFlight)

	startDispatcher()
	final := rg.waitStatus(t, b.ID, openai.BatchStatusCompleted, openai.BatchStatusFailed, openai.BatchStatusExpired)
	if final.Status != openai.BatchStatusCompleted || final.RequestCounts.Total != n || final.RequestCounts.Completed+final.RequestCounts.Failed != n {
		t.Fatalf("after the restart: %s %+v", final.Status, final.RequestCounts)
	}
	seen := map[string]int{}
	out, errs := rg.download(t, final.OutputFileID), rg.download(t, final.ErrorFileID)
	for _, l := range append(out, errs...) {
		seen[l.CustomID]++
	}
	for i := range n {
		if c := seen[fmt.Sprint("req-", i)]; c != 1 {
			t.Errorf("req-%d is %d times in the output and error files, want once", i, c)
		}
	}
	if len(out)+len(errs) != n {
		t.Errorf("%d output and %d error lines, want %d in all", len(out), len(errs), n)
	}
	for _, l := range out {
		if l.Response == nil || l.Response.StatusCode != 200 {
			t.Errorf("output line %s: %+v, want the gateway's 200", l.CustomID, l.Response)
		}
	}
	calls, distinct := gw.total()
	if distinct != n {
		t.Errorf("the gateway saw %d distinct lines, want %d", distinct, n)
	}
	t.Logf("%d gateway calls for %d lines (at least once: the calls cut by the kill ran again)", calls, n)
}
