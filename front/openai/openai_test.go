package openai_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	oa "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/sluice-io/sluice/core/app"
	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/submit"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/front/openai"
	"github.com/sluice-io/sluice/gates/constant"
	memtransport "github.com/sluice-io/sluice/transports/memory"
)

const wait = 30 * time.Second

// gateway is a small OpenAI-shaped inference server: it answers chat and
// text completions with "echo: <prompt>". A prompt "block" holds the call
// until the dispatcher aborts it (reported on aborted); "slow" holds it
// until release is closed.
type gateway struct {
	srv      *httptest.Server
	arrived  chan string
	aborted  chan string
	release  chan struct{}
	mu       sync.Mutex
	streamed []bool // whether each body the gateway got had "stream"
}

func newGateway(t *testing.T) *gateway {
	g := &gateway{arrived: make(chan string, 16), aborted: make(chan string, 16), release: make(chan struct{})}
	g.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req map[string]json.RawMessage
		if json.Unmarshal(body, &req) != nil {
			w.WriteHeader(http.StatusOK) // a probe
			return
		}
		_, hasStream := req["stream"]
		g.mu.Lock()
		g.streamed = append(g.streamed, hasStream)
		g.mu.Unlock()
		var model, prompt string
		json.Unmarshal(req["model"], &model)
		if r.URL.Path == openai.PathChatCompletions {
			var msgs []struct {
				Content string `json:"content"`
			}
			json.Unmarshal(req["messages"], &msgs)
			if len(msgs) > 0 {
				prompt = msgs[len(msgs)-1].Content
			}
		} else {
			json.Unmarshal(req["prompt"], &prompt)
		}
		select {
		case g.arrived <- prompt:
		default:
		}
		switch prompt {
		case "block":
			select {
			case <-r.Context().Done():
				g.aborted <- prompt
				return
			case <-time.After(2 * wait):
				return
			}
		case "slow":
			<-g.release
		}
		w.Header().Set("Content-Type", "application/json")
		usage := `{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}`
		if r.URL.Path == openai.PathChatCompletions {
			fmt.Fprintf(w, `{"id":"chatcmpl-1","object":"chat.completion","created":1764633600,"model":%q,`+
				`"choices":[{"index":0,"message":{"role":"assistant","content":%q},"finish_reason":"stop"}],"usage":%s}`,
				model, "echo: "+prompt, usage)
			return
		}
		fmt.Fprintf(w, `{"id":"cmpl-1","object":"text_completion","created":1764633600,"model":%q,`+
			`"choices":[{"index":0,"text":%q,"logprobs":null,"finish_reason":"stop"}],"usage":%s}`,
			model, "echo: "+prompt, usage)
	}))
	t.Cleanup(g.srv.Close)
	return g
}

func (g *gateway) sawStream() []bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]bool(nil), g.streamed...)
}

// rig is a real sluice (the memory transport, one queue "chat" on the
// gateway, constant gate) with the front on it, served over HTTP.
type rig struct {
	gw    *gateway
	mem   *memtransport.Transport
	front *openai.Front
	srv   *httptest.Server
}

