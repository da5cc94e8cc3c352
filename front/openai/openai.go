// Package openai is sluice's OpenAI-compatible synchronous front:
// POST /v1/chat/completions and POST /v1/completions. Each call becomes one
// request on a sluice queue (through a submit.Producer), with a result
// route of its own, and the connection is held until the dispatcher writes
// that request's one result; the result's gateway response is the answer.
// The queue's deadline, gates, retries and cancellation all apply: the
// front only turns one HTTP call into one queued request and back.
//
//   - The queue is chosen by X-Sluice-Queue (one of Config.Queues), the
//     timeout by X-Sluice-Timeout; the timeout is the request's deadline.
//   - A caller that hangs up cancels its request: still queued, it is
//     removed; in flight, the dispatcher aborts its gateway call.
//   - sluice's error codes map to HTTP statuses (DEADLINE_EXCEEDED → 504,
//     GATE_DROPPED → 429, …; see Status), with an OpenAI-shaped error body.
//   - stream: true answers as server-sent events. The dispatcher reads the
//     gateway's whole response before it writes a result, so the front
//     sends the request to the gateway without "stream" and, while it
//     waits, keeps the connection alive with SSE comments; when the result
//     comes it is replayed as OpenAI chunk events (one chunk per choice, a
//     finish chunk, a usage chunk when stream_options.include_usage, then
//     [DONE]). That is streaming of the protocol, not of the tokens: the
//     first token arrives with the last.
package openai

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sluice-io/sluice/core/submit"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
)

// The paths the front serves.
const (
	PathChatCompletions = "/v1/chat/completions"
	PathCompletions     = "/v1/completions"
)

// Front is the OpenAI-compatible synchronous front, an http.Handler.
type Front struct {
	cfg Config
	p   submit.Producer
	log *slog.Logger

	// abandoned calls: cancelled and drained in the background.
	wg     sync.WaitGroup
	stop   chan struct{}
	closed sync.Once
}

var _ http.Handler = (*Front)(nil)

// New returns the front for cfg on producer p (which the front does not
// close). cfg is defaulted and validated.
func New(cfg Config, p submit.Producer) (*Front, error) {
	return NewWithLogger(cfg, p, nil)
}

