package simulator

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/sluice-io/sluice/internal/jsonscan"
)

// The canned answer and its size in tokens.
const (
	replyText   = "This is a simulated completion from the sluice gateway simulator."
	replyTokens = 12
)

// maxPooledBuf is the largest buffer kept in the pool; bigger ones are dropped.
const maxPooledBuf = 64 << 10

// scratch holds the per-request buffers.
type scratch struct {
	in  []byte // request body
	out []byte // response body
}

// outcome is how a completion request is answered.
type outcome uint8

const (
	outcomeOK     outcome = iota
	outcomeStatus         // an error status, see plan.status
	outcomeReset
)

// plan is the outcome and latency drawn (or forced) for one request.
type plan struct {
	outcome    outcome
	status     int
	latency    time.Duration
	retryAfter []string // Retry-After of a 429
}

var errBodyTooLarge = errors.New("request body too large")

func (s *Server) completion(w http.ResponseWriter, r *http.Request, chat bool) {
	n := s.requests.Add(1)
	s.noteInflight(s.inflight.Add(1))
	defer s.inflight.Add(-1)

	var deadlineMS int64
	if v := r.Header[HeaderDeadline]; len(v) > 0 {
		s.withDeadline.Add(1)
		deadlineMS, _ = strconv.ParseInt(v[0], 10, 64)
	}

	buf := s.bufs.Get().(*scratch)
	defer s.putScratch(buf)
	var err error
	buf.in, err = readBody(r.Body, buf.in[:0], s.cfg.MaxBodyBytes)
	switch {
	case errors.Is(err, errBodyTooLarge):
		s.writeError(w, http.StatusRequestEntityTooLarge, "invalid_request_error", "body_too_large",
			"request body exceeds "+strconv.FormatInt(s.cfg.MaxBodyBytes, 10)+" bytes")
		return
	case err != nil:
		s.aborted.Add(1) // the client went away while sending
		return
	}
	model, ok := scanModel(buf.in)
	if !ok {
		s.writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_json",
			"request body must be a JSON object")
		return
	}

	p, msg := s.plan(r, n)
	if msg != "" {
		s.writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_header", msg)
		return
	}
	if p.latency > 0 && !sleep(r.Context(), p.latency) {
		s.aborted.Add(1)
		// Returning would send an empty 200 if the connection is still open
		// (the server closing, not the client leaving): abort instead.
		panic(http.ErrAbortHandler)
	}
	if deadlineMS > 0 && time.Now().UnixMilli() > deadlineMS {
		s.pastDeadline.Add(1)
	}

	switch p.outcome {
	case outcomeReset:
		s.reset(w)
	case outcomeStatus:
		if p.status == http.StatusTooManyRequests {
			w.Header()["Retry-After"] = p.retryAfter
			s.writeError(w, p.status, "rate_limit_error", "rate_limit_exceeded",
				"simulated rate limit: retry later")
			return
		}
		typ, code := "invalid_request_error", "simulated_error"
		if p.status >= 500 {
			typ, code = "server_error", "simulated_server_error"
		}
		s.writeError(w, p.status, typ, code, "simulated error "+strconv.Itoa(p.status))
	default:
		if model == nil {
			model = []byte(`"sim"`)
		}
		buf.out = appendCompletion(buf.out[:0], chat, n, time.Now().Unix(), model, len(buf.in))
		s.byStatus[http.StatusOK].Add(1)
		w.Header()["Content-Type"] = s.ctJSON
		_, _ = w.Write(buf.out)
	}
}

// plan draws the outcome and latency of the n-th request, then applies the
// X-Sim-* overrides. A non-empty message means an override header is invalid.
func (s *Server) plan(r *http.Request, n uint64) (plan, string) {
	rnd := newRNG(s.seed, n)
	p := plan{retryAfter: s.retryAfter}
	switch u := rnd.float64(); {
	case u < s.cfg.Rate429:
		p.outcome, p.status = outcomeStatus, http.StatusTooManyRequests
	case u < s.cfg.Rate429+s.cfg.Rate5xx:
		p.outcome, p.status = outcomeStatus, s.cfg.Status5xx
	case u < s.cfg.Rate429+s.cfg.Rate5xx+s.cfg.RateReset:
		p.outcome = outcomeReset
	}
	p.latency = s.cfg.Latency.sample(&rnd)

	if v := r.Header[HeaderStatus]; len(v) > 0 {
		if v[0] == "reset" {
			p.outcome = outcomeReset
		} else {
			code, err := strconv.Atoi(v[0])
			switch {
			case err == nil && code == http.StatusOK:
				p.outcome = outcomeOK
			case err == nil && code >= 400 && code <= 599:
				p.outcome, p.status = outcomeStatus, code
			default:
				return p, HeaderStatus + " must be 200, a status in [400,599] or \"reset\", not " + strconv.Quote(v[0])
			}
		}
	}
	if v := r.Header[HeaderLatencyMS]; len(v) > 0 {
		ms, err := strconv.ParseFloat(v[0], 64)
		if err != nil || !(ms >= 0 && ms <= float64(time.Hour/time.Millisecond)) {
			return p, HeaderLatencyMS + " must be milliseconds in [0,3600000], not " + strconv.Quote(v[0])
		}
		p.latency = time.Duration(ms * float64(time.Millisecond))
	}
	if v := r.Header[HeaderRetryAfter]; len(v) > 0 {
		if secs, err := strconv.ParseUint(v[0], 10, 32); err != nil || secs > 1<<20 {
			return p, HeaderRetryAfter + " must be whole seconds, not " + strconv.Quote(v[0])
		}
		p.retryAfter = v[:1]
	}
	return p, ""
}

