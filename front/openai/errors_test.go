package openai_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"github.com/sluice-io/sluice/core/submit"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/front/openai"
	"github.com/sluice-io/sluice/internal/configtypes"
)

// The mapping of every outcome of a call to its HTTP answer: sluice's
// error codes, the gateway's own answers, the calls refused before
// queueing, the producer's failures, and the same once a stream started.

// fakeProducer is a submit.Producer without a transport: it keeps what is
// enqueued and cancelled, and answers each request with answer's result
// (none when answer is nil), after delay, on the request's route.
type fakeProducer struct {
	enqueueErr, resultsErr error
	answer                 func(*wire.Request) *wire.Result
	delay                  time.Duration

	mu      sync.Mutex
	queues  []string
	reqs    []*wire.Request
	cancels []transport.Cancellation
	routes  map[string]chan submit.Result
	acked   []string
	closed  []string // routes whose reader was closed
	wg      sync.WaitGroup
}

var _ submit.Producer = (*fakeProducer)(nil)

func (p *fakeProducer) route(name string) chan submit.Result {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.routes == nil {
		p.routes = map[string]chan submit.Result{}
	}
	c, ok := p.routes[name]
	if !ok {
		c = make(chan submit.Result, 8)
		p.routes[name] = c
	}
	return c
}

// publish puts res on route as the dispatcher would.
func (p *fakeProducer) publish(route string, res *wire.Result) {
	p.route(route) <- submit.Result{ID: res.ID, Raw: res.Marshal(), Result: res}
}

func (p *fakeProducer) Enqueue(_ context.Context, queue string, reqs []*wire.Request) error {
	if p.enqueueErr != nil {
		return p.enqueueErr
	}
	p.mu.Lock()
	for _, r := range reqs {
		p.queues, p.reqs = append(p.queues, queue), append(p.reqs, r)
	}
	p.mu.Unlock()
	if p.answer == nil {
		return nil
	}
	for _, r := range reqs {
		res := p.answer(r)
		res.ID = r.ID
		if p.delay == 0 {
			p.publish(r.ResultQueueName, res)
			continue
		}
		p.wg.Go(func() {
			time.Sleep(p.delay)
			p.publish(r.ResultQueueName, res)
		})
	}
	return nil
}

func (p *fakeProducer) Cancel(_ context.Context, _ string, c transport.Cancellation) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cancels = append(p.cancels, c)
	return 0, nil
}

func (p *fakeProducer) Results(_ context.Context, route string) (submit.Reader, error) {
	if p.resultsErr != nil {
		return nil, p.resultsErr
	}
	return &fakeReader{p: p, route: route, c: p.route(route)}, nil
}

func (p *fakeProducer) Capabilities() submit.Capabilities { return submit.Capabilities{} }

func (p *fakeProducer) Close() error { return nil }

// state returns what the producer saw.
func (p *fakeProducer) state() (reqs []*wire.Request, queues []string, cancels []transport.Cancellation, acked, closed []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.reqs), slices.Clone(p.queues), slices.Clone(p.cancels), slices.Clone(p.acked), slices.Clone(p.closed)
}

type fakeReader struct {
	p     *fakeProducer
	route string
	c     chan submit.Result
}