// NewWithLogger is New with a logger (nil: discard).
func NewWithLogger(cfg Config, p submit.Producer, log *slog.Logger) (*Front, error) {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if p == nil {
		return nil, errors.New("openai_api: no producer")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Front{cfg: cfg, p: p, log: log, stop: make(chan struct{})}, nil
}

// Close stops the background clean-up of abandoned calls and waits for it.
// Serve no more calls after Close.
func (f *Front) Close() error {
	f.closed.Do(func() { close(f.stop) })
	f.wg.Wait()
	return nil
}

// head is what the front reads of a request body.
type head struct {
	Model         json.RawMessage `json:"model"`
	Stream        bool            `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// call is one request in progress.
type call struct {
	id, queue, route string
	path             string
	stream, usage    bool
	deadline         time.Time
}

// ServeHTTP implements http.Handler.
func (f *Front) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != PathChatCompletions && r.URL.Path != PathCompletions {
		writeError(w, http.StatusNotFound, apiError{Message: "no such endpoint: " + r.URL.Path, Type: "invalid_request_error", Code: "unknown_url"})
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeError(w, http.StatusMethodNotAllowed, apiError{Message: r.Method + " is not allowed; use POST", Type: "invalid_request_error"})
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, f.cfg.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, http.StatusRequestEntityTooLarge, apiError{Message: fmt.Sprintf("request body is larger than %d bytes", f.cfg.MaxBodyBytes), Type: "invalid_request_error"})
			return
		}
		writeError(w, http.StatusBadRequest, apiError{Message: "reading the request body: " + err.Error(), Type: "invalid_request_error"})
		return
	}
	var h head
	if t := strings.TrimLeft(string(body), " \t\r\n"); !strings.HasPrefix(t, "{") {
		writeError(w, http.StatusBadRequest, apiError{Message: "the request body must be a JSON object", Type: "invalid_request_error"})
		return
	}
	if err := json.Unmarshal(body, &h); err != nil {
		writeError(w, http.StatusBadRequest, apiError{Message: "the request body is not valid JSON: " + err.Error(), Type: "invalid_request_error"})
		return
	}
	c := call{path: r.URL.Path, stream: h.Stream, usage: h.StreamOptions != nil && h.StreamOptions.IncludeUsage}
	c.queue = r.Header.Get(HeaderQueue)
	if c.queue == "" {
		c.queue = f.cfg.DefaultQueue
	} else if !slices.Contains(f.cfg.Queues, c.queue) {
		writeError(w, http.StatusBadRequest, apiError{Message: fmt.Sprintf("%s %q is not one of this front's queues", HeaderQueue, c.queue), Type: "invalid_request_error", Param: HeaderQueue})
		return
	}
	timeout := f.cfg.DefaultTimeout.D()
	if v := r.Header.Get(HeaderTimeout); v != "" {
		if timeout, err = parseTimeout(v, f.cfg.MaxTimeout.D()); err != nil {
			writeError(w, http.StatusBadRequest, apiError{Message: HeaderTimeout + ": " + err.Error(), Type: "invalid_request_error", Param: HeaderTimeout})
			return
		}
	}
	payload := json.RawMessage(body)
	if h.Stream {
		if payload, err = withoutStream(body); err != nil {
			writeError(w, http.StatusBadRequest, apiError{Message: err.Error(), Type: "invalid_request_error"})
			return
		}
	}
	c.id = newID()
	c.route = f.cfg.RoutePrefix + c.id
	now := time.Now()
	c.deadline = now.Add(timeout)
	var model string
	_ = json.Unmarshal(h.Model, &model) // a label only; a non-string model is the gateway's to refuse
	req := &wire.Request{
		ID: c.id, Created: now, Deadline: c.deadline, Payload: payload, Endpoint: c.path,
		ResultQueueName: c.route, Model: model, Metadata: map[string]string{"front": "openai"},
	}
	for _, name := range f.cfg.ForwardHeaders {
		if v := r.Header.Get(name); v != "" {
			if req.Headers == nil {
				req.Headers = map[string]string{}
			}
			req.Headers[name] = v
		}
	}
	w.Header().Set(HeaderRequestID, c.id)

	ctx := r.Context()
	reader, err := f.p.Results(ctx, c.route)
	if err != nil {
		f.log.Error("openai front: open result route", "route", c.route, "err", err)
		writeError(w, http.StatusServiceUnavailable, apiError{Message: "cannot open the result route", Type: "server_error"})
		return
	}
	if err := f.p.Enqueue(ctx, c.queue, []*wire.Request{req}); err != nil {
		reader.Close()
		f.log.Error("openai front: enqueue", "queue", c.queue, "id", c.id, "err", err)
		writeError(w, http.StatusServiceUnavailable, apiError{Message: "cannot enqueue the request", Type: "server_error"})
		return
	}
	f.wait(w, r, c, reader)
}

// wait holds the call until its result, then answers.
func (f *Front) wait(w http.ResponseWriter, r *http.Request, c call, reader submit.Reader) {
	waitCtx, cancel := context.WithDeadline(r.Context(), c.deadline.Add(f.cfg.ResultGrace.D()))
	defer cancel()
	type outcome struct {
		res *wire.Result
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := f.await(waitCtx, reader, c.id)
		done <- outcome{res, err}
	}()
	var sse *sseWriter
	var tick <-chan time.Time
	if c.stream {
		t := time.NewTicker(f.cfg.KeepAlive.D())
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-tick:
			if sse == nil {
				sse = startSSE(w)
			}
			if sse.comment("keep-alive") != nil {
				// The write failed: the caller is gone; r.Context() ends
				// shortly and await returns.
				tick = nil
			}
		case o := <-done:
			if o.err != nil {
				f.abandon(c, reader)
				if r.Context().Err() != nil {
					f.log.Info("openai front: caller hung up; request cancelled", "id", c.id, "queue", c.queue)
					return
				}
				e := apiError{Message: fmt.Sprintf("no result by the request's deadline plus %v of grace", f.cfg.ResultGrace.D()),
					Type: "timeout", Code: strings.ToLower(string(wire.CodeDeadlineExceeded))}
				w.Header().Set(HeaderErrorCode, string(wire.CodeDeadlineExceeded))
				f.answerError(w, sse, http.StatusGatewayTimeout, e)
				return
			}
			f.answer(w, sse, c, o.res)
			return
		}
	}
}

// await reads route until the result of id is there, acks it and closes
// the reader. On error the reader stays open (for abandon).
func (f *Front) await(ctx context.Context, reader submit.Reader, id string) (*wire.Result, error) {
	for {
		rs, err := reader.Next(ctx)
		if err != nil {
			return nil, err
		}
		for _, res := range rs {
			// A route is this call's own: anything else on it is a stray
			// (a result that did not decode); ack it so it does not return.
			if err := reader.Ack(context.WithoutCancel(ctx), res); err != nil {
				f.log.Warn("openai front: ack", "id", res.ID, "err", err)
			}
			if res.Result != nil && res.ID == id {
				reader.Close()
				return res.Result, nil
			}
			f.log.Warn("openai front: stray result on a call's route", "want", id, "got", res.ID, "err", res.Err)
		}
	}
}

// abandon cancels a call nobody waits for any more and reads its route
// until the result comes (and acks it, so the route is left empty): the
// cancel is sent again every second, because a request the dispatcher was
// just taking may miss the first one. It gives up at the deadline plus
// twice the grace, or when the front closes.
func (f *Front) abandon(c call, reader submit.Reader) {
	f.wg.Go(func() {
		defer reader.Close()
		until := c.deadline.Add(2 * f.cfg.ResultGrace.D())
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if _, err := f.p.Cancel(ctx, c.queue, transport.Cancellation{RequestID: c.id}); err != nil {
				f.log.Warn("openai front: cancel", "id", c.id, "queue", c.queue, "err", err)
			}
			cancel()
			ctx, cancel = context.WithTimeout(context.Background(), time.Second)
			go func() {
				select {
				case <-f.stop:
					cancel()
				case <-ctx.Done():
				}
			}()
			rs, _ := reader.Next(ctx)
			cancel()
			if len(rs) > 0 {
				if err := reader.Ack(context.Background(), rs...); err != nil {
					f.log.Warn("openai front: ack an abandoned call's result", "id", c.id, "err", err)
				}
				return
			}
			select {
			case <-f.stop:
				return
			default:
			}
			if time.Now().After(until) {
				f.log.Warn("openai front: no result for an abandoned call", "id", c.id, "queue", c.queue)
				return
			}
		}
	})
}

// answer writes res as the call's response.
func (f *Front) answer(w http.ResponseWriter, sse *sseWriter, c call, res *wire.Result) {
	if res.ErrorCode != wire.CodeNone {
		w.Header().Set(HeaderErrorCode, string(res.ErrorCode))
		f.answerError(w, sse, Status(res.ErrorCode), apiError{Message: resultMessage(res), Type: errorType(Status(res.ErrorCode)), Code: strings.ToLower(string(res.ErrorCode))})
		return
	}
	status := res.StatusCode
	if status == 0 {
		status = http.StatusOK
	}
	if status >= 400 {
		// The gateway's own final answer: its status and body, as it gave them.
		if sse != nil {
			sse.data([]byte(gatewayErrorEvent(status, res.Payload)))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		io.WriteString(w, res.Payload)
		return
	}
	if !c.stream {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		io.WriteString(w, res.Payload)
		return
	}
	if sse == nil {
		sse = startSSE(w)
	}
	if err := replay(sse, c, []byte(res.Payload)); err != nil {
		f.log.Warn("openai front: stream the result", "id", c.id, "err", err)
	}
}

// answerError writes e with status, or as an SSE error event once the
// stream has started (its 200 is sent).
func (f *Front) answerError(w http.ResponseWriter, sse *sseWriter, status int, e apiError) {
	if sse != nil {
		b, _ := json.Marshal(errorBody{e})
		sse.data(b)
		return
	}
	writeError(w, status, e)
}

// Status is the HTTP status a call answered with an error code gets.
func Status(code wire.ErrorCode) int {
	switch code {
	case wire.CodeDeadlineExceeded:
		return http.StatusGatewayTimeout
	case wire.CodeGateDropped:
		return http.StatusTooManyRequests
	case wire.CodeGateError:
		return http.StatusServiceUnavailable
	case wire.CodeInferenceError:
		return http.StatusBadGateway
	case wire.CodeInvalidRequest:
		return http.StatusBadRequest
	case wire.CodeCancelled:
		// Cancelled by someone else (`sluice cancel`, a job cancel): the
		// caller did not hang up, or nobody would read this. 499 as
		// nginx uses it: not an error of the server, not to be retried.
		return 499
	default: // PAYLOAD_UNAVAILABLE and codes this front does not know
		return http.StatusInternalServerError
	}
}

func errorType(status int) string {
	switch {
	case status == http.StatusTooManyRequests:
		return "rate_limit_error"
	case status == http.StatusGatewayTimeout:
		return "timeout"
	case status < 500:
		return "invalid_request_error"
	default:
		return "server_error"
	}
}

func resultMessage(res *wire.Result) string {
	if res.ErrorMessage != "" {
		return res.ErrorMessage
	}
	return string(res.ErrorCode)
}

// apiError is OpenAI's error object.
type apiError struct {
	Message string `json:"message"`
	Type    string `json:"type"`
	Param   string `json:"param,omitempty"`
	Code    string `json:"code,omitempty"`
}

type errorBody struct {
	Error apiError `json:"error"`
}

func writeError(w http.ResponseWriter, status int, e apiError) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	b, _ := json.Marshal(errorBody{e})
	w.Write(append(b, '\n'))
}

// gatewayErrorEvent is an SSE error event for the gateway's error answer:
// its body when that is already an OpenAI error object, else wrapped.
func gatewayErrorEvent(status int, payload string) string {
	var probe struct {
		Error json.RawMessage `json:"error"`
	}
	if json.Unmarshal([]byte(payload), &probe) == nil && len(probe.Error) > 0 && string(probe.Error) != "null" {
		return payload
	}
	b, _ := json.Marshal(errorBody{apiError{Message: fmt.Sprintf("the gateway answered %d: %s", status, payload), Type: errorType(status), Code: strconv.Itoa(status)}})
	return string(b)
}

// parseTimeout reads a Go duration or a number of seconds, in (0, max].
func parseTimeout(v string, max time.Duration) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil {
		s, ferr := strconv.ParseFloat(v, 64)
		if ferr != nil {
			return 0, fmt.Errorf("%q is neither a duration (\"90s\") nor a number of seconds", v)
		}
		d = time.Duration(s * float64(time.Second))
	}
	if d <= 0 {
		return 0, fmt.Errorf("%q is not positive", v)
	}
	if d > max {
		return 0, fmt.Errorf("%v is above the largest allowed, %v", d, max)
	}
	return d, nil
}

// withoutStream returns body without its stream and stream_options
// members, so the gateway answers with one whole completion.
func withoutStream(body []byte) (json.RawMessage, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, fmt.Errorf("the request body is not a JSON object: %w", err)
	}
	delete(m, "stream")
	delete(m, "stream_options")
	b, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	return b, nil
}

func newID() string {
	var b [12]byte
	rand.Read(b[:])
	return "oa-" + hex.EncodeToString(b[:])
}