func newRig(t *testing.T, mod func(*openai.Config)) *rig {
	t.Helper()
	gw := newGateway(t)
	mem := memtransport.New(memtransport.Options{})
	ad := app.NewAdapters()
	if err := ad.Gates.Register(constant.Type, constant.Factory); err != nil {
		t.Fatal(err)
	}
	cfg := &config.Config{
		Transport: memtransport.Name, Concurrency: 4, MetricsPort: -1, HealthPort: -1,
		TransportConfig: config.TransportConfig{ResultQueueName: "default-results",
			Queues: []config.Queue{{Queue: transport.Queue{Name: "chat"}, IGWBaseURL: gw.srv.URL, GateType: constant.Type}}},
	}
	a, err := app.New(cfg, app.Options{Adapters: ad, Transport: mem})
	if err != nil {
		t.Fatalf("app: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	fc := openai.Config{DefaultQueue: "chat", KeepAlive: config.Duration(20 * time.Millisecond)}
	if mod != nil {
		mod(&fc)
	}
	front, err := openai.New(fc, memtransport.NewProducer(mem, submit.ReaderOptions{}))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(front)
	t.Cleanup(func() {
		srv.Close()
		front.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("sluice run: %v", err)
		}
	})
	return &rig{gw: gw, mem: mem, front: front, srv: srv}
}

func (r *rig) client(opts ...option.RequestOption) *oa.Client {
	c := oa.NewClient(append([]option.RequestOption{
		option.WithBaseURL(r.srv.URL + "/v1/"), option.WithAPIKey("test"), option.WithMaxRetries(0),
	}, opts...)...)
	return &c
}

func chatParams(prompt string) oa.ChatCompletionNewParams {
	return oa.ChatCompletionNewParams{
		Model:    "test-model",
		Messages: []oa.ChatCompletionMessageParamUnion{oa.UserMessage(prompt)},
	}
}

func TestChatCompletion(t *testing.T) {
	r := newRig(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	var httpResp *http.Response
	resp, err := r.client().Chat.Completions.New(ctx, chatParams("hello"), option.WithResponseInto(&httpResp))
	if err != nil {
		t.Fatalf("chat completion: %v", err)
	}
	if len(resp.Choices) != 1 || resp.Choices[0].Message.Content != "echo: hello" || resp.Model != "test-model" {
		t.Fatalf("response %+v", resp)
	}
	if resp.Usage.TotalTokens != 5 {
		t.Fatalf("usage %+v", resp.Usage)
	}
	if id := httpResp.Header.Get(openai.HeaderRequestID); !strings.HasPrefix(id, "oa-") {
		t.Fatalf("%s = %q", openai.HeaderRequestID, id)
	}
	// The route was read and acked: nothing is left on it.
	if n, _ := r.mem.ResultCount("openai-sync:" + httpResp.Header.Get(openai.HeaderRequestID)); n != 0 {
		t.Fatalf("%d results left on the call's route", n)
	}
}

func TestCompletion(t *testing.T) {
	r := newRig(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	resp, err := r.client().Completions.New(ctx, oa.CompletionNewParams{
		Model: "test-model", Prompt: oa.CompletionNewParamsPromptUnion{OfString: oa.String("hi")},
	})
	if err != nil {
		t.Fatalf("completion: %v", err)
	}
	if len(resp.Choices) != 1 || resp.Choices[0].Text != "echo: hi" {
		t.Fatalf("response %+v", resp)
	}
}

func TestChatCompletionStreamed(t *testing.T) {
	r := newRig(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	p := chatParams("stream me")
	p.StreamOptions = oa.ChatCompletionStreamOptionsParam{IncludeUsage: oa.Bool(true)}
	stream := r.client().Chat.Completions.NewStreaming(ctx, p)
	var acc oa.ChatCompletionAccumulator
	chunks := 0
	for stream.Next() {
		acc.AddChunk(stream.Current())
		chunks++
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if chunks < 2 || len(acc.Choices) != 1 || acc.Choices[0].Message.Content != "echo: stream me" || acc.Choices[0].FinishReason != "stop" {
		t.Fatalf("%d chunks accumulated to %+v", chunks, acc.ChatCompletion)
	}
	if acc.Usage.TotalTokens != 5 {
		t.Fatalf("usage %+v, want the gateway's (include_usage)", acc.Usage)
	}
	if saw := r.gw.sawStream(); len(saw) != 1 || saw[0] {
		t.Fatalf("gateway bodies had stream: %v; want one body without it", saw)
	}
}

// TestStreamKeepAlive reads the raw event stream: comments while the
// gateway holds the call, then the chunks and [DONE].
func TestStreamKeepAlive(t *testing.T) {
	r := newRig(t, nil)
	body := `{"model":"m","prompt":"slow","stream":true}`
	req, _ := http.NewRequest(http.MethodPost, r.srv.URL+openai.PathCompletions, strings.NewReader(body))
	req.Header.Set(openai.HeaderTimeout, "60")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	sc := bufio.NewScanner(resp.Body)
	var lines []string
	released := false
	for sc.Scan() {
		line := sc.Text()
		lines = append(lines, line)
		if strings.HasPrefix(line, ": keep-alive") && !released {
			close(r.gw.release) // the gateway answers only after a keep-alive was seen
			released = true
		}
		if line == "data: [DONE]" {
			break
		}
	}
	if !released {
		t.Fatalf("no keep-alive comment before the stream ended: %q", lines)
	}
	var data []string
	for _, l := range lines {
		if s, ok := strings.CutPrefix(l, "data: "); ok {
			data = append(data, s)
		}
	}
	if len(data) != 2 || data[1] != "[DONE]" {
		t.Fatalf("data events %q, want one chunk then [DONE]", data)
	}
	var chunk struct {
		Object  string `json:"object"`
		Choices []struct {
			Text string `json:"text"`
		} `json:"choices"`
	}
	if err := json.Unmarshal([]byte(data[0]), &chunk); err != nil || chunk.Object != "text_completion" || len(chunk.Choices) != 1 || chunk.Choices[0].Text != "echo: slow" {
		t.Fatalf("chunk %s: %v", data[0], err)
	}
}

// TestCallerHangsUp: the client gives up while the gateway works on its
// call; the front cancels the request and the dispatcher aborts the
// gateway call.
func TestCallerHangsUp(t *testing.T) {
	r := newRig(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		_, err := r.client().Chat.Completions.New(ctx, chatParams("block"))
		errc <- err
	}()
	select {
	case p := <-r.gw.arrived:
		if p != "block" {
			t.Fatalf("gateway got %q", p)
		}
	case <-time.After(wait):
		t.Fatal("the call never reached the gateway")
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("client error %v, want context.Canceled", err)
	}
	select {
	case <-r.gw.aborted:
	case <-time.After(wait):
		t.Fatal("the gateway call was not aborted after the caller hung up")
	}
}

// TestDeadline504: a call whose timeout passes while the gateway holds it
// is answered 504 with sluice's code.
func TestDeadline504(t *testing.T) {
	r := newRig(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	var httpResp *http.Response
	_, err := r.client().Chat.Completions.New(ctx, chatParams("block"),
		option.WithHeader(openai.HeaderTimeout, "1s"), option.WithResponseInto(&httpResp))
	var apiErr *oa.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusGatewayTimeout {
		t.Fatalf("error %v, want a 504", err)
	}
	if got := httpResp.Header.Get(openai.HeaderErrorCode); got != string(wire.CodeDeadlineExceeded) {
		t.Fatalf("%s = %q", openai.HeaderErrorCode, got)
	}
	if apiErr.Code != "deadline_exceeded" {
		t.Fatalf("error code %q", apiErr.Code)
	}
}

// answering is the memory producer whose Enqueue also publishes a given
// result on the request's route, as a dispatcher would: it checks how the
// front answers each result without a gateway that can produce it.
type answering struct {
	submit.Producer
	mem *memtransport.Transport
	res wire.Result
}

func (a *answering) Enqueue(ctx context.Context, queue string, reqs []*wire.Request) error {
	if err := a.Producer.Enqueue(ctx, queue, reqs); err != nil {
		return err
	}
	pub, _ := a.mem.Publisher(transport.Queue{Name: queue})
	for _, req := range reqs {
		res := a.res
		res.ID = req.ID
		if err := pub.Publish(req.ResultQueueName, message.NewMessage(req.ID, res.Marshal())); err != nil {
			return err
		}
	}
	return nil
}

func TestResultStatuses(t *testing.T) {
	for _, c := range []struct {
		res    wire.Result
		status int
	}{
		{wire.Result{StatusCode: 200, Payload: `{"id":"x","choices":[]}`}, 200},
		{wire.Result{StatusCode: 422, Payload: `{"error":{"message":"bad model"}}`}, 422},
		{wire.Result{ErrorCode: wire.CodeDeadlineExceeded}, 504},
		{wire.Result{ErrorCode: wire.CodeGateDropped, ErrorMessage: "over quota"}, 429},
		{wire.Result{ErrorCode: wire.CodeGateError}, 503},
		{wire.Result{ErrorCode: wire.CodeInferenceError}, 502},
		{wire.Result{ErrorCode: wire.CodeInvalidRequest}, 400},
		{wire.Result{ErrorCode: wire.CodeCancelled}, 499},
		{wire.Result{ErrorCode: wire.CodePayloadUnavailable}, 500},
	} {
		t.Run(fmt.Sprint(c.res.ErrorCode, c.res.StatusCode), func(t *testing.T) {
			mem := memtransport.New(memtransport.Options{})
			p := &answering{Producer: memtransport.NewProducer(mem, submit.ReaderOptions{}), mem: mem, res: c.res}
			front, err := openai.New(openai.Config{DefaultQueue: "chat"}, p)
			if err != nil {
				t.Fatal(err)
			}
			defer front.Close()
			rec := httptest.NewRecorder()
			front.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, openai.PathChatCompletions, strings.NewReader(`{"model":"m","messages":[]}`)))
			if rec.Code != c.status {
				t.Fatalf("status %d, want %d (body %s)", rec.Code, c.status, rec.Body)
			}
			if c.res.ErrorCode != wire.CodeNone {
				var body struct {
					Error struct {
						Message string `json:"message"`
						Code    string `json:"code"`
					} `json:"error"`
				}
				if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || body.Error.Code != strings.ToLower(string(c.res.ErrorCode)) || body.Error.Message == "" {
					t.Fatalf("error body %s: %v", rec.Body, err)
				}
				if rec.Header().Get(openai.HeaderErrorCode) != string(c.res.ErrorCode) {
					t.Fatalf("%s = %q", openai.HeaderErrorCode, rec.Header().Get(openai.HeaderErrorCode))
				}
			} else if rec.Body.String() != c.res.Payload {
				t.Fatalf("body %q, want the gateway's %q", rec.Body, c.res.Payload)
			}
		})
	}
}

func TestRefusedCalls(t *testing.T) {
	mem := memtransport.New(memtransport.Options{})
	front, err := openai.New(openai.Config{DefaultQueue: "chat", Queues: []string{"chat", "bulk"}, MaxBodyBytes: 64,
		MaxTimeout: config.Duration(time.Minute), DefaultTimeout: config.Duration(time.Minute)}, memtransport.NewProducer(mem, submit.ReaderOptions{}))
	if err != nil {
		t.Fatal(err)
	}
	defer front.Close()
	for _, c := range []struct {
		name, method, path, body string
		header                   map[string]string
		status                   int
	}{
		{"unknown path", "POST", "/v1/embeddings", `{}`, nil, 404},
		{"GET", "GET", openai.PathChatCompletions, ``, nil, 405},
		{"not JSON", "POST", openai.PathChatCompletions, `hello`, nil, 400},
		{"array", "POST", openai.PathChatCompletions, `[1]`, nil, 400},
		{"too large", "POST", openai.PathChatCompletions, `{"x":"` + strings.Repeat("a", 100) + `"}`, nil, 413},
		{"unknown queue", "POST", openai.PathChatCompletions, `{}`, map[string]string{openai.HeaderQueue: "other"}, 400},
		{"bad timeout", "POST", openai.PathChatCompletions, `{}`, map[string]string{openai.HeaderTimeout: "soon"}, 400},
		{"negative timeout", "POST", openai.PathChatCompletions, `{}`, map[string]string{openai.HeaderTimeout: "-5"}, 400},
		{"timeout above max", "POST", openai.PathChatCompletions, `{}`, map[string]string{openai.HeaderTimeout: "2m"}, 400},
	} {
		t.Run(c.name, func(t *testing.T) {
			req := httptest.NewRequest(c.method, c.path, strings.NewReader(c.body))
			for k, v := range c.header {
				req.Header.Set(k, v)
			}
			rec := httptest.NewRecorder()
			front.ServeHTTP(rec, req)
			if rec.Code != c.status {
				t.Fatalf("status %d, want %d (%s)", rec.Code, c.status, rec.Body)
			}
			var body struct {
				Error struct {
					Message string `json:"message"`
				} `json:"error"`
			}
			if json.Unmarshal(rec.Body.Bytes(), &body) != nil || body.Error.Message == "" {
				t.Fatalf("body %s is not an OpenAI error", rec.Body)
			}
		})
	}
	// Nothing refused reached the queue.
	if d, _ := mem.Depth(context.Background(), transport.Queue{Name: "chat"}); d.Waiting > 0 {
		t.Fatalf("refused calls were queued: %+v", d)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []struct {
		cfg  openai.Config
		want string
	}{
		{openai.Config{}, "default_queue is empty"},
		{openai.Config{DefaultQueue: "a", Queues: []string{"b"}}, "do not include"},
		{openai.Config{DefaultQueue: "a", DefaultTimeout: config.Duration(2 * time.Hour)}, "above max_timeout"},
		{openai.Config{DefaultQueue: "a", ForwardHeaders: []string{"authorization"}}, "cannot be forwarded"},
		{openai.Config{DefaultQueue: "a", KeepAlive: -1}, "positive"},
	} {
		c.cfg.SetDefaults()
		if err := c.cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate(%+v) = %v, want %q", c.cfg, err, c.want)
		}
	}
}

// TestStreamedDeadline: a streamed call whose stream has started (keep-
// alives sent) and whose deadline then passes gets an SSE error event,
// which the client reports as the stream's error.
func TestStreamedDeadline(t *testing.T) {
	r := newRig(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	stream := r.client().Chat.Completions.NewStreaming(ctx, chatParams("block"), option.WithHeader(openai.HeaderTimeout, "1s"))
	for stream.Next() {
		t.Fatalf("a chunk for a call that expired: %+v", stream.Current())
	}
	if err := stream.Err(); err == nil || !strings.Contains(err.Error(), "deadline_exceeded") {
		t.Fatalf("stream error %v, want the deadline_exceeded event", err)
	}
}