func (r *fakeReader) Next(ctx context.Context) ([]submit.Result, error) {
	select {
	case res := <-r.c:
		return []submit.Result{res}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (r *fakeReader) Ack(_ context.Context, rs ...submit.Result) error {
	r.p.mu.Lock()
	defer r.p.mu.Unlock()
	for _, res := range rs {
		r.p.acked = append(r.p.acked, res.ID)
	}
	return nil
}

func (r *fakeReader) Close() error {
	r.p.mu.Lock()
	defer r.p.mu.Unlock()
	r.p.closed = append(r.p.closed, r.route)
	return nil
}

// newFakeFront returns a front on p with cfg (DefaultQueue "chat" when
// unset), closed at the end of t.
func newFakeFront(t *testing.T, p *fakeProducer, cfg openai.Config) *openai.Front {
	t.Helper()
	if cfg.DefaultQueue == "" {
		cfg.DefaultQueue = "chat"
	}
	f, err := openai.New(cfg, p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = f.Close()
		p.wg.Wait()
	})
	return f
}

// errorOf decodes an OpenAI error body ({"error":{...}}).
func errorOf(t *testing.T, b []byte) (message, typ, code, param string) {
	t.Helper()
	var body struct {
		Error *struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    string `json:"code"`
			Param   string `json:"param"`
		} `json:"error"`
	}
	if err := json.Unmarshal(b, &body); err != nil || body.Error == nil {
		t.Fatalf("%q is not an OpenAI error body: %v", b, err)
	}
	return body.Error.Message, body.Error.Type, body.Error.Code, body.Error.Param
}

