package poolsim

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Paths the pool serves. PodPrefix + "{i}" + a path serves pod i directly
// (no front): /pods/0/metrics, /pods/0/v1/completions.
const (
	PathCompletions     = "/v1/completions"
	PathChatCompletions = "/v1/chat/completions"
	PathMetrics         = "/metrics"
	PathHealthz         = "/healthz"
	PodPrefix           = "/pods/"
)

// Request headers the pool reads, in canonical form.
const (
	// HeaderObjective is the inference objective, as sluice and the
	// batch-gateway send it; HeaderObjectiveLLMD is the llm-d-async form.
	HeaderObjective     = "X-Gateway-Inference-Objective"
	HeaderObjectiveLLMD = "X-Llm-D-Inference-Objective"
	// HeaderClass forces the class: "interactive" or "batch".
	HeaderClass = "X-Sim-Class"
	// HeaderPromptTokens gives the prompt length in tokens, overriding the
	// estimate from the prompt text.
	HeaderPromptTokens = "X-Sim-Prompt-Tokens"
	// HeaderFairness is the flow-control fairness key (the fairness_id label).
	HeaderFairness = "X-Llm-D-Inference-Fairness-Id"
	// HeaderSLOTTFT sets a shorter flow-control TTL, in milliseconds.
	HeaderSLOTTFT = "X-Slo-Ttft-Ms"
)

// Response headers the pool writes: server-side times in milliseconds from
// the arrival at the simulator, the pod index, and the preemptions. A
// streamed answer sends them with the first token; X-Sim-Preemptions comes
// again as a trailer with the final count.
const (
	HeaderTTFTMS      = "X-Sim-Ttft-Ms"
	HeaderQueueMS     = "X-Sim-Queue-Ms"
	HeaderPod         = "X-Sim-Pod"
	HeaderPreemptions = "X-Sim-Preemptions"
)

// request is one parsed completion request.
type request struct {
	id             uint64
	chat           bool
	stream         bool
	model          string
	class          Class
	eppPriority    int
	enginePriority int
	prompt         int
	maxTokens      int // as asked (or the default)
	genTokens      int // to generate
	fairness       string
	sloTTFT        time.Duration
	arrival        time.Time
	viaFront       bool
	// text is what the prefix cache compares: the prompt's text, or the
	// chat messages' texts one after the other ("" without a prefix
	// cache, or when the prompt is not text).
	text string
}

