package dispatch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/internal/simulator"
)

// newClient returns a client closed when the test ends.
func newClient(t testing.TB, cfg Config) *Client {
	t.Helper()
	c, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// newServer starts a loopback server, speaking HTTP/1.1 and h2c, closed
// (with its connections) when the test ends.
func newServer(t testing.TB, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.Config.Protocols = simulator.ServerProtocols()
	srv.Start()
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
	})
	return srv
}

// bothProtocols runs test over HTTP/1.1 (net/http's client), over h2c
// (sluice's own HTTP/2 client) and under auto (which finds that newServer's
// gateways speak h2c).
func bothProtocols(t *testing.T, test func(t *testing.T, proto string)) {
	for _, proto := range []string{ProtocolHTTP1, ProtocolH2C, ProtocolAuto} {
		t.Run(proto, func(t *testing.T) { test(t, proto) })
	}
}

func newRequest(deadlineIn time.Duration) *wire.Request {
	return &wire.Request{
		ID:       "req-1",
		Deadline: time.Now().Add(deadlineIn),
		Payload:  []byte(`{"model":"m","prompt":"hi"}`),
	}
}

func TestPayloadForwarded(t *testing.T) { bothProtocols(t, testPayloadForwarded) }

func testPayloadForwarded(t *testing.T, proto string) {
	type seen struct {
		body   []byte
		length int64
		te     []string
		method string
		ctype  []string
	}
	got := make(chan seen, 1)
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- seen{b, r.ContentLength, r.TransferEncoding, r.Method, r.Header.Values("Content-Type")}
	})
	c := newClient(t, Config{Protocol: proto})

	big := make([]byte, 1<<20)
	for i := range big {
		big[i] = byte(' ' + rand.IntN(95))
	}
	payloads := [][]byte{
		[]byte("{\"model\" : \"m\",\n\t\"prompt\":\"2+2 \\u00e9 é 🚀\"  }"),
		[]byte(`{"a":1.0000000000000001,"b":[  ],"c":"\u0000"}`),
		append(append([]byte(`{"p":"`), big...), `"}`...),
		{},
	}
	for i, p := range payloads {
		req := newRequest(time.Minute)
		req.Payload = p
		if out := c.Do(t.Context(), Target{BaseURL: srv.URL}, req); out.Class != Success {
			t.Fatalf("payload %d: %+v", i, out)
		}
		s := <-got
		if !bytes.Equal(s.body, p) {
			t.Errorf("payload %d: server got %d bytes, want %d identical bytes", i, len(s.body), len(p))
		}
		if s.length != int64(len(p)) || len(s.te) != 0 {
			t.Errorf("payload %d: content length %d, transfer encoding %v; want %d, none", i, s.length, s.te, len(p))
		}
		if s.method != http.MethodPost || len(s.ctype) != 1 || s.ctype[0] != "application/json" {
			t.Errorf("payload %d: method %s, content type %q", i, s.method, s.ctype)
		}
	}
}

// The same headers reach the gateway over HTTP/1.1 and over h2c.
func TestHeaders(t *testing.T) { bothProtocols(t, testHeaders) }

