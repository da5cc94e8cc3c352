package batch_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/sluice-io/sluice/core/app"
	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/submit"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/front/batch"
	"github.com/sluice-io/sluice/front/batch/boltstate"
	"github.com/sluice-io/sluice/front/filestore/disk"
	"github.com/sluice-io/sluice/gates/constant"
	"github.com/sluice-io/sluice/transports/memory"
)

// rig is a real sluice (memory transport, a gateway) with the Batch API in
// front of it, driven by the official OpenAI client.
type rig struct {
	client  openai.Client
	gwCalls atomic.Int64
	hold    chan struct{} // when not nil, the gateway holds calls until it closes
	svc     *batch.Service
}

func newRig(t testing.TB, hold bool) *rig {
	t.Helper()
	rg := &rig{}
	if hold {
		rg.hold = make(chan struct{})
	}
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if len(body) == 0 {
			return // a probe
		}
		rg.gwCalls.Add(1)
		if rg.hold != nil {
			select {
			case <-rg.hold:
			case <-r.Context().Done():
				return
			}
		}
		var in struct {
			Model    string `json:"model"`
			Messages []struct {
				Content string `json:"content"`
			} `json:"messages"`
		}
		_ = json.Unmarshal(body, &in)
		if len(in.Messages) > 0 && in.Messages[0].Content == "fail" {
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(w, `{"error":{"message":"refused","type":"invalid_request_error"}}`)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"chatcmpl-1","object":"chat.completion","model":%q,"path":%q,"choices":[{"index":0,"message":{"role":"assistant","content":"echo %s"},"finish_reason":"stop"}],`+
			`"usage":{"prompt_tokens":%d,"completion_tokens":5,"total_tokens":%d,"prompt_tokens_details":{"cached_tokens":1},"completion_tokens_details":{"reasoning_tokens":2}}}`,
			in.Model, r.URL.Path, in.Messages[0].Content, len(in.Messages[0].Content), len(in.Messages[0].Content)+5)
	}))
	t.Cleanup(gw.Close)
	if hold {
		t.Cleanup(func() {
			select {
			case <-rg.hold:
			default:
				close(rg.hold)
			}
		})
	}

	ad := app.NewAdapters()
	if err := ad.Gates.Register(constant.Type, constant.Factory); err != nil {
		t.Fatal(err)
	}
	mem := memory.New(memory.Options{})
	cfg := &config.Config{
		Transport: memory.Name, Concurrency: 16, MetricsPort: -1, HealthPort: -1,
		TransportConfig: config.TransportConfig{ResultQueueName: "results",
			Queues: []config.Queue{{Queue: transport.Queue{Name: "batch"}, IGWBaseURL: gw.URL, GateType: constant.Type}}},
	}
	a, err := app.New(cfg, app.Options{Adapters: ad, Transport: mem})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	files, err := disk.Open(disk.Config{Dir: filepath.Join(dir, "files")})
	if err != nil {
		t.Fatal(err)
	}
	state, err := boltstate.Open(filepath.Join(dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	svc, err := batch.New(batch.Config{Queue: "batch", ScanInterval: 50 * time.Millisecond, CancelQuiet: 300 * time.Millisecond},
		state, files, memory.NewProducer(mem, submit.ReaderOptions{}), nil)
	if err != nil {
		t.Fatal(err)
	}
	rg.svc = svc
	ctx, cancel := context.WithCancel(context.Background())
	appDone, svcDone := make(chan error, 1), make(chan error, 1)
	go func() { appDone <- a.Run(ctx) }()
	go func() { svcDone <- svc.Run(ctx) }()
	api := httptest.NewServer(svc.Handler())
	t.Cleanup(func() {
		api.Close()
		cancel()
		if err := <-svcDone; err != nil {
			t.Errorf("batch service: %v", err)
		}
		if err := <-appDone; err != nil {
			t.Errorf("sluice: %v", err)
		}
		_ = state.Close()
	})
	rg.client = openai.NewClient(option.WithBaseURL(api.URL+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	return rg
}

// jsonl returns n chat-completion lines; contents[i] overrides line i's content.
func jsonl(n int, contents map[int]string) []byte {
	var b bytes.Buffer
	for i := range n {
		c := fmt.Sprint("hello ", i)
		if v, ok := contents[i]; ok {
			c = v
		}
		fmt.Fprintf(&b, `{"custom_id":"req-%d","method":"POST","url":"/v1/chat/completions","body":{"model":"m1","messages":[{"role":"user","content":%q}]}}`+"\n", i, c)
	}
	return b.Bytes()
}

func (rg *rig) upload(t testing.TB, body []byte) *openai.FileObject {
	t.Helper()
	f, err := rg.client.Files.New(context.Background(), openai.FileNewParams{
		File:    openai.File(bytes.NewReader(body), "input.jsonl", "application/jsonl"),
		Purpose: openai.FilePurposeBatch,
	})
	if err != nil {
		t.Fatalf("upload: %v", err)
	}
	return f
}

func (rg *rig) create(t testing.TB, fileID string) *openai.Batch {
	t.Helper()
	b, err := rg.client.Batches.New(context.Background(), openai.BatchNewParams{
		InputFileID: fileID, Endpoint: openai.BatchNewParamsEndpointV1ChatCompletions,
		CompletionWindow: openai.BatchNewParamsCompletionWindow24h,
		Metadata:         map[string]string{"team": "t1"},
	})
	if err != nil {
		t.Fatalf("create batch: %v", err)
	}
	return b
}

func (rg *rig) waitStatus(t testing.TB, id string, want ...openai.BatchStatus) *openai.Batch {
	t.Helper()
	deadline := time.Now().Add(5 * time.Minute)
	for {
		b, err := rg.client.Batches.Get(context.Background(), id)
		if err != nil {
			t.Fatalf("get batch: %v", err)
		}
		for _, w := range want {
			if b.Status == w {
				return b
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("batch %s: status %s, counts %+v; want %v", id, b.Status, b.RequestCounts, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

type outLine struct {
	ID       string `json:"id"`
	CustomID string `json:"custom_id"`
	Response *struct {
		StatusCode int             `json:"status_code"`
		RequestID  string          `json:"request_id"`
		Body       json.RawMessage `json:"body"`
	} `json:"response"`
	Error *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func (rg *rig) download(t testing.TB, id string) []outLine {
	t.Helper()
	if id == "" {
		return nil
	}
	resp, err := rg.client.Files.Content(context.Background(), id)
	if err != nil {
		t.Fatalf("download %s: %v", id, err)
	}
	defer resp.Body.Close()
	var out []outLine
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var l outLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("%s: line %q: %v", id, sc.Text(), err)
		}
		out = append(out, l)
	}
	return out
}

func TestOpenAIClientBatchCompletes(t *testing.T) {
	rg := newRig(t, false)
	const n = 150
	f := rg.upload(t, jsonl(n, map[int]string{7: "fail"}))
	if f.Purpose != "batch" || f.Bytes == 0 || !strings.HasPrefix(f.ID, "file-") {
		t.Fatalf("uploaded file = %+v", f)
	}
	got, err := rg.client.Files.Get(context.Background(), f.ID)
	if err != nil || got.ID != f.ID || got.Filename != "input.jsonl" {
		t.Fatalf("retrieve file = %+v, %v", got, err)
	}
	b := rg.create(t, f.ID)
	if b.Status != openai.BatchStatusValidating || b.InputFileID != f.ID || b.Metadata["team"] != "t1" || b.ExpiresAt-b.CreatedAt != 24*3600 {
		t.Fatalf("created batch = %+v", b)
	}
	done := rg.waitStatus(t, b.ID, openai.BatchStatusCompleted, openai.BatchStatusFailed)
	if done.Status != openai.BatchStatusCompleted {
		t.Fatalf("batch ended %s: %+v", done.Status, done.Errors)
	}
	if done.RequestCounts.Total != n || done.RequestCounts.Completed != n-1 || done.RequestCounts.Failed != 1 {
		t.Errorf("request_counts = %+v, want %d total, %d completed, 1 failed", done.RequestCounts, n, n-1)
	}
	if done.InProgressAt == 0 || done.FinalizingAt == 0 || done.CompletedAt == 0 || done.Model != "m1" {
		t.Errorf("timestamps/model = %+v", done)
	}
	// usage: the gateway's usage of every answered line, summed (the
	// refused line has none): prompt tokens = the content's length.
	var in int64
	for i := range n {
		if i != 7 {
			in += int64(len(fmt.Sprint("hello ", i)))
		}
	}
	u := done.Usage
	if u.InputTokens != in || u.OutputTokens != 5*(n-1) || u.TotalTokens != in+5*(n-1) ||
		u.InputTokensDetails.CachedTokens != n-1 || u.OutputTokensDetails.ReasoningTokens != 2*(n-1) {
		t.Errorf("usage = %+v, want input %d, output %d, total %d, cached %d, reasoning %d", u, in, 5*(n-1), in+5*(n-1), n-1, 2*(n-1))
	}
	out, errs := rg.download(t, done.OutputFileID), rg.download(t, done.ErrorFileID)
	if len(out) != n-1 || len(errs) != 1 {
		t.Fatalf("%d output lines and %d error lines, want %d and 1", len(out), len(errs), n-1)
	}
	seen := map[string]bool{}
	for _, l := range append(out, errs...) {
		if seen[l.CustomID] {
			t.Errorf("custom_id %s twice", l.CustomID)
		}
		seen[l.CustomID] = true
	}
	for _, l := range out {
		if l.Response == nil || l.Response.StatusCode != 200 || l.Error != nil || !strings.HasPrefix(l.ID, "batch_req_") {
			t.Fatalf("output line %+v", l)
		}
		var body struct {
			Path    string `json:"path"`
			Choices []struct {
				Message struct{ Content string } `json:"message"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(l.Response.Body, &body); err != nil || body.Path != "/v1/chat/completions" ||
			body.Choices[0].Message.Content != "echo hello "+strings.TrimPrefix(l.CustomID, "req-") {
			t.Fatalf("output line %s: body %s (%v)", l.CustomID, l.Response.Body, err)
		}
	}
	if e := errs[0]; e.CustomID != "req-7" || e.Response == nil || e.Response.StatusCode != 400 {
		t.Errorf("error line = %+v, want req-7 with the gateway's 400", e)
	}
	// Listing: the batch and both files (input, output, errors).
	page, err := rg.client.Batches.List(context.Background(), openai.BatchListParams{Limit: openai.Int(10)})
	if err != nil || len(page.Data) != 1 || page.Data[0].ID != b.ID {
		t.Fatalf("list batches = %+v, %v", page, err)
	}
	files, err := rg.client.Files.List(context.Background(), openai.FileListParams{Limit: openai.Int(2)})
	if err != nil || len(files.Data) != 2 || !files.HasMore {
		t.Fatalf("list files (limit 2) = %d, more %v, %v", len(files.Data), files.HasMore, err)
	}
	next, err := files.GetNextPage()
	if err != nil || next == nil || len(next.Data) != 1 || next.Data[0].ID != f.ID {
		t.Fatalf("next page of files = %+v, %v", next, err)
	}
	del, err := rg.client.Files.Delete(context.Background(), f.ID)
	if err != nil || !del.Deleted {
		t.Fatalf("delete = %+v, %v", del, err)
	}
	if _, err := rg.client.Files.Get(context.Background(), f.ID); err == nil {
		t.Error("the deleted file is still there")
	}
}

