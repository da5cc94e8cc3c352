package simulator

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

type completionResponse struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index   int    `json:"index"`
		Text    string `json:"text"`
		Message *struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		TotalTokens      int `json:"total_tokens"`
	} `json:"usage"`
}

func TestCompletionRoutes(t *testing.T) {
	s, base, c := startSim(t, Config{})
	tests := []struct {
		path, body, idPrefix, object, model string
		chat                                bool
	}{
		{PathCompletions, `{"model":"Qwen/Qwen3-0.6B","prompt":"What is 2+2?","max_tokens":8}`, "cmpl-", "text_completion", "Qwen/Qwen3-0.6B", false},
		{PathCompletions, `{"prompt":"no model"}`, "cmpl-", "text_completion", "sim", false},
		{PathChatCompletions, `{"messages":[{"role":"user","content":"hi","model":"inner"}],"model":"m\"1"}`, "chatcmpl-", "chat.completion", `m"1`, true},
		{PathChatCompletions, ` {"model":7} `, "chatcmpl-", "chat.completion", "sim", true},
	}
	ids := map[string]bool{}
	before := time.Now().Unix()
	for _, tt := range tests {
		resp, body := mustPost(t, c, base+tt.path, tt.body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: status %d: %s", tt.path, resp.StatusCode, body)
		}
		if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("Content-Type %q", ct)
		}
		var got completionResponse
		if err := json.Unmarshal(body, &got); err != nil {
			t.Fatalf("%s: %v in %s", tt.path, err, body)
		}
		if !strings.HasPrefix(got.ID, tt.idPrefix) || ids[got.ID] {
			t.Errorf("id %q: want a fresh %s<n>", got.ID, tt.idPrefix)
		}
		ids[got.ID] = true
		if got.Object != tt.object || got.Model != tt.model || got.Created < before {
			t.Errorf("object %q model %q created %d, want %q %q >= %d", got.Object, got.Model, got.Created, tt.object, tt.model, before)
		}
		if len(got.Choices) != 1 || got.Choices[0].FinishReason != "stop" {
			t.Fatalf("choices %+v", got.Choices)
		}
		ch := got.Choices[0]
		if tt.chat && (ch.Message == nil || ch.Message.Role != "assistant" || ch.Message.Content == "") {
			t.Errorf("chat choice %+v lacks an assistant message", ch)
		}
		if !tt.chat && ch.Text == "" {
			t.Errorf("completion choice %+v lacks text", ch)
		}
		u := got.Usage
		if u.PromptTokens < 1 || u.CompletionTokens < 1 || u.TotalTokens != u.PromptTokens+u.CompletionTokens {
			t.Errorf("usage %+v", u)
		}
	}
	st := s.Stats()
	if st.Requests != 4 || st.OK != 4 || st.ByPath[PathCompletions] != 2 || st.ByPath[PathChatCompletions] != 2 {
		t.Fatalf("stats %+v", st)
	}
}