func testHeaders(t *testing.T, proto string) {
	got := make(chan *http.Request, 1)
	handler := func(w http.ResponseWriter, r *http.Request) {
		if wantMajor := map[string]int{ProtocolHTTP1: 1, ProtocolH2C: 2, ProtocolAuto: 2}[proto]; r.ProtoMajor != wantMajor {
			t.Errorf("request over %s, want HTTP/%d", r.Proto, wantMajor)
		}
		got <- r
	}
	srv := newServer(t, handler) // speaks both
	url, addr := srv.URL, srv.Listener.Addr().String()
	c := newClient(t, Config{Protocol: proto})
	target := Target{BaseURL: url, InferenceObjective: "batch-low"}

	t.Run("forwarded and refused", func(t *testing.T) {
		req := newRequest(time.Minute)
		req.Metadata = map[string]string{"userid": "tenant-7"}
		req.Headers = map[string]string{
			// forwarded
			"traceparent":   "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
			"X-Custom":      "a b\tc",
			"authorization": "Bearer t",
			"user-agent":    "producer/1",
			// refused
			"connection":                     "close",
			"Keep-Alive":                     "timeout=1",
			"proxy-connection":               "keep-alive",
			"transfer-encoding":              "chunked",
			"te":                             "trailers",
			"trailer":                        "X-T",
			"upgrade":                        "h2c",
			"content-length":                 "1",
			"host":                           "evil.example",
			"content-type":                   "text/plain",
			"proxy-authorization":            "Basic x",
			"Proxy-Authenticate":             "Basic",
			"expect":                         "100-continue",
			"accept-encoding":                "gzip",
			"x-request-deadline":             "1",
			"X-Envoy-Upstream-Rq-Timeout-Ms": "1",
			"bad name":                       "x",
			"":                               "x",
			"X-Injected":                     "a\r\nX-Evil: 1",
		}
		before := c.RefusedHeaders()
		out := c.Do(t.Context(), target, req)
		if out.Class != Success {
			t.Fatalf("outcome: %+v", out)
		}
		const wantRefused = 19
		if out.Refused != wantRefused || c.RefusedHeaders()-before != wantRefused {
			t.Errorf("refused = %d (counter +%d), want %d", out.Refused, c.RefusedHeaders()-before, wantRefused)
		}
		r := <-got
		want := map[string]string{
			"Traceparent":                   req.Headers["traceparent"],
			"X-Custom":                      "a b\tc",
			"Authorization":                 "Bearer t",
			"User-Agent":                    "producer/1",
			"Content-Type":                  "application/json",
			"X-Gateway-Inference-Objective": "batch-low",
			"X-Llm-D-Inference-Fairness-Id": "tenant-7",
		}
		for k, v := range want {
			if vs := r.Header.Values(k); len(vs) != 1 || vs[0] != v {
				t.Errorf("header %s = %q, want [%q]", k, vs, v)
			}
		}
		for _, k := range []string{"Keep-Alive", "Proxy-Connection", "Te", "Trailer", "Upgrade", "Proxy-Authorization",
			"Proxy-Authenticate", "Expect", "Accept-Encoding", "X-Injected", "X-Evil", "Bad Name"} {
			if vs := r.Header.Values(k); len(vs) != 0 {
				t.Errorf("refused header %s reached the server: %q", k, vs)
			}
		}
		if r.Host != addr || len(r.TransferEncoding) != 0 || r.ContentLength != int64(len(req.Payload)) {
			t.Errorf("host %q, transfer encoding %v, content length %d", r.Host, r.TransferEncoding, r.ContentLength)
		}
		if v := r.Header.Get("X-Request-Deadline"); v != strconv.FormatInt(req.Deadline.UnixMilli(), 10) {
			t.Errorf("deadline header %q was overridden by the message", v)
		}
		if v := r.Header.Get("X-Envoy-Upstream-Rq-Timeout-Ms"); v == "1" {
			t.Errorf("timeout header %q was overridden by the message", v)
		}
	})

	t.Run("stamp wins over message, message over objective", func(t *testing.T) {
		req := newRequest(time.Minute)
		req.Metadata = map[string]string{"userid": "from-metadata"}
		req.Headers = map[string]string{
			"x-llm-d-inference-fairness-id": "from-header",
			"X-LLM-D-Inference-Fairness-ID": "from-header-2",
			"x-gateway-inference-objective": "interactive",
		}
		if out := c.Do(t.Context(), target, req); out.Class != Success || out.Refused != 0 {
			t.Fatalf("outcome: %+v", out)
		}
		r := <-got
		if vs := r.Header.Values("X-Llm-D-Inference-Fairness-Id"); len(vs) != 1 || vs[0] != "from-metadata" {
			t.Errorf("fairness = %q", vs)
		}
		if vs := r.Header.Values("X-Gateway-Inference-Objective"); len(vs) != 1 || vs[0] != "interactive" {
			t.Errorf("objective = %q", vs)
		}
	})

	t.Run("no objective no userid", func(t *testing.T) {
		req := newRequest(time.Minute)
		req.Metadata = map[string]string{"job_id": "j"}
		if out := c.Do(t.Context(), Target{BaseURL: url}, req); out.Class != Success {
			t.Fatalf("outcome: %+v", out)
		}
		r := <-got
		for _, k := range []string{"X-Gateway-Inference-Objective", "X-Llm-D-Inference-Fairness-Id", "Traceparent"} {
			if _, ok := r.Header[k]; ok {
				t.Errorf("unexpected header %s", k)
			}
		}
	})
}