type completionBody struct {
	Model               string          `json:"model"`
	Prompt              json.RawMessage `json:"prompt"`
	Messages            []chatMessage   `json:"messages"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Stream              bool            `json:"stream"`
	Priority            *int            `json:"priority"`
}

type chatMessage struct {
	Content json.RawMessage `json:"content"`
}

// estimateTokens is the token count of a prompt or message content: a
// string counts ceil(bytes/4); an array of integers counts one token each;
// arrays of strings, of token arrays and of content parts ({"text": ...})
// add up their elements.
func estimateTokens(raw json.RawMessage) int {
	if len(raw) == 0 {
		return 0
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return (len(s) + 3) / 4
	}
	var ints []int64
	if json.Unmarshal(raw, &ints) == nil {
		return len(ints)
	}
	var parts []json.RawMessage
	if json.Unmarshal(raw, &parts) == nil {
		n := 0
		for _, p := range parts {
			var part struct {
				Text *string `json:"text"`
			}
			if json.Unmarshal(p, &part) == nil && part.Text != nil {
				n += (len(*part.Text) + 3) / 4
				continue
			}
			n += estimateTokens(p)
		}
		return n
	}
	return 0
}

// parse reads r into a request, or returns the status and message of a
// refusal.
func (p *Pool) parse(r *http.Request, chat bool) (*request, int, string) {
	body, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, p.cfg.MaxBodyBytes))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		return nil, http.StatusRequestEntityTooLarge, "request body exceeds " + strconv.FormatInt(p.cfg.MaxBodyBytes, 10) + " bytes"
	case err != nil:
		return nil, http.StatusBadRequest, "reading the body: " + err.Error()
	}
	var b completionBody
	if err := json.Unmarshal(body, &b); err != nil {
		return nil, http.StatusBadRequest, "request body must be a JSON object: " + err.Error()
	}
	req := &request{chat: chat, stream: b.Stream, model: b.Model, arrival: time.Now()}
	if req.model == "" {
		req.model = p.cfg.ModelName
	}
	if v := r.Header.Get(HeaderPromptTokens); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return nil, http.StatusBadRequest, HeaderPromptTokens + " must be a positive integer, not " + strconv.Quote(v)
		}
		req.prompt = n
	} else if chat {
		for _, m := range b.Messages {
			req.prompt += estimateTokens(m.Content)
		}
	} else {
		req.prompt = estimateTokens(b.Prompt)
	}
	req.prompt = max(req.prompt, 1)
	req.maxTokens = p.cfg.Engine.DefaultMaxTokens
	if b.MaxCompletionTokens != nil {
		req.maxTokens = *b.MaxCompletionTokens
	}
	if b.MaxTokens != nil {
		req.maxTokens = *b.MaxTokens
	}
	if req.maxTokens < 1 {
		return nil, http.StatusBadRequest, "max_tokens must be at least 1, got " + strconv.Itoa(req.maxTokens)
	}
	if total := req.prompt + req.maxTokens; total > p.cfg.Engine.MaxModelLen {
		return nil, http.StatusBadRequest, "This model's maximum context length is " + strconv.Itoa(p.cfg.Engine.MaxModelLen) +
			" tokens. However, you requested " + strconv.Itoa(total) + " tokens (" + strconv.Itoa(req.prompt) +
			" in the prompt, " + strconv.Itoa(req.maxTokens) + " in the completion). Please reduce the length."
	}

	objective := r.Header.Get(HeaderObjective)
	if objective == "" {
		objective = r.Header.Get(HeaderObjectiveLLMD)
	}
	req.class = ClassInteractive
	if objective != "" {
		if o, ok := p.cfg.Front.Objectives[objective]; ok {
			req.eppPriority, req.class = o.Priority, o.Class
		} else {
			req.class = guessClass(objective)
		}
	}
	if v := r.Header.Get(HeaderClass); v != "" {
		c, err := ParseClass(v)
		if err != nil {
			return nil, http.StatusBadRequest, HeaderClass + ": " + err.Error()
		}
		req.class = c
	}
	req.enginePriority = p.cfg.Engine.InteractivePriority
	if req.class == ClassBatch {
		req.enginePriority = p.cfg.Engine.BatchPriority
	}
	if b.Priority != nil {
		req.enginePriority = *b.Priority
	}
	req.fairness = r.Header.Get(HeaderFairness)
	if req.fairness == "" {
		req.fairness = "default"
	}
	if v := r.Header.Get(HeaderSLOTTFT); v != "" {
		ms, err := strconv.ParseFloat(v, 64)
		if err != nil || !(ms > 0) {
			return nil, http.StatusBadRequest, HeaderSLOTTFT + " must be positive milliseconds, not " + strconv.Quote(v)
		}
		req.sloTTFT = time.Duration(ms * float64(time.Millisecond))
	}
	if p.cfg.Engine.PrefixCaching {
		req.text = promptText(b, chat)
	}
	req.id = p.ids.Add(1)
	req.genTokens = req.maxTokens
	if p.cfg.Engine.OutputLength == OutputUniform {
		rnd := newRNG(p.seed, req.id+1<<32)
		req.genTokens = 1 + rnd.intn(req.maxTokens)
	}
	return req, 0, ""
}

// promptText is the text of a request's prompt for the prefix cache: a
// string prompt, or the chat messages' string contents joined (a resumed
// chat request appends an assistant message, so its text extends the
// evicted call's); "" for anything else.
func promptText(b completionBody, chat bool) string {
	if !chat {
		var s string
		if json.Unmarshal(b.Prompt, &s) != nil {
			return ""
		}
		return s
	}
	var out strings.Builder
	for _, m := range b.Messages {
		var s string
		if json.Unmarshal(m.Content, &s) != nil {
			return ""
		}
		out.WriteString(s)
	}
	return out.String()
}

// guessClass is the class of an objective missing from the map.
func guessClass(objective string) Class {
	if strings.Contains(strings.ToLower(objective), "batch") {
		return ClassBatch
	}
	return ClassInteractive
}

// newSeq makes the engine sequence of req, arriving at its pod now.
func newSeq(req *request) *seq {
	s := &seq{id: req.id, class: req.class, priority: req.enginePriority, arrival: time.Now(),
		prompt: req.prompt, maxTokens: req.genTokens, heapIndex: -1, sink: newStream(), req: req, key: req.text}
	s.sink.every = req.stream
	if req.genTokens < req.maxTokens {
		s.reason = finishStop
	}
	return s
}

func (p *Pool) newHandler() (http.Handler, error) {
	frontMetrics, err := p.frontMetricsHandler()
	if err != nil {
		return nil, err
	}
	podMetrics := make([]http.Handler, len(p.pods))
	for i, d := range p.pods {
		if podMetrics[i], err = podMetricsHandler(p, d); err != nil {
			return nil, err
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+PathCompletions, func(w http.ResponseWriter, r *http.Request) { p.serveCompletion(w, r, false, -1) })
	mux.HandleFunc("POST "+PathChatCompletions, func(w http.ResponseWriter, r *http.Request) { p.serveCompletion(w, r, true, -1) })
	mux.Handle("GET "+PathMetrics, frontMetrics)
	mux.HandleFunc("GET "+PathHealthz, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "ok\n")
	})
	pod := func(r *http.Request) (int, bool) {
		i, err := strconv.Atoi(r.PathValue("i"))
		return i, err == nil && i >= 0 && i < len(p.pods)
	}
	mux.HandleFunc("GET "+PodPrefix+"{i}"+PathMetrics, func(w http.ResponseWriter, r *http.Request) {
		if i, ok := pod(r); ok {
			podMetrics[i].ServeHTTP(w, r)
			return
		}
		writeError(w, http.StatusNotFound, "invalid_request_error", "unknown_pod", "no pod "+r.PathValue("i"))
	})
	for _, chat := range []bool{false, true} {
		path := PathCompletions
		if chat {
			path = PathChatCompletions
		}
		mux.HandleFunc("POST "+PodPrefix+"{i}"+path, func(w http.ResponseWriter, r *http.Request) {
			if i, ok := pod(r); ok {
				p.serveCompletion(w, r, chat, i)
				return
			}
			writeError(w, http.StatusNotFound, "invalid_request_error", "unknown_pod", "no pod "+r.PathValue("i"))
		})
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "invalid_request_error", "unknown_url", "no route for "+r.Method+" "+r.URL.Path)
	})
	return mux, nil
}

// serveCompletion answers one completion request through the front
// (direct < 0) or straight from pod direct.
func (p *Pool) serveCompletion(w http.ResponseWriter, r *http.Request, chat bool, direct int) {
	req, status, msg := p.parse(r, chat)
	if req == nil {
		// The class is unknown before parsing; count under the header's class.
		c := ClassInteractive
		if guessClass(r.Header.Get(HeaderObjective)+r.Header.Get(HeaderObjectiveLLMD)+r.Header.Get(HeaderClass)) == ClassBatch {
			c = ClassBatch
		}
		p.cls[c].requests.Add(1)
		p.cls[c].invalid.Add(1)
		writeError(w, status, "invalid_request_error", "invalid_request", msg)
		return
	}
	k := &p.cls[req.class]
	k.requests.Add(1)
	podIdx := direct
	if direct < 0 {
		req.viaFront = true
		i, rej := p.front.admit(r.Context(), req)
		if rej != nil {
			k.rejected.Add(1)
			if rej.reason != "" {
				w.Header().Set(HeaderDroppedReason, rej.reason)
			}
			if rej.reason == ReasonSaturated && p.cfg.Front.RetryAfter > 0 {
				w.Header().Set("Retry-After", strconv.FormatInt(int64((p.cfg.Front.RetryAfter+time.Second-1)/time.Second), 10))
			}
			typ := "rate_limit_error"
			if rej.status >= 500 {
				typ = "server_error"
			}
			writeError(w, rej.status, typ, "request_dropped", rej.msg)
			return
		}
		if i < 0 { // the client left while queued
			k.aborted.Add(1)
			return
		}
		podIdx = i
	}
	d := p.pods[podIdx]
	s := newSeq(req)
	if o := p.cfg.Engine.RequestOverhead; o > 0 {
		// the pod's API server parses and tokenizes the request before
		// its engine sees it; the step loop goes on meanwhile
		time.Sleep(o)
	}
	d.submit(s)
	p.respond(w, r, req, d, s)
}

// respond waits for s's tokens and writes them, streamed or at the end.
func (p *Pool) respond(w http.ResponseWriter, r *http.Request, req *request, d *pod, s *seq) {
	sk := s.sink
	created := req.arrival.Unix()
	var (
		sent    int
		started bool
		buf     []byte
		rc      = http.NewResponseController(w)
	)
	setTimes := func(pr progress) {
		h := w.Header()
		if !pr.firstTick.IsZero() {
			h.Set(HeaderTTFTMS, formatMS(pr.firstTick.Sub(req.arrival)))
		}
		if !pr.firstSched.IsZero() {
			h.Set(HeaderQueueMS, formatMS(pr.firstSched.Sub(req.arrival)))
		}
		h.Set(HeaderPod, strconv.Itoa(d.idx))
		h.Set(HeaderPreemptions, strconv.Itoa(pr.preemptions))
	}
	for {
		select {
		case <-sk.notify:
		case <-r.Context().Done():
			p.hungUp(d, s)
			return
		case <-p.closed:
			p.abort(d, s)
			if !started {
				writeError(w, http.StatusServiceUnavailable, "server_error", "shutting_down", "the simulator is shutting down")
				return
			}
			panic(http.ErrAbortHandler)
		}
		pr := sk.read()
		if req.stream && pr.tokens > sent {
			if !started {
				setTimes(pr)
				h := w.Header()
				h.Set("Content-Type", "text/event-stream")
				h.Set("Cache-Control", "no-cache")
				h.Set("Trailer", HeaderPreemptions)
				w.WriteHeader(http.StatusOK)
				started = true
			}
			buf = buf[:0]
			for ; sent < pr.tokens; sent++ {
				last := pr.done && sent+1 == pr.tokens
				buf = appendChunk(buf, req, created, sent, last, pr.reason)
			}
			if pr.done {
				buf = appendUsageChunk(buf, req, created, pr.tokens)
				buf = append(buf, "data: [DONE]\n\n"...)
			}
			if _, err := w.Write(buf); err != nil {
				p.hungUp(d, s)
				return
			}
			_ = rc.Flush()
		}
		if pr.done {
			if req.stream {
				w.Header().Set(HeaderPreemptions, strconv.Itoa(pr.preemptions))
				return
			}
			setTimes(pr)
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(appendCompletion(nil, req, created, pr.tokens, pr.reason))
			return
		}
	}
}

// hungUp handles s's client going away: s is aborted, or, with
// IgnoreHangups, left to run to its end unread.
func (p *Pool) hungUp(d *pod, s *seq) {
	if p.ignoreHangups.Load() {
		return
	}
	p.abort(d, s)
}

// abort cancels s (its client went away, or the pool is closing).
func (p *Pool) abort(d *pod, s *seq) {
	if d.cancel(s, time.Now()) {
		p.finished(d, s)
	}
}

func formatMS(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 3, 64)
}

// words are the simulated tokens, in turn.
var words = [...]string{"The", " pool", " is", " busy", " and", " the", " batch", " waits", " its", " turn", "."}

func tokenText(i int) string { return words[i%len(words)] }

func completionText(n int) string {
	var b strings.Builder
	for i := range n {
		b.WriteString(tokenText(i))
	}
	return b.String()
}

func appendHead(b []byte, req *request, created int64, object string) []byte {
	if req.chat {
		b = append(b, `{"id":"chatcmpl-`...)
	} else {
		b = append(b, `{"id":"cmpl-`...)
	}
	b = strconv.AppendUint(b, req.id, 10)
	b = append(b, `","object":"`...)
	b = append(b, object...)
	b = append(b, `","created":`...)
	b = strconv.AppendInt(b, created, 10)
	b = append(b, `,"model":`...)
	return appendJSONString(b, req.model)
}