func TestInvalidBodies(t *testing.T) {
	s, base, c := startSim(t, Config{MaxBodyBytes: 64})
	for _, body := range []string{"", "  ", "[]", `"text"`, "null", "42", "not json", `{"model":`, `{"a":1}x`, `{"a":1}{}`} {
		resp, b := mustPost(t, c, base+PathChatCompletions, body)
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("body %q: status %d, want 400", body, resp.StatusCode)
			continue
		}
		if e := decodeError(t, b); e.Error.Type != "invalid_request_error" {
			t.Errorf("body %q: error type %q", body, e.Error.Type)
		}
	}
	resp, b := mustPost(t, c, base+PathCompletions, `{"prompt":"`+strings.Repeat("x", 100)+`"}`)
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("large body: status %d, want 413", resp.StatusCode)
	}
	decodeError(t, b)
	if st := s.Stats(); st.Status4xx != 11 || st.ByStatus[400] != 10 || st.OK != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestOtherRoutes(t *testing.T) {
	s, base, c := startSim(t, Config{})
	get := func(method, path string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest(method, base+path, nil)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	if resp, body := get(http.MethodGet, PathHealthz); resp.StatusCode != 200 || body != "ok\n" {
		t.Errorf("healthz: %d %q", resp.StatusCode, body)
	}
	if resp, _ := get(http.MethodHead, PathHealthz); resp.StatusCode != 200 {
		t.Errorf("HEAD healthz: %d", resp.StatusCode)
	}
	if resp, body := get(http.MethodGet, "/v1/models/x"); resp.StatusCode != 404 {
		t.Errorf("unknown path: %d %q", resp.StatusCode, body)
	} else {
		decodeError(t, []byte(body))
	}
	if resp, _ := get(http.MethodGet, PathChatCompletions); resp.StatusCode != 405 || resp.Header.Get("Allow") != "POST" {
		t.Errorf("GET chat: %d Allow %q", resp.StatusCode, resp.Header.Get("Allow"))
	}
	if resp, _ := get(http.MethodPost, PathMetrics); resp.StatusCode != 405 {
		t.Errorf("POST metrics: %d", resp.StatusCode)
	}
	st := s.Stats()
	if st.Requests != 0 || st.ByPath[PathHealthz] != 2 || st.ByPath["other"] != 1 || st.ByPath[PathMetrics] != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestLatencyHonoured(t *testing.T) {
	_, base, c := startSim(t, Config{Latency: Fixed(150 * time.Millisecond)})
	start := time.Now()
	resp, _ := mustPost(t, c, base+PathCompletions, `{}`)
	if el := time.Since(start); resp.StatusCode != 200 || el < 140*time.Millisecond || el > 5*time.Second {
		t.Fatalf("status %d after %v, want 200 after about 150ms", resp.StatusCode, el)
	}
	// The header overrides the configured latency, both ways.
	start = time.Now()
	mustPost(t, c, base+PathCompletions, `{}`, HeaderLatencyMS, "0")
	if el := time.Since(start); el > 120*time.Millisecond {
		t.Errorf("latency override 0 took %v", el)
	}
	start = time.Now()
	mustPost(t, c, base+PathCompletions, `{}`, HeaderLatencyMS, "300.5")
	if el := time.Since(start); el < 290*time.Millisecond {
		t.Errorf("latency override 300.5ms took %v", el)
	}
}

func TestClientGoneAbortsWait(t *testing.T) {
	s, base, c := startSim(t, Config{Latency: Fixed(time.Minute)})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, _, err := post(ctx, c, base+PathCompletions, `{}`); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want the client's deadline", err)
	}
	eventually(t, "the handler to give up", func() bool {
		st := s.Stats()
		return st.Aborted == 1 && st.Inflight == 0
	})
	if el := time.Since(start); el > 10*time.Second {
		t.Fatalf("handler gave up after %v", el)
	}
}

func TestForcedOutcomes(t *testing.T) {
	// Every sampled request would be a 5xx: the headers must win.
	s, base, c := startSim(t, Config{Rate5xx: 1, RetryAfter: 1500 * time.Millisecond})
	tests := []struct {
		headers    []string
		status     int
		retryAfter string
		errType    string
	}{
		{[]string{HeaderStatus, "200"}, 200, "", ""},
		{[]string{HeaderStatus, "429"}, 429, "2", "rate_limit_error"},
		{[]string{HeaderStatus, "429", HeaderRetryAfter, "7"}, 429, "7", "rate_limit_error"},
		{[]string{HeaderStatus, "500"}, 500, "", "server_error"},
		{[]string{HeaderStatus, "504"}, 504, "", "server_error"},
		{[]string{HeaderStatus, "408"}, 408, "", "invalid_request_error"},
		{nil, 503, "", "server_error"},
		{[]string{HeaderStatus, "302"}, 400, "", "invalid_request_error"},
		{[]string{HeaderStatus, "ok"}, 400, "", "invalid_request_error"},
		{[]string{HeaderLatencyMS, "-1"}, 400, "", "invalid_request_error"},
		{[]string{HeaderLatencyMS, "soon"}, 400, "", "invalid_request_error"},
		{[]string{HeaderStatus, "429", HeaderRetryAfter, "1.5"}, 400, "", "invalid_request_error"},
	}
	for _, tt := range tests {
		resp, body := mustPost(t, c, base+PathChatCompletions, `{"model":"m"}`, tt.headers...)
		if resp.StatusCode != tt.status {
			t.Errorf("%v: status %d, want %d (%s)", tt.headers, resp.StatusCode, tt.status, body)
			continue
		}
		if got := resp.Header.Get("Retry-After"); got != tt.retryAfter {
			t.Errorf("%v: Retry-After %q, want %q", tt.headers, got, tt.retryAfter)
		}
		if tt.status != 200 {
			if e := decodeError(t, body); e.Error.Type != tt.errType {
				t.Errorf("%v: error type %q, want %q", tt.headers, e.Error.Type, tt.errType)
			}
		}
	}
	if _, _, err := post(context.Background(), c, base+PathChatCompletions, `{}`, HeaderStatus, "reset"); err == nil {
		t.Error("a forced reset got a response")
	}
	st := s.Stats()
	if st.OK != 1 || st.Status429 != 2 || st.Status5xx != 3 || st.Status4xx != 6 || st.Resets != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestResetIsAClientError(t *testing.T) {
	s, base, c := startSim(t, Config{RateReset: 1})
	for i := range 5 {
		resp, _, err := post(context.Background(), c, base+PathCompletions, `{"model":"m"}`)
		if err == nil {
			t.Fatalf("request %d got status %d, want a connection error", i, resp.StatusCode)
		}
		var ne interface{ Timeout() bool }
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("request %d: %v is a timeout, want a reset", i, err)
		}
		t.Logf("request %d: %v", i, err)
	}
	if st := s.Stats(); st.Resets != 5 || st.Requests != 5 || len(st.ByStatus) != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestRates checks sampled outcomes against the configured rates (loosely),
// and that a seed makes them reproducible.
func TestRates(t *testing.T) {
	const n = 2000
	cfg := Config{Rate429: 0.2, Rate5xx: 0.1, RateReset: 0.05, Seed: 42}
	run := func() (string, Stats) {
		s, base, c := startSim(t, cfg)
		var seq strings.Builder
		for range n {
			resp, _, err := post(context.Background(), c, base+PathCompletions, `{"prompt":"p"}`)
			switch {
			case err != nil:
				seq.WriteByte('R')
			case resp.StatusCode == 200:
				seq.WriteByte('.')
			case resp.StatusCode == 429:
				seq.WriteByte('4')
			case resp.StatusCode == 503:
				seq.WriteByte('5')
			default:
				t.Fatalf("unexpected status %d", resp.StatusCode)
			}
		}
		return seq.String(), s.Stats()
	}
	seq, st := run()
	count := func(b byte) int { return strings.Count(seq, string(b)) }
	// Means 400, 200, 100 and 1300; the bounds are about ±5 standard deviations.
	for _, tt := range []struct {
		name     string
		got      int
		stat     uint64
		min, max int
	}{
		{"429", count('4'), st.Status429, 310, 490},
		{"5xx", count('5'), st.Status5xx, 135, 265},
		{"reset", count('R'), st.Resets, 50, 150},
		{"ok", count('.'), st.OK, 1200, 1400},
	} {
		if tt.got < tt.min || tt.got > tt.max || uint64(tt.got) != tt.stat {
			t.Errorf("%s: client saw %d, stats say %d, want %d..%d", tt.name, tt.got, tt.stat, tt.min, tt.max)
		}
	}
	if st.Requests != n {
		t.Errorf("stats count %d requests, want %d", st.Requests, n)
	}
	if again, _ := run(); again != seq {
		t.Error("the same seed gave a different sequence of outcomes")
	}
}

func TestDeadlineHeader(t *testing.T) {
	s, base, c := startSim(t, Config{Latency: Fixed(100 * time.Millisecond)})
	soon := strconv.FormatInt(time.Now().Add(20*time.Millisecond).UnixMilli(), 10)
	later := strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10)
	if resp, _ := mustPost(t, c, base+PathCompletions, `{}`, HeaderDeadline, soon); resp.StatusCode != 200 {
		t.Fatalf("past its deadline: status %d, want 200 (the simulator only counts)", resp.StatusCode)
	}
	mustPost(t, c, base+PathCompletions, `{}`, HeaderDeadline, later)
	mustPost(t, c, base+PathCompletions, `{}`)
	if st := s.Stats(); st.WithDeadline != 2 || st.PastDeadline != 1 || st.OK != 3 {
		t.Fatalf("stats %+v", st)
	}
}

// scrape fetches /metrics and returns its samples by series.
func scrape(t testing.TB, c *http.Client, base string) (map[string]float64, []byte) {
	t.Helper()
	resp, err := c.Get(base + PathMetrics)
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("scrape: status %d, %v", resp.StatusCode, err)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain; version=0.0.4") {
		t.Errorf("metrics Content-Type %q", ct)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out, body
}

func TestMetricsFollowInflight(t *testing.T) {
	s, base, c := startSim(t, Config{Capacity: 4})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	slow := func(k int) {
		for range k {
			wg.Go(func() {
				// Ends when ctx is cancelled, long before the latency.
				_, _, _ = post(ctx, c, base+PathChatCompletions, `{}`, HeaderLatencyMS, "60000")
			})
		}
	}
	check := func(inflight int64, running, waiting, usage float64) {
		t.Helper()
		eventually(t, "requests in flight", func() bool { return s.Stats().Inflight == inflight })
		m, _ := scrape(t, c, base)
		if m[MetricRunning] != running || m[MetricWaiting] != waiting || m[MetricKVCacheUsage] != usage ||
			m[MetricGPUCacheUsage] != usage || m[MetricInflight] != float64(inflight) || m[MetricCapacity] != 4 {
			t.Fatalf("with %d in flight: running %v waiting %v usage %v inflight %v, want %v %v %v",
				inflight, m[MetricRunning], m[MetricWaiting], m[MetricKVCacheUsage], m[MetricInflight], running, waiting, usage)
		}
	}

	check(0, 0, 0, 0)
	slow(3)
	check(3, 3, 0, 0.75)
	slow(3)
	check(6, 4, 2, 1)
	cancel()
	wg.Wait()
	check(0, 0, 0, 0)

	mustPost(t, c, base+PathCompletions, `{}`)
	mustPost(t, c, base+PathCompletions, `{}`, HeaderStatus, "429")
	m, _ := scrape(t, c, base)
	if m[MetricRequests+`{code="200"}`] != 1 || m[MetricRequests+`{code="429"}`] != 1 || m[MetricAborted] != 6 {
		t.Fatalf("counters: %v", m)
	}
	if st := s.Stats(); st.MaxInflight != 6 {
		t.Fatalf("MaxInflight %d, want 6", st.MaxInflight)
	}
}

// TestMetricsPromtool checks the exposition with Prometheus' own parser.
func TestMetricsPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not found: install the Debian package prometheus (apt-get install prometheus)")
	}
	_, base, c := startSim(t, Config{RateReset: 0.5, Seed: 3})
	for range 10 {
		_, _, _ = post(context.Background(), c, base+PathCompletions, `{}`)
	}
	mustPost(t, c, base+PathCompletions, `{}`, HeaderStatus, "503")
	_, body := scrape(t, c, base)
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = bytes.NewReader(body)
	out, err := cmd.CombinedOutput()
	if err == nil {
		return
	}
	// The linter flags every ':' in a metric name (colons are meant for
	// recording rules), but the vllm: names are vLLM's and must stay. Any
	// other complaint, or a parse error, fails the test.
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Fatalf("promtool check metrics: %v\n%s\n--- exposition:\n%s", err, out, body)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if !strings.HasPrefix(line, "vllm:") || !strings.HasSuffix(line, "metric names should not contain ':'") {
			t.Fatalf("promtool check metrics: %s\n--- exposition:\n%s", out, body)
		}
	}
}

