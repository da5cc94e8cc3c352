package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
	oa "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/sluice-io/sluice/internal/testenv"
)

// echoGateway is an inference gateway answering each chat completion with
// "echo: " and the last message, counting the calls.
func echoGateway(t *testing.T) (url string, calls *atomic.Int64) {
	calls = new(atomic.Int64)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Model    string `json:"model"`
			Messages []struct {
				Content string `json:"content"`
			} `json:"messages"`
		}
		if r.URL.Path != "/v1/chat/completions" || json.NewDecoder(r.Body).Decode(&req) != nil || len(req.Messages) == 0 {
			http.Error(w, "want a chat completion", http.StatusBadRequest)
			return
		}
		calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"chatcmpl-1","object":"chat.completion","created":1764633600,"model":%q,`+
			`"choices":[{"index":0,"message":{"role":"assistant","content":%q},"finish_reason":"stop"}],`+
			`"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}`,
			req.Model, "echo: "+req.Messages[len(req.Messages)-1].Content)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, calls
}

// serveConfig starts `sluice serve` on the config doc (JSON) and returns
// its metrics port and a stop that waits for serve to end cleanly.
func serveConfig(t *testing.T, doc string, listens ...string) (metrics int, stop func()) {
	t.Helper()
	f := writeFile(t, "sluice.json", doc)
	if out, err := run(t, "validate", "--config", f); err != nil || !strings.HasPrefix(out, "ok:") {
		t.Fatalf("validate: %q %v", out, err)
	}
	metrics = testenv.FreePort(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, _, err := runCLI(t, ctx, "", "serve", "--config", f, "--metrics-port", strconv.Itoa(metrics), "--listen-host", "127.0.0.1",
			"--health-port", "-1", "--drain-timeout", "5s")
		done <- err
	}()
	for _, l := range listens {
		waitListening(t, l, done)
	}
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	}
	t.Cleanup(stop)
	return metrics, stop
}

