package poolsim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// startPool starts a pool on loopback; it is closed when the test ends.
func startPool(t testing.TB, cfg Config) (*Pool, string, *http.Client) {
	t.Helper()
	if cfg.Seed == 0 {
		cfg.Seed = 1
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if err := p.Start(context.Background()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	base, err := p.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	t.Cleanup(func() {
		tr.CloseIdleConnections()
		if err := p.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return p, base, &http.Client{Transport: tr}
}

func post(t testing.TB, c *http.Client, url, body string, headers ...string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("POST %s: body: %v", url, err)
	}
	return resp, b
}

type usage struct {
	Prompt     int `json:"prompt_tokens"`
	Completion int `json:"completion_tokens"`
	Total      int `json:"total_tokens"`
}

type answer struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Text    *string `json:"text"`
		Message *struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Delta *struct {
			Role    string  `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *usage `json:"usage"`
}

func TestCompletionShapes(t *testing.T) {
	_, base, c := startPool(t, Config{})
	tests := []struct {
		name, path, body string
		headers          []string
		object           string
		chat             bool
		prompt, tokens   int
	}{
		{"completions, prompt text estimated at 4 bytes a token", PathCompletions,
			`{"model":"m1","prompt":"` + strings.Repeat("abcd", 40) + `","max_tokens":5}`, nil, "text_completion", false, 40, 5},
		{"completions, token array", PathCompletions,
			`{"model":"m1","prompt":[1,2,3,4,5,6,7],"max_tokens":3}`, nil, "text_completion", false, 7, 3},
		{"chat, header overrides the estimate", PathChatCompletions,
			`{"model":"m2","messages":[{"role":"user","content":"hello"}],"max_completion_tokens":4}`,
			[]string{HeaderPromptTokens, "256"}, "chat.completion", true, 256, 4},
		{"chat, content parts", PathChatCompletions,
			`{"messages":[{"role":"user","content":[{"type":"text","text":"` + strings.Repeat("x", 80) + `"}]}],"max_tokens":2}`,
			nil, "chat.completion", true, 20, 2},
		{"pod route, default max tokens", PodPrefix + "1" + PathCompletions,
			`{"prompt":"hi"}`, nil, "text_completion", false, 1, DefaultMaxTokens},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := post(t, c, base+tc.path, tc.body, tc.headers...)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			var a answer
			if err := json.Unmarshal(body, &a); err != nil {
				t.Fatalf("body %s: %v", body, err)
			}
			if a.Object != tc.object || len(a.Choices) != 1 || a.Usage == nil {
				t.Fatalf("answer %s: want object %s, one choice and usage", body, tc.object)
			}
			if *a.Usage != (usage{tc.prompt, tc.tokens, tc.prompt + tc.tokens}) {
				t.Fatalf("usage %+v, want prompt %d completion %d", *a.Usage, tc.prompt, tc.tokens)
			}
			ch := a.Choices[0]
			if ch.FinishReason == nil || *ch.FinishReason != "length" {
				t.Fatalf("finish_reason %v, want length", ch.FinishReason)
			}
			if tc.chat && (ch.Message == nil || ch.Message.Role != "assistant" || ch.Message.Content == "") {
				t.Fatalf("chat answer without an assistant message: %s", body)
			}
			if !tc.chat && (ch.Text == nil || *ch.Text == "") {
				t.Fatalf("completion without text: %s", body)
			}
			ttft, err1 := strconv.ParseFloat(resp.Header.Get(HeaderTTFTMS), 64)
			queue, err2 := strconv.ParseFloat(resp.Header.Get(HeaderQueueMS), 64)
			if err1 != nil || err2 != nil || !(ttft > 0) || queue < 0 || queue > ttft {
				t.Fatalf("headers %s=%q %s=%q: want 0 <= queue < ttft", HeaderTTFTMS, resp.Header.Get(HeaderTTFTMS),
					HeaderQueueMS, resp.Header.Get(HeaderQueueMS))
			}
			if resp.Header.Get(HeaderPod) == "" || resp.Header.Get(HeaderPreemptions) != "0" {
				t.Fatalf("headers %s=%q %s=%q", HeaderPod, resp.Header.Get(HeaderPod), HeaderPreemptions, resp.Header.Get(HeaderPreemptions))
			}
			if strings.HasPrefix(tc.path, PodPrefix) && resp.Header.Get(HeaderPod) != "1" {
				t.Fatalf("pod route answered from pod %s", resp.Header.Get(HeaderPod))
			}
		})
	}
}

func TestStreaming(t *testing.T) {
	_, base, c := startPool(t, Config{})
	for _, chat := range []bool{false, true} {
		path, body := PathCompletions, `{"prompt":"hello","max_tokens":6,"stream":true}`
		if chat {
			path, body = PathChatCompletions, `{"messages":[{"role":"user","content":"hello"}],"max_tokens":6,"stream":true}`
		}
		t.Run(path, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPost, base+path, strings.NewReader(body))
			req.Header.Set(HeaderObjective, "interactive-default")
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || ct != "text/event-stream" {
				t.Fatalf("status %d content type %q", resp.StatusCode, ct)
			}
			if resp.Header.Get(HeaderTTFTMS) == "" {
				t.Fatalf("no %s header on a stream", HeaderTTFTMS)
			}
			var events []answer
			done := false
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				line := sc.Text()
				if line == "" {
					continue
				}
				data, ok := strings.CutPrefix(line, "data: ")
				if !ok {
					t.Fatalf("line %q is not an SSE data line", line)
				}
				if data == "[DONE]" {
					done = true
					continue
				}
				if done {
					t.Fatalf("event after [DONE]: %s", data)
				}
				var a answer
				if err := json.Unmarshal([]byte(data), &a); err != nil {
					t.Fatalf("event %s: %v", data, err)
				}
				events = append(events, a)
			}
			if !done || len(events) != 7 {
				t.Fatalf("%d events, [DONE] %v; want 6 tokens, a usage event and [DONE]", len(events), done)
			}
			for i, e := range events[:6] {
				if len(e.Choices) != 1 {
					t.Fatalf("token event %d has %d choices", i, len(e.Choices))
				}
				fr := e.Choices[0].FinishReason
				if (i < 5) != (fr == nil) {
					t.Fatalf("token event %d finish_reason %v; want null until the last, then length", i, fr)
				}
				if chat {
					d := e.Choices[0].Delta
					if e.Object != "chat.completion.chunk" || d == nil || d.Content == nil || (i == 0) != (d.Role == "assistant") {
						t.Fatalf("chat event %d: %+v", i, e)
					}
				} else if e.Object != "text_completion" || e.Choices[0].Text == nil {
					t.Fatalf("completion event %d: %+v", i, e)
				}
			}
			last := events[6]
			if len(last.Choices) != 0 || last.Usage == nil || last.Usage.Completion != 6 || last.Usage.Prompt != 2 {
				t.Fatalf("usage event %+v: want no choices and usage 2 + 6", last)
			}
			if resp.Trailer.Get(HeaderPreemptions) != "0" {
				t.Fatalf("trailer %s = %q, want 0", HeaderPreemptions, resp.Trailer.Get(HeaderPreemptions))
			}
		})
	}
}

func TestStreamOneEventPerStep(t *testing.T) {
	// The first token event reaches the client while the request is still
	// generating: tokens are streamed step by step, not at the end.
	cfg := Config{Pods: 1}
	cfg.Engine.ITL = 20 * time.Millisecond
	p, base, c := startPool(t, cfg)
	req, _ := http.NewRequest(http.MethodPost, base+PathCompletions, strings.NewReader(`{"prompt":"x","max_tokens":50,"stream":true}`))
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	r := bufio.NewReader(resp.Body)
	events, runningAtFirst := 0, -1
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			break
		}
		if strings.HasPrefix(line, "data: {") && strings.Contains(line, `"text"`) {
			if events == 0 {
				runningAtFirst = p.PodGauges()[0].Running
			}
			events++
		}
	}
	if events != 50 {
		t.Fatalf("%d token events, want 50", events)
	}
	if runningAtFirst != 1 {
		t.Fatalf("at the first token event the pod ran %d requests, want 1 (the stream still generating)", runningAtFirst)
	}
}

func TestBadRequests(t *testing.T) {
	cfg := Config{MaxBodyBytes: 1 << 10}
	p, base, c := startPool(t, cfg)
	tests := []struct {
		name, body string
		headers    []string
		status     int
		msg        string
	}{
		{"longer than max_model_len", `{"prompt":"x","max_tokens":4096}`, nil, 400, "maximum context length is 4096"},
		{"prompt header too long", `{"prompt":"x","max_tokens":10}`, []string{HeaderPromptTokens, "4090"}, 400, "4100 tokens"},
		{"bad prompt header", `{"prompt":"x"}`, []string{HeaderPromptTokens, "many"}, 400, HeaderPromptTokens},
		{"zero max_tokens", `{"prompt":"x","max_tokens":0}`, nil, 400, "max_tokens"},
		{"not JSON", `{"prompt":`, nil, 400, "JSON"},
		{"bad class", `{"prompt":"x"}`, []string{HeaderClass, "vip"}, 400, "interactive or batch"},
		{"too large", `{"prompt":"` + strings.Repeat("x", 2000) + `"}`, nil, 413, "exceeds"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := post(t, c, base+PathCompletions, tc.body, tc.headers...)
			if resp.StatusCode != tc.status || !bytes.Contains(body, []byte(tc.msg)) {
				t.Fatalf("status %d body %s; want %d mentioning %q", resp.StatusCode, body, tc.status, tc.msg)
			}
			var e struct {
				Error struct{ Message, Type string }
			}
			if json.Unmarshal(body, &e) != nil || e.Error.Type != "invalid_request_error" {
				t.Fatalf("error body %s is not OpenAI-shaped", body)
			}
		})
	}
	if st := p.Stats(); st.Classes[ClassInteractive].Invalid != uint64(len(tests)) {
		t.Fatalf("stats count %d invalid requests, want %d", st.Classes[ClassInteractive].Invalid, len(tests))
	}
	resp, _ := post(t, c, base+"/pods/9"+PathCompletions, `{}`)
	if resp.StatusCode != 404 {
		t.Fatalf("unknown pod: status %d, want 404", resp.StatusCode)
	}
}

func TestClientDisconnectFreesRequest(t *testing.T) {
	cfg := Config{Pods: 1}
	p, base, c := startPool(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+PathCompletions,
			strings.NewReader(`{"prompt":"x","max_tokens":2000}`))
		req.Header.Set(HeaderPromptTokens, "1000")
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	waitFor(t, "the request to run", func() bool { g := p.PodGauges()[0]; return g.Running == 1 && g.KVUsage > 0 })
	cancel()
	<-errc
	waitFor(t, "the request to be freed", func() bool { g := p.PodGauges()[0]; return g.Running == 0 && g.KVUsage == 0 })
	waitFor(t, "the abort to be counted", func() bool { return p.Stats().Classes[ClassInteractive].Aborted == 1 })
}

// With IgnoreHangups a request whose client went away runs to its end and
// counts as finished, not aborted (finished_reason "abort" stays 0); once
// SetIgnoreHangups(false), the next hang-up aborts at once.
func TestIgnoreHangups(t *testing.T) {
	cfg := Config{Pods: 1}
	cfg.Engine.IgnoreHangups = true
	p, base, c := startPool(t, cfg)
	hangUp := func(maxTokens int) {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+PathCompletions,
				strings.NewReader(`{"prompt":"x","max_tokens":`+strconv.Itoa(maxTokens)+`}`))
			resp, err := c.Do(req)
			if err == nil {
				resp.Body.Close()
			}
			errc <- err
		}()
		waitFor(t, "the request to run", func() bool { return p.PodGauges()[0].Running == 1 })
		cancel()
		<-errc
	}
	aborts := func() uint64 {
		d := p.pods[0]
		d.mu.Lock()
		defer d.mu.Unlock()
		return d.m.success[finishAbort]
	}
	hangUp(40) // 40 steps of at least 10 ms
	time.Sleep(100 * time.Millisecond)
	if g := p.PodGauges()[0]; g.Running != 1 {
		t.Fatalf("100 ms after the hang-up: running %d, want the request still running", g.Running)
	}
	waitFor(t, "the request to end", func() bool { return p.Stats().Classes[ClassInteractive].Finished == 1 })
	if st, a := p.Stats().Classes[ClassInteractive], aborts(); st.Aborted != 0 || a != 0 {
		t.Fatalf("aborted %d, finished_reason=abort %d; want 0 (the request ran to its end)", st.Aborted, a)
	}
	p.SetIgnoreHangups(false)
	hangUp(2000)
	waitFor(t, "the request to be freed", func() bool { return p.PodGauges()[0].Running == 0 })
	if st, a := p.Stats().Classes[ClassInteractive], aborts(); st.Aborted != 1 || a != 1 {
		t.Fatalf("hang-ups honoured again: aborted %d, finished_reason=abort %d; want 1", st.Aborted, a)
	}
}

func TestClassAndPriority(t *testing.T) {
	cfg := Config{Pods: 1}
	cfg.Engine.Policy = PolicyPriority
	cfg.Engine.MaxNumSeqs = 1
	var recs = make(chan Record, 8)
	p, err := New(Config{Seed: 1, Pods: 1, Engine: cfg.Engine})
	if err != nil {
		t.Fatal(err)
	}
	p.OnRecord(func(r Record) { recs <- r })
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	h := p.Handler()
	send := func(body string, headers ...string) {
		req, _ := http.NewRequest(http.MethodPost, PathCompletions, strings.NewReader(body))
		for i := 0; i+1 < len(headers); i += 2 {
			req.Header.Set(headers[i], headers[i+1])
		}
		go h.ServeHTTP(discard{}, req)
	}
	// A long batch request occupies the single seat; then a batch and an
	// interactive request queue: the interactive one (engine priority 0)
	// runs before the batch one (10) although it came later.
	send(`{"prompt":"x","max_tokens":30}`, HeaderObjective, "batch-sheddable")
	waitFor(t, "the first request to run", func() bool { return p.PodGauges()[0].Running == 1 })
	send(`{"prompt":"x","max_tokens":2}`, HeaderObjective, "nightly-batch-job")
	waitFor(t, "the batch request to wait", func() bool { return p.PodGauges()[0].WaitingByClass[ClassBatch] == 1 })
	send(`{"prompt":"x","max_tokens":2}`, HeaderClass, "interactive", HeaderObjective, "batch-sheddable")
	waitFor(t, "the interactive request to wait", func() bool { return p.PodGauges()[0].WaitingByClass[ClassInteractive] == 1 })
	var got []Record
	for range 3 {
		got = append(got, <-recs)
	}
	if got[0].Class != ClassBatch || got[0].Priority != -1 || got[0].EnginePriority != 10 {
		t.Fatalf("first finished %+v, want the batch-sheddable request (priority -1, engine 10)", got[0])
	}
	if got[1].Class != ClassInteractive || got[1].Priority != -1 || got[1].EnginePriority != 0 {
		t.Fatalf("second finished %+v, want the X-Sim-Class interactive request", got[1])
	}
	if got[2].Class != ClassBatch || got[2].Priority != 0 {
		t.Fatalf("third finished %+v, want the unknown batch objective (priority 0, class guessed)", got[2])
	}
}

// discard is a ResponseWriter that drops everything.
type discard struct{}

func (discard) Header() http.Header         { return http.Header{} }
func (discard) Write(b []byte) (int, error) { return len(b), nil }
func (discard) WriteHeader(int)             {}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); !cond(); time.Sleep(2 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func TestSampleAndContextEnd(t *testing.T) {
	p, err := New(Config{Seed: 1, Pods: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithCancel(context.Background())
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.Start(ctx); err == nil {
		t.Fatal("a second Start succeeded")
	}
	h := p.Handler()
	done := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, PathCompletions, strings.NewReader(`{"prompt":"x","max_tokens":3000}`))
		req.Header.Set(HeaderObjective, "batch")
		rec := &recorder{header: http.Header{}}
		h.ServeHTTP(rec, req)
		done <- rec.status
	}()
	waitFor(t, "a running batch request", func() bool { return p.Sample().ByClass[ClassBatch].Running == 1 })
	s := p.Sample()
	if s.ByClass[ClassBatch].Requests != 1 || s.ByClass[ClassInteractive].Running != 0 || !(s.KVUsage > 0) {
		t.Fatalf("sample %+v: want one batch request running and some KV used", s)
	}
	cancel() // the loops stop; the request gives up
	select {
	case status := <-done:
		if status != http.StatusServiceUnavailable {
			t.Fatalf("request in flight when the context ended: status %d, want 503", status)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the request in flight did not end with the context")
	}
}

// recorder is a minimal ResponseWriter keeping the status.
type recorder struct {
	header http.Header
	status int
}

func (r *recorder) Header() http.Header { return r.header }
func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = 200
	}
	return len(b), nil
}
func (r *recorder) WriteHeader(s int) {
	if r.status == 0 {
		r.status = s
	}
}

func TestUniformOutputLength(t *testing.T) {
	lengths := func() []int {
		cfg := Config{Seed: 3}
		cfg.Engine.OutputLength = OutputUniform
		_, base, c := startPool(t, cfg)
		var out []int
		for range 6 {
			resp, body := post(t, c, base+PathCompletions, `{"prompt":"x","max_tokens":40}`)
			var a answer
			if resp.StatusCode != 200 || json.Unmarshal(body, &a) != nil || a.Usage == nil {
				t.Fatalf("answer %d %s", resp.StatusCode, body)
			}
			n := a.Usage.Completion
			want := "stop"
			if n == 40 {
				want = "length"
			}
			if n < 1 || n > 40 || *a.Choices[0].FinishReason != want {
				t.Fatalf("%d tokens finishing %q, want 1..40 finishing %q", n, *a.Choices[0].FinishReason, want)
			}
			out = append(out, n)
		}
		return out
	}
	a, b := lengths(), lengths()
	if !slices.Equal(a, b) {
		t.Fatalf("lengths %v and %v differ with the same seed", a, b)
	}
	if slices.Min(a) == slices.Max(a) {
		t.Fatalf("lengths %v: no spread", a)
	}
}