// sleep waits for d or until ctx ends, and reports whether d elapsed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		t.Stop()
		return false
	}
}

// reset drops the request's connection without a response. On HTTP/1 the
// connection is hijacked and closed with SO_LINGER 0, so the client sees a
// TCP RST; where hijacking is impossible (HTTP/2) the handler aborts.
func (s *Server) reset(w http.ResponseWriter) {
	s.resets.Add(1)
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(http.ErrAbortHandler) // net/http drops the stream without logging
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
}

func (s *Server) putScratch(b *scratch) {
	if cap(b.in) > maxPooledBuf || cap(b.out) > maxPooledBuf {
		return
	}
	s.bufs.Put(b)
}

// writeError answers status with an OpenAI-style error body.
func (s *Server) writeError(w http.ResponseWriter, status int, typ, code, msg string) {
	if status >= 0 && status < len(s.byStatus) {
		s.byStatus[status].Add(1)
	}
	b := make([]byte, 0, 128+len(msg))
	b = append(b, `{"error":{"message":`...)
	b = appendJSONString(b, msg)
	b = append(b, `,"type":`...)
	b = appendJSONString(b, typ)
	b = append(b, `,"param":null,"code":`...)
	b = appendJSONString(b, code)
	b = append(b, "}}\n"...)
	w.Header()["Content-Type"] = s.ctJSON
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// readBody appends all of r to b, failing once it passes limit bytes.
func readBody(r io.Reader, b []byte, limit int64) ([]byte, error) {
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if int64(len(b)) > limit {
			return b, errBodyTooLarge
		}
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
}

// appendCompletion appends the 200 answer of the n-th request; model is a
// JSON string literal, promptBytes the size of the request body.
func appendCompletion(b []byte, chat bool, n uint64, created int64, model []byte, promptBytes int) []byte {
	prompt := max(1, promptBytes/4) // a rough token count
	if chat {
		b = append(b, `{"id":"chatcmpl-`...)
	} else {
		b = append(b, `{"id":"cmpl-`...)
	}
	b = strconv.AppendUint(b, n, 10)
	if chat {
		b = append(b, `","object":"chat.completion","created":`...)
	} else {
		b = append(b, `","object":"text_completion","created":`...)
	}
	b = strconv.AppendInt(b, created, 10)
	b = append(b, `,"model":`...)
	b = append(b, model...)
	if chat {
		b = append(b, `,"choices":[{"index":0,"message":{"role":"assistant","content":"`+replyText+`"},"finish_reason":"stop"}]`...)
	} else {
		b = append(b, `,"choices":[{"index":0,"text":"`+replyText+`","logprobs":null,"finish_reason":"stop"}]`...)
	}
	b = append(b, `,"usage":{"prompt_tokens":`...)
	b = strconv.AppendInt(b, int64(prompt), 10)
	b = append(b, `,"completion_tokens":`...)
	b = strconv.AppendInt(b, replyTokens, 10)
	b = append(b, `,"total_tokens":`...)
	b = strconv.AppendInt(b, int64(prompt+replyTokens), 10)
	b = append(b, "}}\n"...)
	return b
}

// scanModel reports whether body is a JSON object and returns the raw string
// literal (quotes and escapes included) of its top-level "model" member, or
// nil when there is none or it is not a string. It does not allocate.
func scanModel(body []byte) (model []byte, ok bool) {
	i := jsonscan.SkipSpace(body, 0)
	if i == len(body) || body[i] != '{' || !json.Valid(body) {
		return nil, false
	}
	// body is now known to be one valid JSON object: scan its members.
	i = jsonscan.SkipSpace(body, i+1)
	for body[i] != '}' {
		keyStart := i
		i = jsonscan.SkipString(body, i)
		key := body[keyStart:i]
		i = jsonscan.SkipSpace(body, i)   // at ':'
		i = jsonscan.SkipSpace(body, i+1) // at the value
		valStart := i
		i = jsonscan.SkipValue(body, i)
		if string(key) == `"model"` {
			model = nil
			if body[valStart] == '"' {
				model = body[valStart:i]
			}
		}
		i = jsonscan.SkipSpace(body, i)
		if body[i] == ',' {
			i = jsonscan.SkipSpace(body, i+1)
		}
	}
	return model, true
}

// appendJSONString appends s as a JSON string literal.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}
