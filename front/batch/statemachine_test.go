package batch_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/submit"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/front/batch"
	"github.com/sluice-io/sluice/front/batch/boltstate"
	"github.com/sluice-io/sluice/front/batch/redisstate"
	"github.com/sluice-io/sluice/front/filestore/disk"
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/transports/memory"
)

// The state machine of a batch, checked from the store up: a replica
// handed a job in any state (a front that stopped there and another that
// takes over) carries it to the final status the state calls for, and the
// API allows in each state what OpenAI's Batch API allows.

// backend is a State store the state machine is checked on.
type backend struct {
	name string
	open func(t *testing.T) batch.State // a fresh, empty store, closed at the end of t
}

// backends returns bolt and Redis (one redis-server for the calling test,
// one key prefix per store).
func backends(t *testing.T) []backend {
	var r *testenv.Redis
	var n atomic.Int64
	return []backend{
		{"bolt", func(t *testing.T) batch.State {
			s, err := boltstate.Open(filepath.Join(t.TempDir(), "state.db"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			return s
		}},
		{"redis", func(st *testing.T) batch.State {
			if r == nil {
				r = testenv.StartRedis(t, testenv.RedisOptions{})
			}
			s, err := redisstate.Dial(r.URL, fmt.Sprintf("sm%d:", n.Add(1)), transport.Env{})
			if err != nil {
				st.Fatal(err)
			}
			st.Cleanup(func() { _ = s.Close() })
			return s
		}},
	}
}

// watchingProducer is the memory producer, noting the cancels and the
// requests enqueued through it.
type watchingProducer struct {
	submit.Producer
	mu       sync.Mutex
	cancels  []transport.Cancellation
	enqueued []string // request ids, in order
}

func (p *watchingProducer) Enqueue(ctx context.Context, queue string, reqs []*wire.Request) error {
	p.mu.Lock()
	for _, r := range reqs {
		p.enqueued = append(p.enqueued, r.ID)
	}
	p.mu.Unlock()
	return p.Producer.Enqueue(ctx, queue, reqs)
}

func (p *watchingProducer) Cancel(ctx context.Context, queue string, c transport.Cancellation) (int, error) {
	p.mu.Lock()
	p.cancels = append(p.cancels, c)
	p.mu.Unlock()
	return p.Producer.Cancel(ctx, queue, c)
}

func (p *watchingProducer) seen() (cancels []transport.Cancellation, enqueued []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.cancels), slices.Clone(p.enqueued)
}

// front is one Batch API replica on a store and a memory transport that no
// dispatcher reads: the test plays the dispatcher (or nobody does).
type front struct {
	state batch.State
	files *disk.Store
	mem   *memory.Transport
	prod  *watchingProducer
	svc   *batch.Service
	api   *httptest.Server
	run   func() // starts the service's loop (once)
}

const (
	smQueue   = "sm-q"
	smInputID = "file-in"
)

func newFront(t *testing.T, state batch.State, cfg batch.Config) *front {
	t.Helper()
	files, err := disk.Open(disk.Config{Dir: filepath.Join(t.TempDir(), "files")})
	if err != nil {
		t.Fatal(err)
	}
	mem := memory.New(memory.Options{})
	f := &front{state: state, files: files, mem: mem, prod: &watchingProducer{Producer: memory.NewProducer(mem, submit.ReaderOptions{})}}
	cfg.Queue = smQueue
	if cfg.ScanInterval == 0 {
		cfg.ScanInterval = 20 * time.Millisecond
	}
	if cfg.CancelQuiet == 0 {
		cfg.CancelQuiet = 100 * time.Millisecond
	}
	if f.svc, err = batch.New(cfg, state, files, f.prod, nil); err != nil {
		t.Fatal(err)
	}
	f.api = httptest.NewServer(f.svc.Handler())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var once sync.Once
	started := false
	f.run = func() {
		once.Do(func() {
			started = true
			go func() { done <- f.svc.Run(ctx) }()
		})
	}
	t.Cleanup(func() {
		f.api.Close()
		cancel()
		if started {
			if err := <-done; err != nil {
				t.Errorf("batch service: %v", err)
			}
		}
		_ = mem.Close()
	})
	return f
}

// putInput stores jsonl(n) as the input file smInputID, content and record.
func (f *front) putInput(t *testing.T, n int) {
	t.Helper()
	data := jsonl(n, nil)
	size, err := f.files.Put(context.Background(), smInputID, bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.state.PutFile(context.Background(), batch.File{ID: smInputID, Bytes: size, CreatedAt: time.Now().Unix(),
		Filename: "input.jsonl", Purpose: "batch", Lines: n}); err != nil {
		t.Fatal(err)
	}
}

// answered is the record of line i of job id as the dispatcher's 200
// would make it.
func answered(id string, i int) batch.Record {
	return batch.Record{Index: i, OK: true, Line: fmt.Appendf(nil,
		`{"id":"batch_req_%s-%d","custom_id":"req-%d","response":{"status_code":200,"request_id":"%s-%d","body":{"n":%d}},"error":null}`, id, i, i, id, i, i)}
}

// do calls the API with a JSON body (none when "") and decodes its JSON
// answer (nil when it is not JSON).
func (f *front) do(t *testing.T, method, path, body string) (int, map[string]any) {
	t.Helper()
	contentType := ""
	if body != "" {
		contentType = "application/json"
	}
	return f.send(t, method, path, contentType, strings.NewReader(body))
}

// send calls the API with body of contentType and decodes its JSON answer.
func (f *front) send(t *testing.T, method, path, contentType string, body io.Reader) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, f.api.URL+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	b, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(b, &m)
	return resp.StatusCode, m
}

// waitFinal polls the store until job id is in a final status.
func (f *front) waitFinal(t *testing.T, id string) batch.Job {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		j, err := f.state.GetJob(context.Background(), id)
		if err == nil && batch.Final(j.Status) {
			return j
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s: %s %+v, %v; want a final status", id, j.Status, j.Counts, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// lines reads file id's lines (none when id is "").
func (f *front) lines(t *testing.T, id string) []outLine {
	t.Helper()
	if id == "" {
		return nil
	}
	rc, err := f.files.Open(context.Background(), id, 0)
	if err != nil {
		t.Fatalf("open %s: %v", id, err)
	}
	defer rc.Close()
	var out []outLine
	dec := json.NewDecoder(rc)
	for dec.More() {
		var l outLine
		if err := dec.Decode(&l); err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		out = append(out, l)
	}
	return out
}

// TestResumeFromEachState: a replica takes over a job left in each
// non-final state (by a replica that stopped there) and ends it as the
// state says: every line answered → completed (or expired when the expiry
// answered them, cancelled when cancelling); lines missing when cancelling
// or past expires_at → the queue is told once, and each missing line is
// answered batch_cancelled or batch_expired in the error file. On bolt and
// on Redis.
func TestResumeFromEachState(t *testing.T) {
	const n = 4
	type tc struct {
		name       string
		job        func(j *batch.Job, now int64)
		recorded   []int  // lines answered before the takeover
		want       string // final status
		cancels    int    // Producer.Cancel calls by the new owner
		missing    string // error code of the lines the new owner answers
		keepFinAt  bool   // finalizing_at is the seeded one
		wantFinAt  bool   // finalizing_at set at the end
		wantCancAt bool   // cancelling_at set at the end
	}
	all := []int{0, 1, 2, 3}
	cases := []tc{
		{name: "in_progress/all answered", job: func(j *batch.Job, now int64) {}, recorded: all,
			want: batch.StatusCompleted, wantFinAt: true},
		{name: "finalizing/all answered (stopped before the files)", job: func(j *batch.Job, now int64) {
			j.Status, j.FinalizingAt = batch.StatusFinalizing, now-5
		}, recorded: all, want: batch.StatusCompleted, keepFinAt: true, wantFinAt: true},
		{name: "finalizing/expiry answered every line", job: func(j *batch.Job, now int64) {
			j.Status, j.FinalizingAt, j.CancelSent = batch.StatusFinalizing, now-5, true
		}, recorded: all, want: batch.StatusExpired, keepFinAt: true, wantFinAt: true},
		{name: "finalizing/lines missing, queue not told", job: func(j *batch.Job, now int64) {
			j.Status, j.FinalizingAt = batch.StatusFinalizing, now-5
		}, recorded: []int{0, 1}, want: batch.StatusExpired, cancels: 1, missing: "batch_expired", keepFinAt: true, wantFinAt: true},
		{name: "finalizing/lines missing, queue told", job: func(j *batch.Job, now int64) {
			j.Status, j.FinalizingAt, j.CancelSent = batch.StatusFinalizing, now-5, true
		}, recorded: []int{2}, want: batch.StatusExpired, missing: "batch_expired", keepFinAt: true, wantFinAt: true},
		{name: "in_progress/past expires_at", job: func(j *batch.Job, now int64) {
			j.ExpiresAt = now - 1
		}, recorded: []int{3}, want: batch.StatusExpired, cancels: 1, missing: "batch_expired", wantFinAt: true},
		{name: "cancelling/queue not told", job: func(j *batch.Job, now int64) {
			j.Status, j.CancellingAt = batch.StatusCancelling, now-5
		}, recorded: []int{1}, want: batch.StatusCancelled, cancels: 1, missing: "batch_cancelled", wantCancAt: true},
		{name: "cancelling/queue told", job: func(j *batch.Job, now int64) {
			j.Status, j.CancellingAt, j.CancelSent = batch.StatusCancelling, now-5, true
		}, recorded: []int{1, 2}, want: batch.StatusCancelled, missing: "batch_cancelled", wantCancAt: true},
		{name: "cancelling/all answered", job: func(j *batch.Job, now int64) {
			j.Status, j.CancellingAt = batch.StatusCancelling, now-5
		}, recorded: all, want: batch.StatusCancelled, wantCancAt: true},
	}
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					ctx := context.Background()
					f := newFront(t, b.open(t), batch.Config{})
					f.putInput(t, n)
					now := time.Now().Unix()
					j := batch.Job{ID: "batch_resume", Endpoint: "/v1/chat/completions", InputFileID: smInputID, CompletionWindow: "24h",
						Status: batch.StatusInProgress, Model: "m1", CreatedAt: now - 60, InProgressAt: now - 59, ExpiresAt: now + 3600,
						Enqueued: n, Counts: batch.Counts{Total: n}}
					c.job(&j, now)
					seededFinAt := j.FinalizingAt
					if err := f.state.CreateJob(ctx, j); err != nil {
						t.Fatal(err)
					}
					var recs []batch.Record
					for _, i := range c.recorded {
						recs = append(recs, answered(j.ID, i))
					}
					if _, err := f.state.Record(ctx, j.ID, recs); err != nil {
						t.Fatal(err)
					}
					f.run()
					got := f.waitFinal(t, j.ID)
					if got.Status != c.want {
						t.Fatalf("status %s, want %s", got.Status, c.want)
					}
					if got.Counts != (batch.Counts{Total: n, Completed: int64(len(c.recorded)), Failed: int64(n - len(c.recorded))}) {
						t.Errorf("request_counts %+v, want %d completed, %d failed", got.Counts, len(c.recorded), n-len(c.recorded))
					}
					at := map[string]int64{batch.StatusCompleted: got.CompletedAt, batch.StatusExpired: got.ExpiredAt, batch.StatusCancelled: got.CancelledAt}
					for status, v := range at {
						if (v != 0) != (status == c.want) {
							t.Errorf("%s_at = %d with status %s", status, v, c.want)
						}
					}
					if (got.FinalizingAt != 0) != c.wantFinAt || (c.keepFinAt && got.FinalizingAt != seededFinAt) {
						t.Errorf("finalizing_at = %d (seeded %d)", got.FinalizingAt, seededFinAt)
					}
					if (got.CancellingAt != 0) != c.wantCancAt {
						t.Errorf("cancelling_at = %d", got.CancellingAt)
					}
					if got.FailedAt != 0 || len(got.Errors) > 0 {
						t.Errorf("failed_at %d, errors %+v for a batch that did not fail", got.FailedAt, got.Errors)
					}
					cancels, enqueued := f.prod.seen()
					if len(cancels) != c.cancels || (len(cancels) > 0 && cancels[0].JobID != j.ID) {
						t.Errorf("cancels %+v, want %d of job %s", cancels, c.cancels, j.ID)
					}
					if len(enqueued) > 0 {
						t.Errorf("enqueued %v again for a job enqueued whole", enqueued)
					}
					out, errs := f.lines(t, got.OutputFileID), f.lines(t, got.ErrorFileID)
					if len(out) != len(c.recorded) || len(errs) != n-len(c.recorded) {
						t.Fatalf("%d output, %d error lines; want %d and %d", len(out), len(errs), len(c.recorded), n-len(c.recorded))
					}
					if (got.ErrorFileID == "") != (len(errs) == 0) {
						t.Errorf("error_file_id %q with %d error lines", got.ErrorFileID, len(errs))
					}
					seen := map[string]int{}
					for _, l := range out {
						seen[l.CustomID]++
						if l.Response == nil || l.Response.StatusCode != 200 || l.Error != nil {
							t.Errorf("output line %+v", l)
						}
					}
					for _, l := range errs {
						seen[l.CustomID]++
						if l.Response != nil || l.Error == nil || l.Error.Code != c.missing || !strings.HasPrefix(l.ID, "batch_req_"+j.ID+"-") {
							t.Errorf("error line %+v, want %s", l, c.missing)
						}
					}
					for i := range n {
						if seen[fmt.Sprint("req-", i)] != 1 {
							t.Errorf("req-%d is %d times in the files", i, seen[fmt.Sprint("req-", i)])
						}
					}
					if got.Usage == nil {
						t.Error("usage not set when the batch ended")
					}
					if active, err := f.state.ActiveJobs(ctx); err != nil || slices.Contains(active, j.ID) {
						t.Errorf("active jobs %v (%v) after the job ended", active, err)
					}
				})
			}
		})
	}
}