func TestStartAndClose(t *testing.T) {
	s, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close before Start: %v", err)
	}
	base, err := s.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(base, "http://127.0.0.1:") {
		t.Fatalf("base URL %q", base)
	}
	if _, err := s.Start("127.0.0.1:0"); err == nil {
		t.Fatal("second Start succeeded")
	}
	other, _ := New(Config{})
	if _, err := other.Start(strings.TrimPrefix(base, "http://")); err == nil {
		other.Close()
		t.Fatal("Start on a busy port succeeded")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	if _, err := (&http.Client{Transport: tr}).Get(base + PathHealthz); err == nil {
		t.Fatal("the server still answers after Close")
	}
}

func TestCloseLetsRequestsFinish(t *testing.T) {
	s, base, c := startSim(t, Config{})
	type result struct {
		status int
		err    error
	}
	done := make(chan result, 1)
	go func() {
		resp, _, err := post(context.Background(), c, base+PathCompletions, `{}`, HeaderLatencyMS, "300")
		if err != nil {
			done <- result{err: err}
			return
		}
		done <- result{status: resp.StatusCode}
	}()
	eventually(t, "the request to arrive", func() bool { return s.Stats().Inflight == 1 })
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if r := <-done; r.err != nil || r.status != 200 {
		t.Fatalf("request in flight during Close: %+v, want 200", r)
	}
}