func TestFilterHeaders(t *testing.T) {
	c := newClient(t, Config{DeadlineHeader: "X-My-Deadline", TimeoutHeader: HeaderOff})
	kept, refused := c.FilterHeaders(map[string]string{
		"traceparent":        "t",
		"x-my-deadline":      "1",
		"connection":         "close",
		"x-request-deadline": "2", // not this client's deadline header
	})
	if len(kept) != 2 || kept.Get("Traceparent") != "t" || kept.Get("X-Request-Deadline") != "2" {
		t.Errorf("kept = %v", kept)
	}
	if _, ok := kept["Traceparent"]; !ok {
		t.Errorf("kept keys are not canonical: %v", kept)
	}
	if len(refused) != 2 {
		t.Errorf("refused = %v", refused)
	}
	for _, k := range []string{"Connection", "Keep-Alive", "Proxy-Connection", "Transfer-Encoding", "Te", "Trailer",
		"Upgrade", "Content-Length", "Host", "Expect", "Proxy-Authorization", "Proxy-Authenticate", "Content-Type", "Accept-Encoding"} {
		if http.CanonicalHeaderKey(k) != k || !refusedHeader(k) {
			t.Errorf("%s is not refused in canonical form", k)
		}
	}
}

func TestDeadlineHeaders(t *testing.T) {
	got := make(chan http.Header, 1)
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header
	})
	target := Target{BaseURL: srv.URL}
	ms := func(h http.Header, k string) int64 {
		t.Helper()
		n, err := strconv.ParseInt(h.Get(k), 10, 64)
		if err != nil {
			t.Fatalf("header %s = %q: %v", k, h.Get(k), err)
		}
		return n
	}
	const slack = 2000 // ms, generous for a loaded machine
	within := func(name string, got, want int64) {
		t.Helper()
		if got > want || got < want-slack {
			t.Errorf("%s = %d, want in [%d, %d]", name, got, want-slack, want)
		}
	}

	t.Run("request deadline", func(t *testing.T) {
		c := newClient(t, Config{})
		req := newRequest(10 * time.Second)
		c.Do(t.Context(), target, req)
		h := <-got
		if n := ms(h, "x-request-deadline"); n != req.Deadline.UnixMilli() {
			t.Errorf("deadline header = %d, want %d", n, req.Deadline.UnixMilli())
		}
		within("timeout header", ms(h, "x-envoy-upstream-rq-timeout-ms"), 10000)
	})
	t.Run("request timeout nearer", func(t *testing.T) {
		c := newClient(t, Config{RequestTimeout: 3 * time.Second})
		req := newRequest(time.Hour)
		c.Do(t.Context(), target, req)
		h := <-got
		if n := ms(h, "x-request-deadline"); n != req.Deadline.UnixMilli() {
			t.Errorf("deadline header = %d, want %d", n, req.Deadline.UnixMilli())
		}
		within("timeout header", ms(h, "x-envoy-upstream-rq-timeout-ms"), 3000)
	})
	t.Run("caller deadline nearer", func(t *testing.T) {
		c := newClient(t, Config{})
		ctx, cancel := context.WithTimeout(t.Context(), 4*time.Second)
		defer cancel()
		c.Do(ctx, target, newRequest(time.Hour))
		within("timeout header", ms(<-got, "x-envoy-upstream-rq-timeout-ms"), 4000)
	})
	t.Run("at least one", func(t *testing.T) {
		c := newClient(t, Config{})
		pt, err := c.target(target)
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		for _, left := range []time.Duration{0, 300 * time.Microsecond, 1999 * time.Microsecond} {
			h, _ := c.headers(pt, newRequest(time.Minute), &Overrides{}, now.Add(left), now.Add(left), now)
			if v := h.Get("X-Envoy-Upstream-Rq-Timeout-Ms"); v != "1" {
				t.Errorf("%v left: timeout header = %q, want 1", left, v)
			}
		}
	})
	t.Run("custom names", func(t *testing.T) {
		c := newClient(t, Config{DeadlineHeader: "X-Deadline-Ms", TimeoutHeader: "grpc-timeout-ms"})
		req := newRequest(time.Minute)
		c.Do(t.Context(), target, req)
		h := <-got
		if n := ms(h, "X-Deadline-Ms"); n != req.Deadline.UnixMilli() {
			t.Errorf("deadline header = %d", n)
		}
		within("timeout header", ms(h, "Grpc-Timeout-Ms"), 60000)
		if h.Get("X-Request-Deadline") != "" || h.Get("X-Envoy-Upstream-Rq-Timeout-Ms") != "" {
			t.Errorf("default headers sent: %v", h)
		}
	})
	for _, off := range []string{HeaderOff, "-"} {
		t.Run("disabled "+off, func(t *testing.T) {
			c := newClient(t, Config{DeadlineHeader: off, TimeoutHeader: off})
			c.Do(t.Context(), target, newRequest(time.Minute))
			h := <-got
			if h.Get("X-Request-Deadline") != "" || h.Get("X-Envoy-Upstream-Rq-Timeout-Ms") != "" {
				t.Errorf("disabled headers sent: %v", h)
			}
		})
	}
	t.Run("only timeout disabled", func(t *testing.T) {
		c := newClient(t, Config{TimeoutHeader: HeaderOff})
		req := newRequest(time.Minute)
		c.Do(t.Context(), target, req)
		h := <-got
		if n := ms(h, "x-request-deadline"); n != req.Deadline.UnixMilli() {
			t.Errorf("deadline header = %d", n)
		}
		if h.Get("X-Envoy-Upstream-Rq-Timeout-Ms") != "" {
			t.Errorf("timeout header sent")
		}
	})
	t.Run("no request deadline", func(t *testing.T) {
		c := newClient(t, Config{RequestTimeout: 7 * time.Second})
		req := newRequest(0)
		req.Deadline = time.Time{}
		c.Do(t.Context(), target, req)
		h := <-got
		if h.Get("X-Request-Deadline") != "" {
			t.Errorf("deadline header sent without a deadline")
		}
		within("timeout header", ms(h, "x-envoy-upstream-rq-timeout-ms"), 7000)
	})
}