// TestResumeEnqueuesFromProgress: a replica taking over a job enqueues
// only the lines not recorded as enqueued (from `enqueued`; from the start
// for a job still validating), each once; cancelled then, the lines
// removed from the queue are answered batch_cancelled.
func TestResumeEnqueuesFromProgress(t *testing.T) {
	const n = 6
	for _, c := range []struct {
		name     string
		status   string
		enqueued int
		want     []int // lines enqueued by the new owner
	}{
		{"validating", batch.StatusValidating, 0, []int{0, 1, 2, 3, 4, 5}},
		{"in_progress/first chunks enqueued", batch.StatusInProgress, 4, []int{4, 5}},
		{"in_progress/all enqueued", batch.StatusInProgress, n, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			f := newFront(t, backends(t)[0].open(t), batch.Config{ChunkSize: 2})
			f.putInput(t, n)
			now := time.Now().Unix()
			j := batch.Job{ID: "batch_enq", Endpoint: "/v1/chat/completions", InputFileID: smInputID, CompletionWindow: "24h",
				Status: c.status, CreatedAt: now, ExpiresAt: now + 3600, Enqueued: c.enqueued}
			if c.status != batch.StatusValidating {
				j.InProgressAt, j.Model, j.Counts.Total = now, "m1", n
			}
			if err := f.state.CreateJob(ctx, j); err != nil {
				t.Fatal(err)
			}
			f.run()
			var want []string
			for _, i := range c.want {
				want = append(want, fmt.Sprint(j.ID, "-", i))
			}
			deadline := time.Now().Add(30 * time.Second)
			for {
				got, err := f.state.GetJob(ctx, j.ID)
				if err == nil && got.Status == batch.StatusInProgress && got.Enqueued == n {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("job %s enqueued %d of %d, %v", got.Status, got.Enqueued, n, err)
				}
				time.Sleep(10 * time.Millisecond)
			}
			if _, enqueued := f.prod.seen(); !slices.Equal(enqueued, want) {
				t.Fatalf("enqueued %v, want %v", enqueued, want)
			}
			if d, _ := f.mem.Depth(ctx, transport.Queue{Name: smQueue}); d.Waiting != int64(len(want)) {
				t.Fatalf("the queue holds %d, want %d", d.Waiting, len(want))
			}
			if status, _ := f.do(t, http.MethodPost, "/v1/batches/"+j.ID+"/cancel", ""); status != http.StatusOK {
				t.Fatalf("cancel: %d", status)
			}
			got := f.waitFinal(t, j.ID)
			if got.Status != batch.StatusCancelled || got.Counts.Failed != n || got.OutputFileID != "" {
				t.Fatalf("after the cancel: %s %+v output %q", got.Status, got.Counts, got.OutputFileID)
			}
			if d, _ := f.mem.Depth(ctx, transport.Queue{Name: smQueue}); d.Waiting != 0 {
				t.Errorf("the cancel left %d requests queued", d.Waiting)
			}
			errs := f.lines(t, got.ErrorFileID)
			if len(errs) != n {
				t.Fatalf("%d error lines, want %d", len(errs), n)
			}
			for i, l := range errs {
				if l.CustomID != fmt.Sprint("req-", i) || l.Error == nil || l.Error.Code != "batch_cancelled" {
					t.Errorf("error line %d: %+v", i, l)
				}
			}
		})
	}
}