func TestOpenAIClientInvalidFileFails(t *testing.T) {
	rg := newRig(t, false)
	body := append(jsonl(3, nil), []byte(`{"custom_id":"req-0","method":"POST","url":"/v1/chat/completions","body":{"model":"m1"}}`+"\nnot json\n"+
		`{"custom_id":"x","method":"POST","url":"/v1/chat/completions","body":{"model":"m2"}}`+"\n")...)
	b := rg.create(t, rg.upload(t, body).ID)
	done := rg.waitStatus(t, b.ID, openai.BatchStatusFailed, openai.BatchStatusCompleted)
	if done.Status != openai.BatchStatusFailed || done.FailedAt == 0 {
		t.Fatalf("status %s, want failed", done.Status)
	}
	want := map[int64]string{4: "duplicate_custom_id", 5: "invalid_json_line", 6: "mismatched_model"}
	if len(done.Errors.Data) != len(want) {
		t.Fatalf("errors = %+v, want %v", done.Errors.Data, want)
	}
	for _, e := range done.Errors.Data {
		if want[e.Line] != e.Code {
			t.Errorf("error %+v, want line %d: %s", e, e.Line, want[e.Line])
		}
	}
	if rg.gwCalls.Load() != 0 {
		t.Errorf("%d gateway calls for a batch that failed validation", rg.gwCalls.Load())
	}
}

