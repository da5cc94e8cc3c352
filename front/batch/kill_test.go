package batch_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"go.uber.org/goleak"

	"github.com/sluice-io/sluice/core/app"
	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/submit"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/front/batch"
	"github.com/sluice-io/sluice/front/batch/redisstate"
	"github.com/sluice-io/sluice/front/filestore/disk"
	"github.com/sluice-io/sluice/gates/constant"
	"github.com/sluice-io/sluice/internal/testenv"
	rss "github.com/sluice-io/sluice/transports/redissortedset"
	"github.com/sluice-io/sluice/transports/redissortedset/producer"
	rstream "github.com/sluice-io/sluice/transports/redisstream"
)

// The front replica the kill test runs as a child process (the test
// binary again, with these variables set).
const (
	envFrontRedis  = "SLUICE_BATCH_TEST_FRONT_REDIS"
	envFrontDir    = "SLUICE_BATCH_TEST_FRONT_DIR"
	envFrontListen = "SLUICE_BATCH_TEST_FRONT_LISTEN"
	envFrontStream = "SLUICE_BATCH_TEST_FRONT_STREAM" // "1": the redis-stream producer
)

func TestMain(m *testing.M) {
	if url := os.Getenv(envFrontRedis); url != "" {
		if err := runFront(url, os.Getenv(envFrontDir), os.Getenv(envFrontListen), os.Getenv(envFrontStream) == "1"); err != nil {
			fmt.Fprintln(os.Stderr, "front:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	// Fail the package when a test leaves a goroutine behind (the front's
	// enqueuer, result reader, expiry sweep, HTTP server).
	goleak.VerifyTestMain(m)
}

// runFront is one front replica on Redis (state, queue, results) and a
// shared file directory, until it is killed; stream chooses the
// redis-stream producer over the sorted-set one.
func runFront(url, dir, listen string, stream bool) error {
	state, err := redisstate.Dial(url, "", transport.Env{})
	if err != nil {
		return err
	}
	files, err := disk.Open(disk.Config{Dir: dir})
	if err != nil {
		return err
	}
	var prod submit.Producer
	if stream {
		if prod, err = rstream.DialProducer(rstream.Options{Server: rstream.Server{URL: url}}, transport.Env{}, submit.ReaderOptions{Lease: time.Second}); err != nil {
			return err
		}
	} else {
		p, err := producer.Dial(url, producer.Config{})
		if err != nil {
			return err
		}
		prod = producer.NewSubmitter(p, submit.ReaderOptions{Lease: time.Second})
	}
	svc, err := batch.New(batch.Config{Queue: "kill-q", OwnerLease: time.Second, ScanInterval: 100 * time.Millisecond},
		state, files, prod, nil)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	go func() { _ = http.Serve(ln, svc.Handler()) }()
	return svc.Run(context.Background())
}

func startFront(t *testing.T, url, dir, listen string, stream bool) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envFrontRedis+"="+url, envFrontDir+"="+dir, envFrontListen+"="+listen)
	if stream {
		cmd.Env = append(cmd.Env, envFrontStream+"=1")
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd
}

// TestKillFrontMidJob: a front replica is killed (SIGKILL) while its job
// is half answered; another replica takes the job over once the
// ownership lease lapsed, and the output holds each custom_id exactly once.
// On redis-sortedset and on redis-stream.
func TestKillFrontMidJob(t *testing.T) {
	t.Run(rss.Name, func(t *testing.T) { killFrontMidJob(t, false) })
	t.Run(rstream.Name, func(t *testing.T) { killFrontMidJob(t, true) })
}

func killFrontMidJob(t *testing.T, stream bool) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	rg := &rig{}
	gw := startSlowGateway(t, 20*time.Millisecond)
	var tr transport.Transport
	var err error
	name := rss.Name
	if stream {
		name = rstream.Name
		tr, err = rstream.New(rstream.Options{Server: rstream.Server{URL: r.URL}, BlockMS: 50}, transport.Env{})
	} else {
		tr, err = rss.New(rss.Options{Server: rss.Server{URL: r.URL}, PollIntervalMS: 20}, nil)
	}
	if err != nil {
		t.Fatal(err)
	}
	ad := app.NewAdapters()
	if err := ad.Gates.Register(constant.Type, constant.Factory); err != nil {
		t.Fatal(err)
	}
	cfg := &config.Config{Transport: name, Concurrency: 4, MetricsPort: -1, HealthPort: -1,
		TransportConfig: config.TransportConfig{ResultQueueName: "kill-default-results",
			Queues: []config.Queue{{Queue: transport.Queue{Name: "kill-q"}, IGWBaseURL: gw, GateType: constant.Type}}}}
	a, err := app.New(cfg, app.Options{Adapters: ad, Transport: tr})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})

	dir := filepath.Join(t.TempDir(), "files")
	listen := "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
	first := startFront(t, r.URL, dir, listen, stream)
	rg.client = openai.NewClient(option.WithBaseURL("http://"+listen+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(5))
	waitTCP(t, listen)

	const n = 400
	b := rg.create(t, rg.upload(t, jsonl(n, nil)).ID)
	deadline := time.Now().Add(60 * time.Second)
	for {
		got, err := rg.client.Batches.Get(context.Background(), b.ID)
		if err == nil && got.RequestCounts.Completed >= n/4 {
			if got.RequestCounts.Completed == n {
				t.Fatalf("the job finished before the kill; make the gateway slower")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no progress: %+v %v", got, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := first.Process.Kill(); err != nil { // SIGKILL
		t.Fatal(err)
	}
	_ = first.Wait()
	startFront(t, r.URL, dir, listen, stream)
	waitTCP(t, listen)
	final := rg.waitStatus(t, b.ID, openai.BatchStatusCompleted, openai.BatchStatusFailed)
	if final.Status != openai.BatchStatusCompleted || final.RequestCounts.Completed != n {
		t.Fatalf("after the takeover: %s %+v", final.Status, final.RequestCounts)
	}
	out := rg.download(t, final.OutputFileID)
	seen := map[string]int{}
	for _, l := range out {
		seen[l.CustomID]++
	}
	for i := range n {
		if c := seen[fmt.Sprint("req-", i)]; c != 1 {
			t.Errorf("req-%d is %d times in the output, want once", i, c)
		}
	}
	if len(out) != n {
		t.Errorf("%d output lines, want %d", len(out), n)
	}
}

func startSlowGateway(t *testing.T, d time.Duration) string {
	t.Helper()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(d)
		var buf bytes.Buffer
		_, _ = buf.ReadFrom(r.Body)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"x","object":"chat.completion","choices":[]}`)
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String()
}

func waitTCP(t *testing.T, addr string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing listens on %s", addr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