// TestOwnedJobWaitsForItsLease: a job another replica owns (a live lease)
// is left alone until that lease lapses; then it is taken and ended.
func TestOwnedJobWaitsForItsLease(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			f := newFront(t, b.open(t), batch.Config{})
			f.putInput(t, 2)
			now := time.Now().Unix()
			j := batch.Job{ID: "batch_owned", Endpoint: "/v1/chat/completions", InputFileID: smInputID, CompletionWindow: "24h",
				Status: batch.StatusInProgress, CreatedAt: now, InProgressAt: now, ExpiresAt: now + 3600, Enqueued: 2, Counts: batch.Counts{Total: 2}}
			if err := f.state.CreateJob(ctx, j); err != nil {
				t.Fatal(err)
			}
			if _, err := f.state.Record(ctx, j.ID, []batch.Record{answered(j.ID, 0), answered(j.ID, 1)}); err != nil {
				t.Fatal(err)
			}
			const lease = 1500 * time.Millisecond
			if ok, err := f.state.Own(ctx, j.ID, "another-replica", lease); err != nil || !ok {
				t.Fatalf("own: %v %v", ok, err)
			}
			owned := time.Now()
			f.run()
			time.Sleep(lease / 2)
			if got, _ := f.state.GetJob(ctx, j.ID); got.Status != batch.StatusInProgress {
				t.Fatalf("status %s while another replica owns the job", got.Status)
			}
			got := f.waitFinal(t, j.ID)
			if took := time.Since(owned); got.Status != batch.StatusCompleted || took < lease {
				t.Fatalf("%s after %v, want completed once the %v lease lapsed", got.Status, took, lease)
			}
		})
	}
}