func TestClassifyStatus(t *testing.T) { bothProtocols(t, testClassifyStatus) }

func testClassifyStatus(t *testing.T, proto string) {
	date := time.Now().Add(30 * time.Second).UTC().Format(http.TimeFormat)
	tests := []struct {
		status        int
		header        map[string]string
		class         Class
		retryAfterMin time.Duration
		retryAfterMax time.Duration
	}{
		{status: 200, class: Success},
		{status: 201, class: Success},
		{status: 204, class: Success},
		{status: 302, header: map[string]string{"Location": "/elsewhere"}, class: Fatal},
		{status: 400, class: Fatal},
		{status: 404, class: Fatal},
		{status: 422, class: Fatal},
		{status: 429, header: map[string]string{"Retry-After": "7"}, class: Retryable, retryAfterMin: 7 * time.Second, retryAfterMax: 7 * time.Second},
		{status: 429, header: map[string]string{"Retry-After": date}, class: Retryable, retryAfterMin: 27 * time.Second, retryAfterMax: 30 * time.Second},
		{status: 429, header: map[string]string{"x-llm-d-request-dropped-reason": "queue full"}, class: Retryable},
		{status: 500, class: Retryable},
		{status: 503, header: map[string]string{"Retry-After": "120"}, class: Retryable, retryAfterMin: 2 * time.Minute, retryAfterMax: 2 * time.Minute},
		{status: 504, class: Retryable},
	}
	c := newClient(t, Config{Protocol: proto})
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.status), func(t *testing.T) {
			body := fmt.Sprintf(`{"status":%d}`, tt.status)
			srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
				for k, v := range tt.header {
					w.Header().Set(k, v)
				}
				w.WriteHeader(tt.status)
				if tt.status != 204 {
					_, _ = io.WriteString(w, body)
				}
			})
			out := c.Do(t.Context(), Target{BaseURL: srv.URL}, newRequest(time.Minute))
			if out.Class != tt.class || out.StatusCode != tt.status {
				t.Fatalf("outcome %+v, want class %v status %d", out, tt.class, tt.status)
			}
			if tt.status != 204 && string(out.Body) != body {
				t.Errorf("body = %q, want %q", out.Body, body)
			}
			if out.RetryAfter < tt.retryAfterMin || out.RetryAfter > tt.retryAfterMax {
				t.Errorf("retry after = %v, want in [%v, %v]", out.RetryAfter, tt.retryAfterMin, tt.retryAfterMax)
			}
			if got := out.DroppedReason; got != tt.header["x-llm-d-request-dropped-reason"] {
				t.Errorf("dropped reason = %q", got)
			}
			if (out.Err == nil) != (tt.class == Success) {
				t.Errorf("err = %v for class %v", out.Err, out.Class)
			}
			if out.Err != nil && !strings.Contains(out.Err.Error(), strconv.Itoa(tt.status)) {
				t.Errorf("err %q does not name the status", out.Err)
			}
		})
	}
}