func post(f http.Handler, path, body string, header map[string]string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
	for k, v := range header {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	f.ServeHTTP(rec, req)
	return rec
}

// TestErrorCodeMapping: each sluice error code is answered with its status,
// OpenAI's error type for that status, the code in lower case, the
// result's message (the code when it has none), and the code in
// X-Sluice-Error-Code; the call's id is in X-Sluice-Request-Id.
func TestErrorCodeMapping(t *testing.T) {
	for _, c := range []struct {
		code    wire.ErrorCode
		msg     string
		status  int
		typ     string
		wantMsg string
	}{
		{wire.CodeDeadlineExceeded, "", http.StatusGatewayTimeout, "timeout", "DEADLINE_EXCEEDED"},
		{wire.CodeGateDropped, "tenant over quota", http.StatusTooManyRequests, "rate_limit_error", "tenant over quota"},
		{wire.CodeGateError, "gate down", http.StatusServiceUnavailable, "server_error", "gate down"},
		{wire.CodeInferenceError, "connection refused", http.StatusBadGateway, "server_error", "connection refused"},
		{wire.CodeInvalidRequest, "no payload", http.StatusBadRequest, "invalid_request_error", "no payload"},
		{wire.CodeCancelled, "", 499, "invalid_request_error", "CANCELLED"},
		{wire.CodePayloadUnavailable, "payload key gone", http.StatusInternalServerError, "server_error", "payload key gone"},
		{"SOMETHING_NEW", "", http.StatusInternalServerError, "server_error", "SOMETHING_NEW"},
	} {
		t.Run(string(c.code), func(t *testing.T) {
			if got := openai.Status(c.code); got != c.status {
				t.Errorf("Status(%s) = %d, want %d", c.code, got, c.status)
			}
			p := &fakeProducer{answer: func(*wire.Request) *wire.Result {
				return &wire.Result{ErrorCode: c.code, ErrorMessage: c.msg}
			}}
			rec := post(newFakeFront(t, p, openai.Config{}), openai.PathChatCompletions, `{"model":"m","messages":[]}`, nil)
			if rec.Code != c.status {
				t.Fatalf("status %d, want %d (%s)", rec.Code, c.status, rec.Body)
			}
			msg, typ, code, _ := errorOf(t, rec.Body.Bytes())
			if msg != c.wantMsg || typ != c.typ || code != strings.ToLower(string(c.code)) {
				t.Errorf("error message %q type %q code %q; want %q, %q, %q", msg, typ, code, c.wantMsg, c.typ, strings.ToLower(string(c.code)))
			}
			h := rec.Header()
			if h.Get(openai.HeaderErrorCode) != string(c.code) || h.Get("Content-Type") != "application/json" {
				t.Errorf("headers %v", h)
			}
			reqs, _, cancels, acked, _ := p.state()
			if len(reqs) != 1 || h.Get(openai.HeaderRequestID) != reqs[0].ID {
				t.Fatalf("%s = %q, queued %d", openai.HeaderRequestID, h.Get(openai.HeaderRequestID), len(reqs))
			}
			if len(cancels) > 0 || !slices.Equal(acked, []string{reqs[0].ID}) {
				t.Errorf("a call answered by its result: cancels %v, acked %v", cancels, acked)
			}
		})
	}
}

// TestGatewayAnswersPassedThrough: the gateway's own answer, success or
// error, is the call's answer: its status (200 when it gave none) and its
// body byte for byte, with no sluice error code.
func TestGatewayAnswersPassedThrough(t *testing.T) {
	for _, c := range []struct {
		status, want int
		body         string
	}{
		{0, 200, `{"id":"x","choices":[]}`},
		{200, 200, `{"id":"x","choices":[{"index":0}]}` + "\n"},
		{201, 201, `{"id":"y"}`},
		{400, 400, `{"error":{"message":"bad model","type":"invalid_request_error","code":"model_not_found"}}`},
		{401, 401, `{"error":{"message":"no key"}}`},
		{404, 404, `not found`},
		{429, 429, `{"error":{"message":"slow down","type":"rate_limit_error"}}`},
		{500, 500, ``},
		{503, 503, `upstream overloaded`},
	} {
		t.Run(http.StatusText(c.want), func(t *testing.T) {
			p := &fakeProducer{answer: func(*wire.Request) *wire.Result { return &wire.Result{StatusCode: c.status, Payload: c.body} }}
			rec := post(newFakeFront(t, p, openai.Config{}), openai.PathCompletions, `{"model":"m","prompt":"p"}`, nil)
			if rec.Code != c.want || rec.Body.String() != c.body {
				t.Fatalf("answer %d %q, want %d %q", rec.Code, rec.Body, c.want, c.body)
			}
			if h := rec.Header(); h.Get(openai.HeaderErrorCode) != "" || h.Get("Content-Type") != "application/json" || h.Get(openai.HeaderRequestID) == "" {
				t.Errorf("headers %v", h)
			}
		})
	}
}

// sseEvents reads the data events of an SSE body (comments skipped).
func sseEvents(t *testing.T, body io.Reader) (data []string, comments int) {
	t.Helper()
	sc := bufio.NewScanner(body)
	for sc.Scan() {
		line := sc.Text()
		if s, ok := strings.CutPrefix(line, "data: "); ok {
			data = append(data, s)
		} else if strings.HasPrefix(line, ":") {
			comments++
		}
	}
	return data, comments
}

// TestStreamedErrors: for stream: true, an answer that comes before the
// first keep-alive is sent with its real status as for any call; once the
// stream started (200 sent with a keep-alive), an error is one SSE error
// event: the gateway's body when it is an OpenAI error, else wrapped with
// the gateway's status as code; a sluice code as its error object; a
// body that is no completion as a server_error; a body that is an event
// stream already is passed through.
func TestStreamedErrors(t *testing.T) {
	openAIErr := `{"error":{"message":"slow down","type":"rate_limit_error","code":"rate_limit_exceeded"}}`
	for _, c := range []struct {
		name    string
		res     wire.Result
		started bool   // the answer comes after the first keep-alive
		status  int    // the HTTP status
		event   string // the data event, exactly ("" to check with check)
		check   func(t *testing.T, event string)
	}{
		{name: "gateway 429 before the stream", res: wire.Result{StatusCode: 429, Payload: openAIErr}, status: 429},
		{name: "gate dropped before the stream", res: wire.Result{ErrorCode: wire.CodeGateDropped}, status: 429},
		{name: "gateway OpenAI error in the stream", res: wire.Result{StatusCode: 429, Payload: openAIErr}, started: true, status: 200, event: openAIErr},
		{name: "gateway plain error in the stream", res: wire.Result{StatusCode: 503, Payload: "upstream overloaded"}, started: true, status: 200,
			check: func(t *testing.T, ev string) {
				msg, typ, code, _ := errorOf(t, []byte(ev))
				if typ != "server_error" || code != "503" || !strings.Contains(msg, "503") || !strings.Contains(msg, "upstream overloaded") {
					t.Errorf("event %s", ev)
				}
			}},
		{name: "gateway null error in the stream", res: wire.Result{StatusCode: 429, Payload: `{"error":null}`}, started: true, status: 200,
			check: func(t *testing.T, ev string) {
				if _, typ, code, _ := errorOf(t, []byte(ev)); typ != "rate_limit_error" || code != "429" {
					t.Errorf("event %s", ev)
				}
			}},
		{name: "sluice code in the stream", res: wire.Result{ErrorCode: wire.CodeInferenceError, ErrorMessage: "reset"}, started: true, status: 200,
			check: func(t *testing.T, ev string) {
				if msg, typ, code, _ := errorOf(t, []byte(ev)); msg != "reset" || typ != "server_error" || code != "inference_error" {
					t.Errorf("event %s", ev)
				}
			}},
		{name: "no completion", res: wire.Result{StatusCode: 200, Payload: `[1,2]`}, status: 200,
			check: func(t *testing.T, ev string) {
				if msg, typ, _, _ := errorOf(t, []byte(ev)); typ != "server_error" || !strings.Contains(msg, "not a completion") {
					t.Errorf("event %s", ev)
				}
			}},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := &fakeProducer{answer: func(*wire.Request) *wire.Result { r := c.res; return &r }}
			cfg := openai.Config{KeepAlive: configtypes.Duration(time.Hour)}
			if c.started {
				p.delay, cfg.KeepAlive = 200*time.Millisecond, configtypes.Duration(20*time.Millisecond)
			}
			f := newFakeFront(t, p, cfg)
			srv := httptest.NewServer(f)
			defer srv.Close()
			resp, err := http.Post(srv.URL+openai.PathChatCompletions, "application/json", strings.NewReader(`{"model":"m","messages":[],"stream":true}`))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != c.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, c.status)
			}
			if c.status != 200 {
				b, _ := io.ReadAll(resp.Body)
				if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
					t.Errorf("content type %q of an answer before the stream", ct)
				}
				errorOf(t, b)
				return
			}
			if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
				t.Fatalf("content type %q", ct)
			}
			data, comments := sseEvents(t, resp.Body)
			if c.started && comments == 0 {
				t.Error("no keep-alive before the answer")
			}
			if len(data) != 1 {
				t.Fatalf("data events %q, want one error event (and no [DONE])", data)
			}
			if c.event != "" && data[0] != c.event {
				t.Errorf("event %s, want %s", data[0], c.event)
			}
			if c.check != nil {
				c.check(t, data[0])
			}
		})
	}
	// A gateway that streamed anyway: its event stream is passed through.
	stream := "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[]}\n\ndata: [DONE]\n\n"
	p := &fakeProducer{answer: func(*wire.Request) *wire.Result { return &wire.Result{StatusCode: 200, Payload: stream} }}
	rec := post(newFakeFront(t, p, openai.Config{}), openai.PathChatCompletions, `{"model":"m","messages":[],"stream":true}`, nil)
	if rec.Code != 200 || rec.Body.String() != stream {
		t.Errorf("a streamed body: %d %q, want it as it came", rec.Code, rec.Body)
	}
}