// TestFinalStates: a batch in a final status is not taken up again (not
// active, nothing read or cancelled for it), can be retrieved and listed,
// and cannot be cancelled (409), but for a cancelled one, which answers as
// it is; a batch not yet final moves to cancelling once (cancelling_at
// kept). On bolt and on Redis.
func TestFinalStates(t *testing.T) {
	statuses := []struct {
		status string
		cancel int    // the cancel's HTTP status
		after  string // the status after the cancel
	}{
		{batch.StatusValidating, 200, batch.StatusCancelling},
		{batch.StatusInProgress, 200, batch.StatusCancelling},
		{batch.StatusCancelling, 200, batch.StatusCancelling},
		{batch.StatusCompleted, 409, batch.StatusCompleted},
		{batch.StatusFailed, 409, batch.StatusFailed},
		{batch.StatusExpired, 409, batch.StatusExpired},
		{batch.StatusCancelled, 200, batch.StatusCancelled},
	}
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			f := newFront(t, b.open(t), batch.Config{}) // its loop is not run: the store is what is checked
			var ids []string
			for i, s := range statuses {
				j := batch.Job{ID: fmt.Sprintf("batch_%02d_%s", i, s.status), Endpoint: "/v1/chat/completions", InputFileID: smInputID,
					CompletionWindow: "24h", Status: s.status, CreatedAt: int64(1000 + i), CancellingAt: 77, Counts: batch.Counts{Total: 3}}
				if s.status != batch.StatusCancelling {
					j.CancellingAt = 0
				}
				if err := f.state.CreateJob(ctx, j); err != nil {
					t.Fatal(err)
				}
				ids = append(ids, j.ID)
			}
			active, err := f.state.ActiveJobs(ctx)
			if err != nil {
				t.Fatal(err)
			}
			slices.Sort(active)
			if want := ids[:3]; !slices.Equal(active, want) {
				t.Errorf("active jobs %v, want %v", active, want)
			}
			// Listed newest first, in pages.
			status, list := f.do(t, http.MethodGet, "/v1/batches?limit=4", "")
			data, _ := list["data"].([]any)
			if status != 200 || len(data) != 4 || list["has_more"] != true || list["first_id"] != ids[6] || list["last_id"] != ids[3] {
				t.Fatalf("list = %d %v", status, list)
			}
			_, list = f.do(t, http.MethodGet, "/v1/batches?limit=4&after="+ids[3], "")
			if data, _ = list["data"].([]any); len(data) != 3 || list["has_more"] != false || list["last_id"] != ids[0] {
				t.Fatalf("second page = %v", list)
			}
			for i, s := range statuses {
				t.Run(s.status, func(t *testing.T) {
					status, obj := f.do(t, http.MethodGet, "/v1/batches/"+ids[i], "")
					if status != 200 || obj["status"] != s.status || obj["object"] != "batch" || obj["id"] != ids[i] {
						t.Fatalf("retrieve = %d %v", status, obj)
					}
					status, obj = f.do(t, http.MethodPost, "/v1/batches/"+ids[i]+"/cancel", "")
					if status != s.cancel {
						t.Fatalf("cancel = %d %v, want %d", status, obj, s.cancel)
					}
					if status == 409 {
						e, _ := obj["error"].(map[string]any)
						if e["type"] != "invalid_request_error" || !strings.Contains(fmt.Sprint(e["message"]), s.status) {
							t.Errorf("409 body %v", obj)
						}
					} else if obj["status"] != s.after {
						t.Errorf("cancel answered status %v, want %s", obj["status"], s.after)
					}
					j, err := f.state.GetJob(ctx, ids[i])
					if err != nil || j.Status != s.after {
						t.Fatalf("stored status %s (%v), want %s", j.Status, err, s.after)
					}
					switch {
					case s.status == batch.StatusCancelling && j.CancellingAt != 77:
						t.Errorf("cancelling again moved cancelling_at to %d", j.CancellingAt)
					case s.after == batch.StatusCancelling && j.CancellingAt == 0:
						t.Error("cancelling_at not set")
					case s.after != batch.StatusCancelling && j.CancellingAt != 0:
						t.Errorf("cancelling_at %d on a batch that did not move", j.CancellingAt)
					}
				})
			}
			// The final ones are not taken up: the loop opens no route and
			// cancels nothing for them, and they stay as they are.
			for _, id := range ids[:3] {
				if err := f.state.DeleteJob(ctx, id); err != nil {
					t.Fatal(err)
				}
			}
			f.run()
			time.Sleep(200 * time.Millisecond)
			if cancels, enqueued := f.prod.seen(); len(cancels)+len(enqueued) > 0 {
				t.Errorf("a final batch was taken up: cancels %v, enqueued %v", cancels, enqueued)
			}
			for i, s := range statuses[3:] {
				if j, _ := f.state.GetJob(ctx, ids[3+i]); j.Status != s.status || j.OutputFileID != "" || j.ErrorFileID != "" {
					t.Errorf("%s became %s (files %q %q)", ids[3+i], j.Status, j.OutputFileID, j.ErrorFileID)
				}
			}
			if status, obj := f.do(t, http.MethodPost, "/v1/batches/batch_none/cancel", ""); status != 404 {
				t.Errorf("cancel of a missing batch = %d %v", status, obj)
			}
			if status, obj := f.do(t, http.MethodGet, "/v1/batches/batch_none", ""); status != 404 {
				t.Errorf("retrieve of a missing batch = %d %v", status, obj)
			}
		})
	}
}