// closedPort returns a loopback address nobody listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

// hijackClose answers by closing the connection: with linger 0 the peer
// sees a reset, otherwise EOF. partial, if set, is written first.
func hijackClose(reset bool, partial string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			panic(err)
		}
		if partial != "" {
			_, _ = buf.WriteString(partial)
			_ = buf.Flush()
		}
		if reset {
			_ = conn.(*net.TCPConn).SetLinger(0)
		}
		_ = conn.Close()
	}
}

// slowHandler answers only when the client goes away or release is closed.
func slowHandler(release <-chan struct{}) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		// The server notices a client hanging up only once the body is read.
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}
}

func TestNoResponse(t *testing.T) { bothProtocols(t, testNoResponse) }

func testNoResponse(t *testing.T, proto string) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	shutdown := errors.New("shutting down")

	tests := []struct {
		name     string
		handler  http.HandlerFunc // nil: closed port
		cfg      Config
		deadline time.Duration
		ctx      func(ctx context.Context, deadline time.Time) (context.Context, context.CancelFunc)
		class    Class
		is       error
		http1    bool // the handler hijacks the connection, which HTTP/2 cannot
	}{
		{name: "connection refused", class: Retryable, is: nil},
		{name: "connection reset", handler: hijackClose(true, ""), class: Retryable, http1: true},
		{name: "eof", handler: hijackClose(false, ""), class: Retryable, http1: true},
		{name: "truncated body", handler: hijackClose(false, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"partial"), class: Retryable, is: io.ErrUnexpectedEOF, http1: true},
		{name: "truncated headers", handler: hijackClose(false, "HTTP/1.1 200 OK\r\nContent-"), class: Retryable, http1: true},
		{
			name: "slower than the request deadline", handler: slowHandler(release),
			deadline: 200 * time.Millisecond, class: DeadlineExceeded, is: ErrRequestDeadline,
		},
		{
			name: "slower than request timeout", handler: slowHandler(release),
			cfg: Config{RequestTimeout: 200 * time.Millisecond}, class: Retryable, is: ErrRequestTimeout,
		},
		{
			name: "caller deadline before request deadline", handler: slowHandler(release),
			ctx: func(ctx context.Context, _ time.Time) (context.Context, context.CancelFunc) {
				return context.WithTimeout(ctx, 200*time.Millisecond)
			},
			class: Retryable, is: context.DeadlineExceeded,
		},
		{
			name: "caller deadline is the request deadline", handler: slowHandler(release), deadline: 200 * time.Millisecond,
			ctx: func(ctx context.Context, deadline time.Time) (context.Context, context.CancelFunc) {
				return context.WithDeadline(ctx, deadline)
			},
			class: DeadlineExceeded, is: ErrRequestDeadline,
		},
		{
			name: "caller cancelled in flight", handler: slowHandler(release),
			ctx: func(ctx context.Context, _ time.Time) (context.Context, context.CancelFunc) {
				ctx, cancel := context.WithCancelCause(ctx)
				time.AfterFunc(200*time.Millisecond, func() { cancel(shutdown) })
				return ctx, func() { cancel(nil) }
			},
			class: Cancelled, is: shutdown,
		},
	}
	for _, tt := range tests {
		if tt.http1 && proto != ProtocolHTTP1 {
			continue
		}
		t.Run(tt.name, func(t *testing.T) {
			var target Target
			if tt.handler == nil {
				target.BaseURL = "http://" + closedPort(t)
			} else {
				target.BaseURL = newServer(t, tt.handler).URL
			}
			cfg := tt.cfg
			cfg.Protocol = proto
			c := newClient(t, cfg)
			deadline := tt.deadline
			if deadline == 0 {
				deadline = time.Hour
			}
			req := newRequest(deadline)
			ctx := t.Context()
			if tt.ctx != nil {
				var cancel context.CancelFunc
				ctx, cancel = tt.ctx(ctx, req.Deadline)
				defer cancel()
			}
			start := time.Now()
			out := c.Do(ctx, target, req)
			if out.Class != tt.class || out.StatusCode != 0 || out.Body != nil || out.Err == nil {
				t.Fatalf("outcome = %+v (%v), want class %v without a response", out, out.Err, tt.class)
			}
			if tt.is != nil && !errors.Is(out.Err, tt.is) {
				t.Errorf("err = %v, want it to wrap %v", out.Err, tt.is)
			}
			if tt.class == Cancelled && out.Err != shutdown {
				t.Errorf("err = %v, want the cause itself", out.Err)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("took %v", d)
			}
		})
	}
}