// TestRefusedBeforeQueueing: what the front refuses itself, with its
// status and OpenAI error, opens no route and queues nothing.
func TestRefusedBeforeQueueing(t *testing.T) {
	p := &fakeProducer{}
	f := newFakeFront(t, p, openai.Config{Queues: []string{"chat", "bulk"}, MaxBodyBytes: 32})
	for _, c := range []struct {
		name, method, path string
		body               io.Reader
		status             int
		typ, code, param   string
	}{
		{"unknown path", "POST", "/v1/embeddings", strings.NewReader(`{}`), 404, "invalid_request_error", "unknown_url", ""},
		{"path below", "POST", openai.PathChatCompletions + "/x", strings.NewReader(`{}`), 404, "invalid_request_error", "unknown_url", ""},
		{"PUT", "PUT", openai.PathCompletions, strings.NewReader(`{}`), 405, "invalid_request_error", "", ""},
		{"truncated JSON", "POST", openai.PathChatCompletions, strings.NewReader(`{"model":`), 400, "invalid_request_error", "", ""},
		{"null", "POST", openai.PathChatCompletions, strings.NewReader(`null`), 400, "invalid_request_error", "", ""},
		{"stream not a bool", "POST", openai.PathChatCompletions, strings.NewReader(`{"stream":"yes"}`), 400, "invalid_request_error", "", ""},
		{"over the limit by one", "POST", openai.PathChatCompletions, strings.NewReader(`{"model":"` + strings.Repeat("a", 21) + `"}`), 413, "invalid_request_error", "", ""},
		{"body read error", "POST", openai.PathChatCompletions, iotest.ErrReader(errors.New("connection reset")), 400, "invalid_request_error", "", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			req := httptest.NewRequest(c.method, c.path, c.body)
			rec := httptest.NewRecorder()
			f.ServeHTTP(rec, req)
			if rec.Code != c.status {
				t.Fatalf("status %d, want %d (%s)", rec.Code, c.status, rec.Body)
			}
			msg, typ, code, param := errorOf(t, rec.Body.Bytes())
			if msg == "" || typ != c.typ || code != c.code || param != c.param {
				t.Errorf("error %q type %q code %q param %q", msg, typ, code, param)
			}
			if c.status == 405 && rec.Header().Get("Allow") != http.MethodPost {
				t.Errorf("Allow = %q", rec.Header().Get("Allow"))
			}
			if rec.Header().Get(openai.HeaderRequestID) != "" {
				t.Errorf("a refused call has a request id")
			}
		})
	}
	for _, c := range []struct {
		name   string
		header map[string]string
		param  string
	}{
		{"unknown queue", map[string]string{openai.HeaderQueue: "other"}, openai.HeaderQueue},
		{"zero timeout", map[string]string{openai.HeaderTimeout: "0s"}, openai.HeaderTimeout},
		{"timeout with a unit of its own", map[string]string{openai.HeaderTimeout: "5 minutes"}, openai.HeaderTimeout},
	} {
		t.Run(c.name, func(t *testing.T) {
			rec := post(f, openai.PathChatCompletions, `{}`, c.header)
			if rec.Code != 400 {
				t.Fatalf("status %d, want 400", rec.Code)
			}
			if _, _, _, param := errorOf(t, rec.Body.Bytes()); param != c.param {
				t.Errorf("param %q, want %q", param, c.param)
			}
		})
	}
	if reqs, _, _, _, _ := p.state(); len(reqs) > 0 || len(p.routes) > 0 {
		t.Fatalf("refused calls reached the producer: %d queued, %d routes", len(reqs), len(p.routes))
	}
	// At the limit, with blanks before the object, is no refusal.
	p.answer = func(*wire.Request) *wire.Result { return &wire.Result{StatusCode: 200, Payload: `{}`} }
	if rec := post(f, openai.PathChatCompletions, ` {"model":"`+strings.Repeat("a", 19)+`"}`, nil); rec.Code != 200 {
		t.Errorf("a body of exactly max_body_bytes: %d %s", rec.Code, rec.Body)
	}
}