// TestValidationFails: a batch whose input cannot be run fails in
// validating (failed_at and errors set, never in progress), queues
// nothing, has no files, and cannot be cancelled.
func TestValidationFails(t *testing.T) {
	twoEndpoints := string(jsonl(2, nil)) + `{"custom_id":"x","method":"POST","url":"/v1/completions","body":{"model":"m1","prompt":"p"}}` + "\n"
	for _, c := range []struct {
		name     string
		input    string // "" with gone: the file's content is deleted
		gone     bool
		maxLines int
		code     string
		line     int
	}{
		{name: "input file gone", input: string(jsonl(2, nil)), gone: true, code: "file_not_found"},
		{name: "no requests", input: "\n  \n", code: "empty_file"},
		{name: "too many requests", input: string(jsonl(4, nil)), maxLines: 3, code: "too_many_requests"},
		{name: "a line of another endpoint", input: twoEndpoints, code: "mismatched_endpoint", line: 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			f := newFront(t, backends(t)[0].open(t), batch.Config{MaxLines: c.maxLines})
			size, err := f.files.Put(ctx, smInputID, strings.NewReader(c.input))
			if err != nil {
				t.Fatal(err)
			}
			if err := f.state.PutFile(ctx, batch.File{ID: smInputID, Bytes: size, Purpose: "batch", Lines: strings.Count(c.input, "\n")}); err != nil {
				t.Fatal(err)
			}
			status, obj := f.do(t, http.MethodPost, "/v1/batches", `{"input_file_id":"`+smInputID+`","endpoint":"/v1/chat/completions","completion_window":"24h"}`)
			if status != 200 || obj["status"] != batch.StatusValidating {
				t.Fatalf("create = %d %v", status, obj)
			}
			id := obj["id"].(string)
			if c.gone {
				if err := f.files.Delete(ctx, smInputID); err != nil {
					t.Fatal(err)
				}
			}
			f.run()
			j := f.waitFinal(t, id)
			if j.Status != batch.StatusFailed || j.FailedAt == 0 || j.InProgressAt != 0 || j.FinalizingAt != 0 {
				t.Fatalf("job %s, failed_at %d, in_progress_at %d, finalizing_at %d", j.Status, j.FailedAt, j.InProgressAt, j.FinalizingAt)
			}
			if len(j.Errors) == 0 || j.Errors[0].Code != c.code || j.Errors[0].Line != c.line || j.Errors[0].Message == "" {
				t.Fatalf("errors %+v, want %s at line %d", j.Errors, c.code, c.line)
			}
			_, obj = f.do(t, http.MethodGet, "/v1/batches/"+id, "")
			errs, _ := obj["errors"].(map[string]any)
			if data, _ := errs["data"].([]any); errs["object"] != "list" || len(data) != len(j.Errors) {
				t.Errorf("errors of the Batch object: %v", obj["errors"])
			}
			if obj["output_file_id"] != nil || obj["error_file_id"] != nil || obj["in_progress_at"] != nil {
				t.Errorf("a failed batch has %v, %v, in_progress_at %v", obj["output_file_id"], obj["error_file_id"], obj["in_progress_at"])
			}
			if cancels, enqueued := f.prod.seen(); len(cancels)+len(enqueued) > 0 {
				t.Errorf("a batch that failed validation queued %v, cancelled %v", enqueued, cancels)
			}
			if status, _ := f.do(t, http.MethodPost, "/v1/batches/"+id+"/cancel", ""); status != http.StatusConflict {
				t.Errorf("cancel of a failed batch = %d, want 409", status)
			}
		})
	}
}

