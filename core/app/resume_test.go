package app

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// streamingGateway answers /v1/completions as a streaming server does: one
// token " t<i>" per tick, numbered on from the prompt's own tokens of that
// form (so a continuation's tokens carry on where the text it was given
// stopped), up to max_tokens. It records every call's body and the calls
// whose client went away.
type streamingGateway struct {
	tick time.Duration

	mu      sync.Mutex
	bodies  []map[string]any
	aborted int
	running int
}

func (g *streamingGateway) serve(w http.ResponseWriter, r *http.Request) {
	raw, _ := io.ReadAll(r.Body)
	var b map[string]any
	if json.Unmarshal(raw, &b) != nil || b["prompt"] == nil {
		return // the protocol probe
	}
	g.mu.Lock()
	g.bodies = append(g.bodies, b)
	g.running++
	g.mu.Unlock()
	defer func() { g.mu.Lock(); g.running--; g.mu.Unlock() }()
	prompt, _ := b["prompt"].(string)
	max := int(b["max_tokens"].(float64))
	from := strings.Count(prompt, " t")
	if b["stream"] != true {
		http.Error(w, "this test's gateway wants stream: true", http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	for i := range max {
		select {
		case <-r.Context().Done():
			g.mu.Lock()
			g.aborted++
			g.mu.Unlock()
			return
		case <-time.After(g.tick):
		}
		reason := "null"
		if i == max-1 {
			reason = `"length"`
		}
		fmt.Fprintf(w, "data: {\"id\":\"cmpl-%d\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"text\":\" t%d\",\"finish_reason\":%s}],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d}}\n\n",
			len(prompt), from+i, reason, 1+from, i+1)
		fl.Flush()
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
}

func (g *streamingGateway) snapshot() (running, aborted int, bodies []map[string]any) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.running, g.aborted, append([]map[string]any(nil), g.bodies...)
}

// TestEvictResume: with resume, a request taken back mid-generation
// continues from the tokens its aborted call made: the next call's prompt
// holds them and asks only for the rest, and the one result written is the
// whole generation with usage counting every token once.
func TestEvictResume(t *testing.T) {
	const tokens = 30
	gw := &streamingGateway{tick: 10 * time.Millisecond}
	srv := httptest.NewServer(http.HandlerFunc(gw.serve))
	t.Cleanup(srv.Close)

	dg, h := startEvictAppResume(t, srv.URL, 2, 0, true)
	far := time.Now().Add(2 * time.Minute)
	if err := h.mem.Enqueue(e2eQueue, request("r1", far, map[string]any{"prompt": "go:", "max_tokens": tokens})); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { r, _, _ := gw.snapshot(); return r == 1 }, 5*time.Second)
	time.Sleep(12 * gw.tick) // about a third of the generation
	dg.budget.Store(0.0)
	waitFor(t, func() bool { _, ab, _ := gw.snapshot(); return ab == 1 }, 2*time.Second)
	dg.budget.Store(1.0)
	res := h.waitResults(1, 10*time.Second)
	if err := h.shutdown(); err != nil {
		t.Fatal(err)
	}

	_, _, bodies := gw.snapshot()
	if len(bodies) != 2 {
		t.Fatalf("%d calls, want 2 (the aborted one and its continuation)", len(bodies))
	}
	cont := bodies[1]
	made := strings.Count(cont["prompt"].(string), " t")
	if made < 3 || made > tokens-3 {
		t.Fatalf("continuation prompt %q: %d tokens made before the abort, want about a third", cont["prompt"], made)
	}
	if want := float64(tokens - made); cont["max_tokens"] != want {
		t.Fatalf("continuation asks %v tokens, want %v", cont["max_tokens"], want)
	}
	r := res["r1"]
	if r == nil || r.StatusCode != http.StatusOK || r.ErrorCode != "" {
		t.Fatalf("result %+v, want one 200", r)
	}
	var ans struct {
		Object  string `json:"object"`
		Choices []struct {
			Text         string `json:"text"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal([]byte(r.Payload), &ans); err != nil {
		t.Fatalf("payload %s: %v", r.Payload, err)
	}
	var want strings.Builder
	for i := range tokens {
		fmt.Fprintf(&want, " t%d", i)
	}
	if ans.Object != "text_completion" || len(ans.Choices) != 1 || ans.Choices[0].Text != want.String() || ans.Choices[0].FinishReason != "length" {
		t.Fatalf("answer %s: want the %d tokens once each, in order", r.Payload, tokens)
	}
	if ans.Usage.CompletionTokens != tokens || ans.Usage.PromptTokens != 1 {
		t.Fatalf("usage %+v, want %d completion tokens and the first call's prompt (1)", ans.Usage, tokens)
	}
	if got := testutil.ToFloat64(h.app.metrics.Resumed.WithLabelValues(e2eQueue, e2eQueue, "default")); got != float64(made) {
		t.Errorf("sluice_resumed_tokens_total %v, want %d", got, made)
	}
}