// TestProducerFailures: a route that cannot be opened or a request that
// cannot be enqueued is a 503 server_error; the route opened for a
// request that was not enqueued is closed.
func TestProducerFailures(t *testing.T) {
	broken := errors.New("redis: connection refused")
	for _, c := range []struct {
		name string
		p    *fakeProducer
		msg  string
	}{
		{"results", &fakeProducer{resultsErr: broken}, "cannot open the result route"},
		{"enqueue", &fakeProducer{enqueueErr: broken}, "cannot enqueue the request"},
	} {
		t.Run(c.name, func(t *testing.T) {
			rec := post(newFakeFront(t, c.p, openai.Config{}), openai.PathChatCompletions, `{"model":"m"}`, nil)
			if rec.Code != http.StatusServiceUnavailable {
				t.Fatalf("status %d, want 503", rec.Code)
			}
			if msg, typ, _, _ := errorOf(t, rec.Body.Bytes()); msg != c.msg || typ != "server_error" {
				t.Errorf("error %q type %q, want %q server_error", msg, typ, c.msg)
			}
			if strings.Contains(rec.Body.String(), "redis") {
				t.Errorf("the producer's error leaks to the caller: %s", rec.Body)
			}
			reqs, _, _, _, closed := c.p.state()
			if len(reqs) > 0 {
				t.Errorf("queued %d", len(reqs))
			}
			if c.name == "enqueue" && len(closed) != 1 {
				t.Errorf("the route of a request not enqueued is left open (%v closed)", closed)
			}
		})
	}
}