// chat makes one chat completion through the front at addr with the
// official client and checks the gateway's answer came back.
func chat(t *testing.T, addr, prompt string) {
	t.Helper()
	c := oa.NewClient(option.WithBaseURL("http://"+addr+"/v1/"), option.WithAPIKey("test"), option.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var raw *http.Response
	resp, err := c.Chat.Completions.New(ctx, oa.ChatCompletionNewParams{
		Model: "test-model", Messages: []oa.ChatCompletionMessageParamUnion{oa.UserMessage(prompt)},
	}, option.WithResponseInto(&raw))
	if err != nil {
		t.Fatalf("chat completion: %v", err)
	}
	if len(resp.Choices) != 1 || resp.Choices[0].Message.Content != "echo: "+prompt || resp.Model != "test-model" || resp.Usage.TotalTokens != 5 {
		t.Fatalf("response %+v", resp)
	}
	if raw.Header.Get("X-Sluice-Request-Id") == "" {
		t.Fatalf("no X-Sluice-Request-Id on the answer: %v", raw.Header)
	}
}

// TestServeOpenAIAPI: `sluice serve` with openai_api on (memory transport)
// answers a chat completion of the official OpenAI client with the
// gateway's answer, through a queue, and lists the front on the status
// page; a queue the config does not name is refused.
func TestServeOpenAIAPI(t *testing.T) {
	gw, calls := echoGateway(t)
	api := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	metrics, stop := serveConfig(t, fmt.Sprintf(`{
  "transport": "memory",
  "transport_config": {"result_queue_name": "results", "queues": [{"id": "chat", "queue_name": "chat-q", "igw_base_url": %q}]},
  "openai_api": {"enabled": true, "listen": %q, "default_timeout": "30s"}
}`, gw, api), api)
	chat(t, api, "hello through a queue")
	if n := calls.Load(); n != 1 {
		t.Errorf("gateway got %d calls, want 1", n)
	}
	// X-Sluice-Queue takes the queues the config allows (the default alone).
	req, _ := http.NewRequest(http.MethodPost, "http://"+api+"/v1/chat/completions",
		strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"x"}]}`))
	req.Header.Set("X-Sluice-Queue", "elsewhere")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("unknown queue: %s, want 400", resp.Status)
	}
	var page struct {
		Extra []struct{ Label, Value string } `json:"extra"`
	}
	getJSON(t, fmt.Sprintf("http://127.0.0.1:%d/status.json", metrics), &page)
	if len(page.Extra) == 0 || page.Extra[0].Label != "OpenAI API" || !strings.Contains(page.Extra[0].Value, api) {
		t.Errorf("status page extra %+v: no line for the OpenAI API", page.Extra)
	}
	stop()
}

// TestServeBatchAPIOnS3: `sluice serve` with batch_api on an s3 file store
// (gofakes3 over real HTTP, credentials from the environment through the
// store's default chain) and openai_api beside it on the same producer: a batch
// completes with its input and output objects in the bucket under the
// prefix, and a chat completion is answered too.
func TestServeBatchAPIOnS3(t *testing.T) {
	backend := s3mem.New()
	var signed atomic.Int64 // requests signed with the environment's key
	h := gofakes3.New(backend).Server()
	fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.Header.Get("Authorization"), "Credential=AKTEST/") {
			signed.Add(1)
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(fake.Close)
	t.Setenv("AWS_ACCESS_KEY_ID", "AKTEST")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "test")
	t.Setenv("AWS_REGION", "us-east-1")
	const bucket = "sluice-files"
	if err := backend.CreateBucket(bucket); err != nil {
		t.Fatalf("create bucket: %v", err)
	}

	gw, calls := echoGateway(t)
	batchAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	openaiAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	_, stop := serveConfig(t, fmt.Sprintf(`{
  "transport": "memory",
  "transport_config": {"result_queue_name": "results", "queues": [{"id": "batch", "queue_name": "batch", "igw_base_url": %q}]},
  "batch_api": {"enabled": true, "listen": %q,
    "files": {"store": "s3", "bucket": %q, "prefix": "files/", "endpoint": %q, "path_style": true},
    "state": {"store": "bolt", "path": %q}},
  "openai_api": {"enabled": true, "listen": %q}
}`, gw, batchAddr, bucket, fake.URL, t.TempDir()+"/state.db", openaiAddr), batchAddr, openaiAddr)

	const n = 4
	_, job := completeBatch(t, batchAddr, n, 30*time.Second)
	if job.RequestCounts.Completed != n || job.OutputFileID == "" {
		t.Fatalf("batch %+v", job)
	}

	// The output is an object in the bucket, read from the fake's backend.
	obj, err := backend.GetObject(bucket, "files/"+job.OutputFileID, nil)
	if err != nil {
		t.Fatalf("output object files/%s: %v", job.OutputFileID, err)
	}
	body, _ := io.ReadAll(obj.Contents)
	obj.Contents.Close()
	checkEchoOutput(t, body, n)
	if _, err := backend.HeadObject(bucket, "files/"+job.InputFileID); err != nil {
		t.Errorf("input object files/%s: %v", job.InputFileID, err)
	}
	if signed.Load() == 0 {
		t.Error("no request to the store was signed with the environment's key")
	}

	chat(t, openaiAddr, "beside a batch")
	if got := calls.Load(); got != n+1 {
		t.Errorf("gateway got %d calls, want %d", got, n+1)
	}
	stop()
}

// TestValidateFronts: `sluice validate` reports the fronts' own checks
// (front/openai's and the file stores') beside the config's, with where.
func TestValidateFronts(t *testing.T) {
	base := `"transport": "memory", "transport_config": {"result_queue_name": "r", "queues": [{"id": "q", "queue_name": "q", "igw_base_url": "http://127.0.0.1:8000"}]}`
	for _, tc := range []struct{ section, want string }{
		{`"openai_api": {"enabled": true, "default_timeout": "2h"}`, "openai_api: default_timeout 2h0m0s is above max_timeout 1h0m0s"},
		{`"openai_api": {"enabled": true, "forward_headers": ["Authorization"]}`, `openai_api: forward_headers: "Authorization" cannot be forwarded`},
		{`"openai_api": {"enabled": true, "default_queue": "other"}`, `openai_api.default_queue: "other" names no configured queue`},
		{`"openai_api": {"enabled": true, "tls": true}`, "openai_api.tls: unknown field"},
		{`"batch_api": {"enabled": true, "files": {"store": "gcs"}}`, "batch_api.files: gcs filestore: bucket is empty"}, // the store's own rule
		{`"batch_api": {"enabled": true, "files": {"store": "s3", "bucket": "b", "dir": "d"}}`, "batch_api.files.dir: not a setting of the s3 store"},
	} {
		f := writeFile(t, "sluice.json", "{"+base+", "+tc.section+"}")
		out, err := run(t, "validate", "--config", f)
		if err == nil || !strings.Contains(out, tc.want) {
			t.Errorf("%s: %q %v, want %q", tc.section, out, err, tc.want)
		}
	}
}

// TestServeFrontsOnRedisStream: `sluice serve` on the redis-stream
// transport (a real redis-server) with batch_api (Redis state) and
// openai_api beside it, both on the redis-stream producer: a batch
// completes with each custom_id once, each the gateway's answer to its own
// line, and a chat completion is answered. A result_mode the fronts cannot
// read (stream) is refused by `sluice validate`.
func TestServeFrontsOnRedisStream(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	gw, calls := echoGateway(t)
	batchAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	openaiAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	doc := func(resultMode string) string {
		return fmt.Sprintf(`{
  "transport": "redis-stream", "redis_url": %q,
  "transport_config": {"result_queue_name": "results", "block_ms": 50, "result_mode": %q,
    "queues": [{"id": "batch", "queue_name": "batch-stream", "igw_base_url": %q}]},
  "batch_api": {"enabled": true, "listen": %q, "files": {"dir": %q}, "state": {"store": "redis"}},
  "openai_api": {"enabled": true, "listen": %q}
}`, r.URL, resultMode, gw, batchAddr, t.TempDir(), openaiAddr)
	}
	out, err := run(t, "validate", "--config", writeFile(t, "stream.json", doc("stream")))
	if err == nil || !strings.Contains(out, `redis-stream result_mode "stream"`) {
		t.Errorf("validate with result_mode stream: %q %v, want it refused", out, err)
	}
	_, stop := serveConfig(t, doc("list"), batchAddr, openaiAddr)

	const n = 20
	ctx := context.Background()
	c, job := completeBatch(t, batchAddr, n, 30*time.Second)
	if job.RequestCounts.Completed != n || job.OutputFileID == "" || job.Usage.TotalTokens != 5*n {
		t.Fatalf("batch %s %+v, usage %+v", job.Status, job.RequestCounts, job.Usage)
	}
	resp, err := c.Files.Content(ctx, job.OutputFileID)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	checkEchoOutput(t, body, n)
	chat(t, openaiAddr, "on a stream")
	if got := calls.Load(); got != n+1 {
		t.Errorf("gateway got %d calls, want %d", got, n+1)
	}
	stop()
}

// checkEchoOutput checks a batch output file of n lines c0..c<n-1> answered
// by the echo gateway: each custom_id once, each a 200 whose one choice
// checkJobOutput downloads job's output file and checks it as
// checkEchoOutput does.
func checkJobOutput(t *testing.T, c oa.Client, job *oa.Batch, n int) {
	t.Helper()
	resp, err := c.Files.Content(context.Background(), job.OutputFileID)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	checkEchoOutput(t, body, n)
}

// echoes its line.
func checkEchoOutput(t *testing.T, body []byte, n int) {
	t.Helper()
	seen := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSpace(string(body)), "\n") {
		var o struct {
			CustomID string `json:"custom_id"`
			Response struct {
				StatusCode int `json:"status_code"`
				Body       struct {
					Choices []struct {
						Message struct{ Content string } `json:"message"`
					} `json:"choices"`
				} `json:"body"`
			} `json:"response"`
		}
		if err := json.Unmarshal([]byte(l), &o); err != nil || o.Response.StatusCode != 200 || len(o.Response.Body.Choices) != 1 ||
			o.Response.Body.Choices[0].Message.Content != "echo: line "+strings.TrimPrefix(o.CustomID, "c") || seen[o.CustomID] {
			t.Errorf("output line %s (%v)", l, err)
		}
		seen[o.CustomID] = true
	}
	if len(seen) != n {
		t.Errorf("output holds %d custom_ids, want %d:\n%s", len(seen), n, body)
	}
}

// TestServeFrontsOverTLS: the fronts reach a redis-server that listens only
// on TLS, with a private CA and client certificates, as the dispatcher
// does: through the deployment's redis_tls, or redis-sortedset's own tls_*
// options. A batch completes (its state in Redis too, through redis_tls)
// and a chat completion is answered.
func TestServeFrontsOverTLS(t *testing.T) {
	srv := testenv.StartRedisTLS(t)
	gw, _ := echoGateway(t)
	redisTLS := fmt.Sprintf(`{"ca_cert": %q, "cert": %q, "key": %q}`, srv.CAFile, srv.CertFile, srv.KeyFile)
	for i, tc := range []struct{ name, deployment, options, state string }{
		{"redis-sortedset, redis_tls", fmt.Sprintf(`"redis_tls": %s,`, redisTLS), `"prefix": "tls-rss"`, "redis"},
		// The batch state store takes redis_url and redis_tls alone: here on disk.
		{"redis-sortedset, tls_* options", "", fmt.Sprintf(`"prefix": "tls-own", "tls_ca_cert": %q, "tls_cert": %q, "tls_key": %q`,
			srv.CAFile, srv.CertFile, srv.KeyFile), "bolt"},
		{"redis-stream, redis_tls", fmt.Sprintf(`"redis_tls": %s,`, redisTLS), `"block_ms": 50`, "redis"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := strings.SplitN(tc.name, ",", 2)[0]
			batchAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
			openaiAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
			queue := "tls-" + strings.NewReplacer(" ", "", ",", "-", "*", "").Replace(tc.name)
			_, stop := serveConfig(t, fmt.Sprintf(`{
  "transport": %q, "redis_url": %q, %s
  "transport_config": {"result_queue_name": "results", %s,
    "queues": [{"id": "batch", "queue_name": %q, "igw_base_url": %q}]},
  "batch_api": {"enabled": true, "listen": %q, "files": {"dir": %q}, "state": {"store": %q, "prefix": "tls-state-%d:", "path": %q}},
  "openai_api": {"enabled": true, "listen": %q}
}`, tr, srv.URL, tc.deployment, tc.options, queue, gw, batchAddr, t.TempDir(), tc.state, i, filepath.Join(t.TempDir(), "state.db"), openaiAddr),
				batchAddr, openaiAddr)
			chat(t, openaiAddr, "over TLS")
			const n = 3
			c, job := completeBatch(t, batchAddr, n, 20*time.Second)
			if job.RequestCounts.Completed != n || job.OutputFileID == "" {
				t.Fatalf("batch %+v, want %d completed", job.RequestCounts, n)
			}
			checkJobOutput(t, c, job, n)
			stop()
		})
	}
}

// completeBatch runs a batch of n chat completions ("line <i>", custom_id
// c<i>) through the Batch API at addr with the official client and waits
// up to within for it to complete.
func completeBatch(t *testing.T, addr string, n int, within time.Duration) (oa.Client, *oa.Batch) {
	t.Helper()
	var input bytes.Buffer
	for i := range n {
		fmt.Fprintf(&input, `{"custom_id":"c%d","method":"POST","url":"/v1/chat/completions","body":{"model":"m","messages":[{"role":"user","content":"line %d"}]}}`+"\n", i, i)
	}
	ctx := context.Background()
	c := oa.NewClient(option.WithBaseURL("http://"+addr+"/v1/"), option.WithAPIKey("test"), option.WithMaxRetries(0))
	file, err := c.Files.New(ctx, oa.FileNewParams{File: oa.File(bytes.NewReader(input.Bytes()), "in.jsonl", "application/jsonl"), Purpose: oa.FilePurposeBatch})
	if err != nil {
		t.Fatalf("upload: %v", err)
	}
	job, err := c.Batches.New(ctx, oa.BatchNewParams{InputFileID: file.ID, Endpoint: oa.BatchNewParamsEndpointV1ChatCompletions, CompletionWindow: oa.BatchNewParamsCompletionWindow24h})
	if err != nil {
		t.Fatalf("create batch: %v", err)
	}
	for deadline := time.Now().Add(within); job.Status != oa.BatchStatusCompleted; {
		if time.Now().After(deadline) {
			t.Fatalf("batch status %s %+v after %s", job.Status, job.RequestCounts, within)
		}
		time.Sleep(100 * time.Millisecond)
		if job, err = c.Batches.Get(ctx, job.ID); err != nil {
			t.Fatal(err)
		}
	}
	return c, job
}