func appendFinish(b []byte, last bool, reason string) []byte {
	if !last {
		return append(b, "null"...)
	}
	return appendJSONString(b, reason)
}

// appendChunk appends the SSE event of token i.
func appendChunk(b []byte, req *request, created int64, i int, last bool, reason string) []byte {
	b = append(b, "data: "...)
	if req.chat {
		b = appendHead(b, req, created, "chat.completion.chunk")
		b = append(b, `,"choices":[{"index":0,"delta":{`...)
		if i == 0 {
			b = append(b, `"role":"assistant",`...)
		}
		b = append(b, `"content":`...)
		b = appendJSONString(b, tokenText(i))
		b = append(b, `},"logprobs":null,"finish_reason":`...)
	} else {
		b = appendHead(b, req, created, "text_completion")
		b = append(b, `,"choices":[{"index":0,"text":`...)
		b = appendJSONString(b, tokenText(i))
		b = append(b, `,"logprobs":null,"finish_reason":`...)
	}
	b = appendFinish(b, last, reason)
	return append(b, "}]}\n\n"...)
}

func appendUsage(b []byte, req *request, tokens int) []byte {
	b = append(b, `"usage":{"prompt_tokens":`...)
	b = strconv.AppendInt(b, int64(req.prompt), 10)
	b = append(b, `,"completion_tokens":`...)
	b = strconv.AppendInt(b, int64(tokens), 10)
	b = append(b, `,"total_tokens":`...)
	b = strconv.AppendInt(b, int64(req.prompt+tokens), 10)
	return append(b, '}')
}

