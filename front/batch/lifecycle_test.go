package batch_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/app"
	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/front/batch"
	"github.com/sluice-io/sluice/gates/constant"
	"github.com/sluice-io/sluice/transports/memory"
)

// The lifecycle of a batch end to end: a real sluice dispatches the
// front's queue to a gateway the test holds.

// heldGateway answers a chat completion once release is closed (400 for a
// "fail" message).
type heldGateway struct {
	url     string
	calls   atomic.Int64
	release chan struct{}
}

func startHeldGateway(t *testing.T) *heldGateway {
	t.Helper()
	g := &heldGateway{release: make(chan struct{})}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if len(body) == 0 {
			return // a probe
		}
		g.calls.Add(1)
		select {
		case <-g.release:
		case <-r.Context().Done():
			return
		}
		if strings.Contains(string(body), `"content":"fail"`) {
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(w, `{"error":{"message":"refused","type":"invalid_request_error"}}`)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"c","object":"chat.completion","choices":[],"usage":{"prompt_tokens":2,"completion_tokens":3,"total_tokens":5}}`)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() {
		select {
		case <-g.release:
		default:
			close(g.release)
		}
	})
	g.url = srv.URL
	return g
}

// dispatch runs a sluice on f's memory transport, dispatching its queue
// to gatewayURL with concurrency calls at most.
func (f *front) dispatch(t *testing.T, gatewayURL string, concurrency int) {
	t.Helper()
	ad := app.NewAdapters()
	if err := ad.Gates.Register(constant.Type, constant.Factory); err != nil {
		t.Fatal(err)
	}
	cfg := &config.Config{Transport: memory.Name, Concurrency: concurrency, MetricsPort: -1, HealthPort: -1,
		TransportConfig: config.TransportConfig{ResultQueueName: "default-results",
			Queues: []config.Queue{{Queue: transport.Queue{Name: smQueue}, IGWBaseURL: gatewayURL, GateType: constant.Type}}}}
	a, err := app.New(cfg, app.Options{Adapters: ad, Transport: f.mem})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("sluice: %v", err)
		}
	})
}

// waitObject polls the Batch object until ok says it is there.
func (f *front) waitObject(t *testing.T, id string, ok func(map[string]any) bool) map[string]any {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		status, obj := f.do(t, http.MethodGet, "/v1/batches/"+id, "")
		if status == 200 && ok(obj) {
			return obj
		}
		if time.Now().After(deadline) {
			t.Fatalf("batch %s: %d %v", id, status, obj)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// num reads a JSON number member (0 when absent or null).
func num(obj map[string]any, key string) int64 {
	v, _ := obj[key].(float64)
	return int64(v)
}

func counts(obj map[string]any) [3]int64 {
	c, _ := obj["request_counts"].(map[string]any)
	return [3]int64{num(c, "total"), num(c, "completed"), num(c, "failed")}
}

// TestLifecycleCompleted: validating → in_progress (counts total, no
// files, the later timestamps null) → finalizing → completed, each
// timestamp set in order and the others null; the output and error files
// are batch_output files that live output_expires_after; a completed batch
// cannot be cancelled.
func TestLifecycleCompleted(t *testing.T) {
	const n = 5
	f := newFront(t, backends(t)[0].open(t), batch.Config{})
	gw := startHeldGateway(t)
	f.dispatch(t, gw.url, n)
	status, up := upload(t, f, jsonl(n, map[int]string{2: "fail"}))
	if status != 200 {
		t.Fatalf("upload = %d %v", status, up)
	}
	status, obj := f.do(t, http.MethodPost, "/v1/batches", `{"input_file_id":"`+up["id"].(string)+`","endpoint":"/v1/chat/completions",`+
		`"completion_window":"24h","metadata":{"k":"v"},"output_expires_after":{"anchor":"created_at","seconds":7200}}`)
	if status != 200 || obj["status"] != batch.StatusValidating || obj["in_progress_at"] != nil {
		t.Fatalf("create = %d %v", status, obj)
	}
	id := obj["id"].(string)
	f.run()
	obj = f.waitObject(t, id, func(o map[string]any) bool { return o["status"] == batch.StatusInProgress && gw.calls.Load() == n })
	if counts(obj) != [3]int64{n, 0, 0} || obj["in_progress_at"] == nil || obj["model"] != "m1" {
		t.Fatalf("in progress: %v", obj)
	}
	for _, k := range []string{"finalizing_at", "completed_at", "failed_at", "expired_at", "cancelling_at", "cancelled_at", "output_file_id", "error_file_id"} {
		if obj[k] != nil {
			t.Errorf("in progress: %s = %v, want null", k, obj[k])
		}
	}
	if u, _ := obj["usage"].(map[string]any); u == nil || num(u, "total_tokens") != 0 {
		t.Errorf("usage in progress = %v, want zeros", obj["usage"])
	}
	close(gw.release)
	obj = f.waitObject(t, id, func(o map[string]any) bool { return batch.Final(fmt.Sprint(o["status"])) })
	if obj["status"] != batch.StatusCompleted || counts(obj) != [3]int64{n, n - 1, 1} {
		t.Fatalf("ended %v %v", obj["status"], obj["request_counts"])
	}
	at := []int64{num(obj, "created_at"), num(obj, "in_progress_at"), num(obj, "finalizing_at"), num(obj, "completed_at"), time.Now().Unix()}
	for i := 1; i < len(at); i++ {
		if at[i] == 0 || at[i] < at[i-1] {
			t.Errorf("created, in_progress, finalizing, completed, now = %v: not in order", at)
		}
	}
	for _, k := range []string{"failed_at", "expired_at", "cancelling_at", "cancelled_at", "errors"} {
		if obj[k] != nil {
			t.Errorf("%s = %v on a completed batch", k, obj[k])
		}
	}
	if num(obj, "expires_at")-num(obj, "created_at") != 24*3600 {
		t.Errorf("expires_at %d, created_at %d: not the 24h window", num(obj, "expires_at"), num(obj, "created_at"))
	}
	if u, _ := obj["usage"].(map[string]any); num(u, "total_tokens") != 5*(n-1) {
		t.Errorf("usage %v, want %d total tokens", u, 5*(n-1))
	}
	for _, file := range []struct {
		key   string
		lines int
	}{{"output_file_id", n - 1}, {"error_file_id", 1}} {
		fid, _ := obj[file.key].(string)
		status, fo := f.do(t, http.MethodGet, "/v1/files/"+fid, "")
		if status != 200 || fo["purpose"] != "batch_output" || num(fo, "expires_at")-num(fo, "created_at") != 7200 || fo["filename"] != fid+".jsonl" {
			t.Errorf("%s: %d %v", file.key, status, fo)
		}
		if got := len(f.lines(t, fid)); got != file.lines {
			t.Errorf("%s holds %d lines, want %d", file.key, got, file.lines)
		}
	}
	if status, _ := f.do(t, http.MethodPost, "/v1/batches/"+id+"/cancel", ""); status != http.StatusConflict {
		t.Errorf("cancel of a completed batch = %d, want 409", status)
	}
	if status, _ := f.do(t, http.MethodPost, "/v1/batches", `{"input_file_id":"`+obj["output_file_id"].(string)+`","endpoint":"/v1/chat/completions","completion_window":"24h"}`); status != 400 {
		t.Errorf("a batch on an output file = %d, want 400", status)
	}
}

// TestLifecycleExpired: a batch whose completion window ends with its
// lines unanswered (nobody dispatches its queue) goes finalizing, the
// queue told once to cancel it, and then expired: each line answered
// batch_expired, no output file, the queue left empty.
func TestLifecycleExpired(t *testing.T) {
	const n = 6
	f := newFront(t, backends(t)[0].open(t), batch.Config{Windows: []string{"2s"}})
	_, up := upload(t, f, jsonl(n, nil))
	status, obj := f.do(t, http.MethodPost, "/v1/batches", `{"input_file_id":"`+up["id"].(string)+`","endpoint":"/v1/chat/completions","completion_window":"2s"}`)
	if status != 200 || num(obj, "expires_at")-num(obj, "created_at") != 2 {
		t.Fatalf("create = %d %v", status, obj)
	}
	id := obj["id"].(string)
	f.run()
	obj = f.waitObject(t, id, func(o map[string]any) bool { return batch.Final(fmt.Sprint(o["status"])) })
	if obj["status"] != batch.StatusExpired || counts(obj) != [3]int64{n, 0, n} {
		t.Fatalf("ended %v %v, want expired with every line failed", obj["status"], obj["request_counts"])
	}
	if obj["expired_at"] == nil || obj["finalizing_at"] == nil || obj["in_progress_at"] == nil || obj["completed_at"] != nil || obj["output_file_id"] != nil {
		t.Errorf("expired batch %v", obj)
	}
	if num(obj, "expired_at") < num(obj, "expires_at") || num(obj, "finalizing_at") < num(obj, "expires_at") {
		t.Errorf("finalizing_at %d, expired_at %d before expires_at %d", num(obj, "finalizing_at"), num(obj, "expired_at"), num(obj, "expires_at"))
	}
	cancels, enqueued := f.prod.seen()
	if len(cancels) != 1 || cancels[0].JobID != id || len(enqueued) != n {
		t.Errorf("cancels %+v, %d enqueued; want one cancel of the job, %d enqueued", cancels, len(enqueued), n)
	}
	if d, _ := f.mem.Depth(context.Background(), transport.Queue{Name: smQueue}); d.Waiting != 0 {
		t.Errorf("%d requests left queued", d.Waiting)
	}
	errs := f.lines(t, obj["error_file_id"].(string))
	if len(errs) != n {
		t.Fatalf("%d error lines, want %d", len(errs), n)
	}
	for i, l := range errs {
		if l.CustomID != fmt.Sprint("req-", i) || l.Error == nil || l.Error.Code != "batch_expired" {
			t.Errorf("error line %d: %+v, want batch_expired", i, l.Error)
		}
	}
}

// TestLifecycleExpiredWhileDispatched: with a dispatcher running, the
// window's end is answered by the dispatcher itself (every line carries
// the batch's deadline: DEADLINE_EXCEEDED) before the front looks at the
// clock; the batch still ends expired, not completed.
func TestLifecycleExpiredWhileDispatched(t *testing.T) {
	const n = 6
	gw := startHeldGateway(t) // never released: every call outlives the window
	f := newFront(t, backends(t)[0].open(t), batch.Config{Windows: []string{"2s"}})
	f.dispatch(t, gw.url, n)
	_, up := upload(t, f, jsonl(n, nil))
	status, obj := f.do(t, http.MethodPost, "/v1/batches", `{"input_file_id":"`+up["id"].(string)+`","endpoint":"/v1/chat/completions","completion_window":"2s"}`)
	if status != 200 {
		t.Fatalf("create = %d %v", status, obj)
	}
	id := obj["id"].(string)
	f.run()
	obj = f.waitObject(t, id, func(o map[string]any) bool { return batch.Final(fmt.Sprint(o["status"])) })
	if obj["status"] != batch.StatusExpired || counts(obj) != [3]int64{n, 0, n} {
		t.Fatalf("ended %v %v, want expired with every line failed", obj["status"], obj["request_counts"])
	}
	if obj["expired_at"] == nil || obj["finalizing_at"] == nil || obj["completed_at"] != nil {
		t.Errorf("expired batch %v: want expired_at and finalizing_at, no completed_at", obj)
	}
	if gw.calls.Load() == 0 {
		t.Error("the dispatcher made no call: the case tests nothing")
	}
}

// upload posts data as a multipart upload of purpose batch.
func upload(t *testing.T, f *front, data []byte) (int, map[string]any) {
	t.Helper()
	return multipartUpload(t, f, [2]string{"purpose", "batch"}, [2]string{"file", string(data)})
}