// TestCancelWhileValidating: a batch cancelled before any replica took it
// up ends cancelled with nothing queued, no counts and no files.
func TestCancelWhileValidating(t *testing.T) {
	f := newFront(t, backends(t)[0].open(t), batch.Config{})
	f.putInput(t, 3)
	status, obj := f.do(t, http.MethodPost, "/v1/batches", `{"input_file_id":"`+smInputID+`","endpoint":"/v1/chat/completions","completion_window":"24h"}`)
	if status != 200 {
		t.Fatalf("create = %d %v", status, obj)
	}
	id := obj["id"].(string)
	if status, obj = f.do(t, http.MethodPost, "/v1/batches/"+id+"/cancel", ""); status != 200 || obj["status"] != batch.StatusCancelling || obj["cancelling_at"] == nil {
		t.Fatalf("cancel = %d %v", status, obj)
	}
	f.run()
	j := f.waitFinal(t, id)
	if j.Status != batch.StatusCancelled || j.CancelledAt == 0 || j.InProgressAt != 0 || j.Counts != (batch.Counts{}) {
		t.Fatalf("job %s, cancelled_at %d, in_progress_at %d, counts %+v", j.Status, j.CancelledAt, j.InProgressAt, j.Counts)
	}
	if j.OutputFileID != "" || j.ErrorFileID != "" {
		t.Errorf("files %q %q for a batch cancelled before it ran", j.OutputFileID, j.ErrorFileID)
	}
	if _, enqueued := f.prod.seen(); len(enqueued) > 0 {
		t.Errorf("queued %v for a batch cancelled while validating", enqueued)
	}
}