// appendUsageChunk appends the last SSE event: no choices, the usage (as
// OpenAI's stream_options.include_usage; always sent).
func appendUsageChunk(b []byte, req *request, created int64, tokens int) []byte {
	b = append(b, "data: "...)
	object := "text_completion"
	if req.chat {
		object = "chat.completion.chunk"
	}
	b = appendHead(b, req, created, object)
	b = append(b, `,"choices":[],`...)
	b = appendUsage(b, req, tokens)
	return append(b, "}\n\n"...)
}

// appendCompletion appends a non-streamed answer.
func appendCompletion(b []byte, req *request, created int64, tokens int, reason string) []byte {
	text := completionText(tokens)
	if req.chat {
		b = appendHead(b, req, created, "chat.completion")
		b = append(b, `,"choices":[{"index":0,"message":{"role":"assistant","content":`...)
		b = appendJSONString(b, text)
		b = append(b, `},"logprobs":null,"finish_reason":`...)
	} else {
		b = appendHead(b, req, created, "text_completion")
		b = append(b, `,"choices":[{"index":0,"text":`...)
		b = appendJSONString(b, text)
		b = append(b, `,"logprobs":null,"finish_reason":`...)
	}
	b = appendJSONString(b, reason)
	b = append(b, `}],`...)
	b = appendUsage(b, req, tokens)
	return append(b, "}\n"...)
}

// writeError answers status with an OpenAI-style error body.
func writeError(w http.ResponseWriter, status int, typ, code, msg string) {
	b := append([]byte(`{"error":{"message":`), nil...)
	b = appendJSONString(b, msg)
	b = append(b, `,"type":`...)
	b = appendJSONString(b, typ)
	b = append(b, `,"param":null,"code":`...)
	b = appendJSONString(b, code)
	b = append(b, "}}\n"...)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// appendJSONString appends s as a JSON string literal.
func appendJSONString(b []byte, s string) []byte {
	out, _ := json.Marshal(s)
	return append(b, out...)
}