func TestCloseIsBounded(t *testing.T) {
	s, base, c := startSim(t, Config{ShutdownTimeout: 100 * time.Millisecond})
	done := make(chan error, 1)
	go func() {
		_, _, err := post(context.Background(), c, base+PathCompletions, `{}`, HeaderLatencyMS, "60000")
		done <- err
	}()
	eventually(t, "the request to arrive", func() bool { return s.Stats().Inflight == 1 })
	start := time.Now()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("Close took %v", el)
	}
	if err := <-done; err == nil {
		t.Fatal("the aborted request got a response")
	}
	if st := s.Stats(); st.Aborted != 1 || st.Inflight != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestHandlerWithoutStart(t *testing.T) {
	s, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	h := s.Handler()
	for _, tt := range []struct {
		method, path, body string
		status             int
	}{
		{http.MethodPost, PathCompletions, `{"model":"x"}`, 200},
		{http.MethodGet, PathMetrics, "", 200},
		{http.MethodHead, PathMetrics, "", 200},
	} {
		rec := newRecorder()
		req, _ := http.NewRequest(tt.method, "http://sim"+tt.path, strings.NewReader(tt.body))
		h.ServeHTTP(rec, req)
		if rec.code() != tt.status {
			t.Errorf("%s %s: %d", tt.method, tt.path, rec.code())
		}
	}
	// A reset needs a connection to hijack; without one the handler aborts.
	defer func() {
		if r := recover(); r != http.ErrAbortHandler {
			t.Fatalf("recovered %v, want http.ErrAbortHandler", r)
		}
	}()
	req, _ := http.NewRequest(http.MethodPost, "http://sim"+PathCompletions, strings.NewReader(`{}`))
	req.Header.Set(HeaderStatus, "reset")
	h.ServeHTTP(newRecorder(), req)
}

// recorder is a minimal http.ResponseWriter that can be reused.
type recorder struct {
	header http.Header
	status int
	n      int
}

func newRecorder() *recorder { return &recorder{header: http.Header{}} }

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = 200
	}
	r.n += len(b)
	return len(b), nil
}

func (r *recorder) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
}

// code is the status sent, 200 when the handler sent nothing (as net/http).
func (r *recorder) code() int {
	if r.status == 0 {
		return http.StatusOK
	}
	return r.status
}

func (r *recorder) reset() {
	clear(r.header)
	r.status, r.n = 0, 0
}