func TestNotSent(t *testing.T) { bothProtocols(t, testNotSent) }

func testNotSent(t *testing.T, proto string) {
	var hits atomic.Int32
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) { hits.Add(1) })
	c := newClient(t, Config{Protocol: proto})
	target := Target{BaseURL: srv.URL}

	out := c.Do(t.Context(), target, newRequest(-time.Second))
	if out.Class != DeadlineExceeded || !errors.Is(out.Err, ErrRequestDeadline) {
		t.Errorf("past deadline: %+v", out)
	}
	cause := errors.New("job cancelled")
	ctx, cancel := context.WithCancelCause(t.Context())
	cancel(cause)
	out = c.Do(ctx, target, newRequest(time.Minute))
	if out.Class != Cancelled || out.Err != cause {
		t.Errorf("cancelled ctx: %+v", out)
	}
	ctx, cancel2 := context.WithCancel(t.Context())
	cancel2()
	out = c.Do(ctx, target, newRequest(time.Minute))
	if out.Class != Cancelled || out.Err != context.Canceled {
		t.Errorf("cancelled ctx without cause: %+v", out)
	}
	if out := c.Do(t.Context(), target, nil); out.Class != Fatal {
		t.Errorf("nil request: %+v", out)
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("server got %d requests", n)
	}
}

func TestBodyCap(t *testing.T) { bothProtocols(t, testBodyCap) }

func testBodyCap(t *testing.T, proto string) {
	const limit = 1024
	tests := []struct {
		name    string
		size    int
		chunked bool
		status  int
		class   Class
	}{
		{"at cap, length known", limit, false, 200, Success},
		{"at cap, chunked", limit, true, 200, Success},
		{"over cap, length known", limit + 1, false, 200, Fatal},
		{"over cap, chunked", limit + 1, true, 200, Fatal},
		{"far over cap, chunked", 100 * limit, true, 200, Fatal},
		{"over cap on error status", 4 * limit, false, 503, Fatal},
		{"empty chunked", 0, true, 200, Success},
	}
	c := newClient(t, Config{MaxResponseBytes: limit, Protocol: proto})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := bytes.Repeat([]byte("x"), tt.size)
			srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
				if !tt.chunked {
					w.Header().Set("Content-Length", strconv.Itoa(len(body)))
				}
				w.WriteHeader(tt.status)
				for p := body; len(p) > 0; {
					n := min(len(p), 100)
					_, _ = w.Write(p[:n])
					p = p[n:]
					if tt.chunked {
						http.NewResponseController(w).Flush()
					}
				}
			})
			out := c.Do(t.Context(), Target{BaseURL: srv.URL}, newRequest(time.Minute))
			if out.Class != tt.class || out.StatusCode != tt.status {
				t.Fatalf("outcome = %+v, want %v with status %d", out, tt.class, tt.status)
			}
			// a caller's body reader (core/resume's) is held to the same cap
			own := c.DoWith(t.Context(), Target{BaseURL: srv.URL}, newRequest(time.Minute), Overrides{ReadBody: io.ReadAll})
			if own.Class != tt.class || (tt.class == Fatal && !errors.Is(own.Err, ErrResponseTooLarge)) {
				t.Fatalf("with ReadBody: outcome = %+v, want %v", own, tt.class)
			}
			if tt.class == Fatal {
				if !errors.Is(out.Err, ErrResponseTooLarge) || out.Body != nil {
					t.Errorf("err = %v, body %d bytes", out.Err, len(out.Body))
				}
				return
			}
			if !bytes.Equal(out.Body, body) {
				t.Errorf("body = %d bytes, want %d", len(out.Body), len(body))
			}
		})
	}
}