// TestQueuedRequest: what one call puts on the queue: the queue the header
// names (the default without it), its deadline from X-Sluice-Timeout (a
// duration or seconds), its own route, the path as endpoint, the model as
// label, the forwarded headers only, and for stream: true the body
// without stream and stream_options.
func TestQueuedRequest(t *testing.T) {
	p := &fakeProducer{answer: func(*wire.Request) *wire.Result { return &wire.Result{StatusCode: 200, Payload: `{}`} }}
	f := newFakeFront(t, p, openai.Config{Queues: []string{"chat", "bulk"}, RoutePrefix: "r:",
		ForwardHeaders: []string{"X-Gateway-Model-Name"}, KeepAlive: configtypes.Duration(time.Hour)})
	for _, c := range []struct {
		name    string
		path    string
		body    string
		header  map[string]string
		queue   string
		timeout time.Duration
		model   string
		payload string
	}{
		{"defaults", openai.PathChatCompletions, `{"model":"m1","messages":[]}`, nil, "chat", 10 * time.Minute, "m1", `{"model":"m1","messages":[]}`},
		{"queue and duration", openai.PathCompletions, `{"model":"m2","prompt":"p"}`,
			map[string]string{openai.HeaderQueue: "bulk", openai.HeaderTimeout: "1500ms", "X-Gateway-Model-Name": "big", "X-Other": "no", "Authorization": "Bearer k"},
			"bulk", 1500 * time.Millisecond, "m2", `{"model":"m2","prompt":"p"}`},
		{"seconds, a model that is no string", openai.PathChatCompletions, `{"model":7}`, map[string]string{openai.HeaderTimeout: "2.5"}, "chat", 2500 * time.Millisecond, "", `{"model":7}`},
		{"stream", openai.PathChatCompletions, `{"model":"m","stream":true,"stream_options":{"include_usage":true},"n":1}`, nil, "chat", 10 * time.Minute, "m", `{"model":"m","n":1}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			if rec := post(f, c.path, c.body, c.header); rec.Code != 200 {
				t.Fatalf("status %d (%s)", rec.Code, rec.Body)
			}
			reqs, queues, _, _, _ := p.state()
			r, q := reqs[len(reqs)-1], queues[len(queues)-1]
			if q != c.queue || r.Deadline.Sub(r.Created) != c.timeout || r.ResultQueueName != "r:"+r.ID || r.Endpoint != c.path || r.Model != c.model {
				t.Errorf("queued on %s: deadline in %v, route %q, endpoint %q, model %q", q, r.Deadline.Sub(r.Created), r.ResultQueueName, r.Endpoint, r.Model)
			}
			if string(r.Payload) != c.payload {
				t.Errorf("payload %s, want %s", r.Payload, c.payload)
			}
			wantHeaders := map[string]string(nil)
			if v := c.header["X-Gateway-Model-Name"]; v != "" {
				wantHeaders = map[string]string{"X-Gateway-Model-Name": v}
			}
			if len(r.Headers) != len(wantHeaders) || r.Headers["X-Gateway-Model-Name"] != wantHeaders["X-Gateway-Model-Name"] || r.Metadata["front"] != "openai" {
				t.Errorf("headers %v, metadata %v", r.Headers, r.Metadata)
			}
		})
	}
}