// cancelLandsInValidation is a State on which a cancel of the API lands
// while a job validates: just before the update that ends its validation.
type cancelLandsInValidation struct {
	batch.State
	once sync.Once
}

func (s *cancelLandsInValidation) UpdateJob(ctx context.Context, id string, fn func(*batch.Job) error) (batch.Job, error) {
	if j, err := s.State.GetJob(ctx, id); err == nil && j.Status == batch.StatusValidating {
		s.once.Do(func() {
			_, _ = s.State.UpdateJob(ctx, id, func(j *batch.Job) error {
				j.Status, j.CancellingAt = batch.StatusCancelling, time.Now().Unix()
				return nil
			})
		})
	}
	return s.State.UpdateJob(ctx, id, fn)
}

// TestCancelDuringValidation: a cancel that lands while the job validates
// wins: the job is not moved to in_progress, nothing is queued, and it
// ends cancelled.
func TestCancelDuringValidation(t *testing.T) {
	ctx := context.Background()
	f := newFront(t, &cancelLandsInValidation{State: backends(t)[0].open(t)}, batch.Config{})
	f.putInput(t, 3)
	now := time.Now().Unix()
	j := batch.Job{ID: "batch_race", Endpoint: "/v1/chat/completions", InputFileID: smInputID, CompletionWindow: "24h",
		Status: batch.StatusValidating, CreatedAt: now, ExpiresAt: now + 3600}
	if err := f.state.CreateJob(ctx, j); err != nil {
		t.Fatal(err)
	}
	f.run()
	got := f.waitFinal(t, j.ID)
	if got.Status != batch.StatusCancelled || got.InProgressAt != 0 || got.CancelledAt == 0 {
		t.Fatalf("job %s, in_progress_at %d, cancelled_at %d; want cancelled, never in progress", got.Status, got.InProgressAt, got.CancelledAt)
	}
	if _, enqueued := f.prod.seen(); len(enqueued) > 0 {
		t.Errorf("queued %v for a batch cancelled while it validated", enqueued)
	}
}