// TestConnectionReuse checks that bodies are drained and closed: every
// outcome kind that carries a response leaves the connection reusable.
func TestConnectionReuse(t *testing.T) { bothProtocols(t, testConnectionReuse) }

func testConnectionReuse(t *testing.T, proto string) {
	var conns atomic.Int32
	var n atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch n.Add(1) % 4 {
		case 0:
			_, _ = io.WriteString(w, `{"ok":1}`)
		case 1:
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = io.WriteString(w, `{"error":"busy"}`)
		case 2:
			w.WriteHeader(http.StatusBadRequest)
		case 3:
			_, _ = io.WriteString(w, "chunk-1")
			http.NewResponseController(w).Flush()
			_, _ = io.WriteString(w, "chunk-2")
		}
	}))
	srv.Config.Protocols = simulator.ServerProtocols()
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	c := newClient(t, Config{Protocol: proto})
	for i := range 40 {
		if out := c.Do(t.Context(), Target{BaseURL: srv.URL}, newRequest(time.Minute)); out.StatusCode == 0 {
			t.Fatalf("call %d: no response: %v", i, out.Err)
		}
	}
	if got := conns.Load(); got != 1 {
		t.Fatalf("40 sequential calls used %d connections, want 1", got)
	}
}

// TestBodyOwned checks that bodies read through the pooled buffer are copies.
func TestBodyOwned(t *testing.T) { bothProtocols(t, testBodyOwned) }

func testBodyOwned(t *testing.T, proto string) {
	var n atomic.Int32
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = fmt.Fprintf(w, "response-%d", n.Add(1))
		http.NewResponseController(w).Flush() // chunked: length unknown
	})
	c := newClient(t, Config{Protocol: proto})
	var bodies [][]byte
	for range 5 {
		bodies = append(bodies, c.Do(t.Context(), Target{BaseURL: srv.URL}, newRequest(time.Minute)).Body)
	}
	for i, b := range bodies {
		if want := fmt.Sprintf("response-%d", i+1); string(b) != want {
			t.Errorf("body %d = %q, want %q", i, b, want)
		}
	}
}

func TestConcurrent(t *testing.T) { bothProtocols(t, testConcurrent) }

func testConcurrent(t *testing.T, proto string) {
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		_, _ = w.Write(b)
	})
	c := newClient(t, Config{MaxConns: 8, Protocol: proto})
	target := Target{BaseURL: srv.URL}
	errs := make(chan error, 16)
	for g := range 16 {
		go func() {
			for i := range 50 {
				req := newRequest(time.Minute)
				req.Payload = fmt.Appendf(nil, `{"g":%d,"i":%d}`, g, i)
				req.Endpoint = fmt.Sprintf("/v1/e%d", i%3)
				out := c.Do(context.Background(), target, req)
				if out.Class != Success || !bytes.Equal(out.Body, req.Payload) {
					errs <- fmt.Errorf("g%d i%d: %+v", g, i, out)
					return
				}
			}
			errs <- nil
		}()
	}
	for range 16 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		in   string
		want time.Duration
	}{
		{"", 0},
		{"0", 0},
		{"5", 5 * time.Second},
		{" 12 ", 12 * time.Second},
		{"-3", 0},
		{"1.5", 0},
		{"soon", 0},
		{"99999999999999999999", time.Duration(maxRetryAfterSeconds) * time.Second},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second},
		{now.Add(-time.Minute).Format(http.TimeFormat), 0},
		{now.Add(time.Hour).Format(time.RFC850), time.Hour},
	}
	for _, tt := range tests {
		if got := parseRetryAfter(tt.in, now); got != tt.want {
			t.Errorf("parseRetryAfter(%q) = %v, want %v", tt.in, got, tt.want)
		}
	}
}

func TestClassString(t *testing.T) {
	for c, want := range map[Class]string{
		Success: "success", Retryable: "retryable", Fatal: "fatal",
		DeadlineExceeded: "deadline_exceeded", Cancelled: "cancelled", Class(9): "class(9)",
	} {
		if got := c.String(); got != want {
			t.Errorf("%d.String() = %q, want %q", int(c), got, want)
		}
	}
}