func TestOpenAIClientCancel(t *testing.T) {
	rg := newRig(t, true) // the gateway holds every call: 16 in flight, the rest queued
	const n = 100
	b := rg.create(t, rg.upload(t, jsonl(n, nil)).ID)
	rg.waitStatus(t, b.ID, openai.BatchStatusInProgress)
	deadline := time.Now().Add(30 * time.Second)
	for rg.gwCalls.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	c, err := rg.client.Batches.Cancel(context.Background(), b.ID)
	if err != nil || c.Status != openai.BatchStatusCancelling || c.CancellingAt == 0 {
		t.Fatalf("cancel = %+v, %v", c, err)
	}
	done := rg.waitStatus(t, b.ID, openai.BatchStatusCancelled)
	if done.CancelledAt == 0 || done.RequestCounts.Total != n || done.RequestCounts.Completed+done.RequestCounts.Failed != n {
		t.Errorf("cancelled batch = %+v", done)
	}
	errs := rg.download(t, done.ErrorFileID)
	out := rg.download(t, done.OutputFileID)
	if len(errs)+len(out) != n {
		t.Fatalf("%d error + %d output lines, want %d", len(errs), len(out), n)
	}
	seen := map[string]bool{}
	for _, l := range append(errs, out...) {
		if seen[l.CustomID] {
			t.Errorf("custom_id %s twice", l.CustomID)
		}
		seen[l.CustomID] = true
	}
	for _, l := range errs {
		if l.Error == nil || l.Error.Code != "batch_cancelled" {
			t.Errorf("error line %+v, want batch_cancelled", l)
		}
	}
	if calls := rg.gwCalls.Load(); calls > 16 {
		t.Errorf("%d gateway calls, want at most the 16 in flight (the queued ones removed)", calls)
	}
	if _, err := rg.client.Batches.Cancel(context.Background(), b.ID); err != nil {
		t.Errorf("cancelling a cancelled batch again: %v", err)
	}
}

// BenchmarkBatch50k: a 50,000-line file end to end (upload to the
// downloaded output) through a real sluice on the memory transport and an
// instant gateway; reports lines/s.
//
//	go test -run '^$' -bench Batch50k -benchtime 1x ./front/batch/
func BenchmarkBatch50k(b *testing.B) {
	const n = 50000
	input := jsonl(n, nil)
	for b.Loop() {
		rg := newRig(b, false)
		start := time.Now()
		job := rg.create(b, rg.upload(b, input).ID)
		done := rg.waitStatus(b, job.ID, openai.BatchStatusCompleted, openai.BatchStatusFailed)
		if out := rg.download(b, done.OutputFileID); len(out) != n {
			b.Fatalf("%d output lines, want %d (%s)", len(out), n, done.Status)
		}
		b.ReportMetric(float64(n)/time.Since(start).Seconds(), "lines/s")
	}
}
