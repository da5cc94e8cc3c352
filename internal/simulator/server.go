// Package simulator is a fake OpenAI-compatible inference gateway for demos,
// end-to-end tests and benchmarks of sluice.
//
// It answers POST /v1/completions and POST /v1/chat/completions after a
// sampled latency with a canned completion, a 429, a server error or a reset
// connection, at configured rates; a request can force its own outcome with the
// X-Sim-* headers. GET /metrics serves vLLM-style load gauges computed from the
// requests really in flight, and GET /healthz answers 200.
//
// The request path takes no lock and starts no goroutine: counters are atomics,
// randomness is a per-request splitmix64 stream, buffers come from a sync.Pool.
package simulator

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Paths served by the simulator.
const (
	PathCompletions     = "/v1/completions"
	PathChatCompletions = "/v1/chat/completions"
	PathMetrics         = "/metrics"
	PathHealthz         = "/healthz"
)

// Request headers read by the simulator, in canonical form.
const (
	// HeaderStatus forces the outcome of one request: a status (200, or
	// 400-599; 429 carries Retry-After) or "reset" to reset the connection.
	HeaderStatus = "X-Sim-Status"
	// HeaderLatencyMS overrides the sampled latency of one request, in
	// milliseconds (a non-negative number, fractions allowed).
	HeaderLatencyMS = "X-Sim-Latency-Ms"
	// HeaderRetryAfter overrides the Retry-After seconds of a 429 answer
	// (a non-negative integer).
	HeaderRetryAfter = "X-Sim-Retry-After"
	// HeaderDeadline is the request's deadline in Unix milliseconds, as sluice
	// sends it. The simulator only counts it (Stats.WithDeadline,
	// Stats.PastDeadline): it never cuts a request short.
	HeaderDeadline = "X-Request-Deadline"
)

// Indexes of Server.byPath.
const (
	routeCompletions = iota
	routeChat
	routeMetrics
	routeHealthz
	routeOther
	numRoutes
)

var routeNames = [numRoutes]string{PathCompletions, PathChatCompletions, PathMetrics, PathHealthz, "other"}

// MaxConcurrentStreams is how many HTTP/2 requests one connection may carry
// at once: Go's default, which spreads thousands of requests in flight over
// several connections (and so over several read loops on each side).
const MaxConcurrentStreams = 250

// ServerProtocols are the protocols the simulator accepts on its plain
// listener: HTTP/1.1 and HTTP/2 with prior knowledge (h2c).
func ServerProtocols() *http.Protocols {
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	return &p
}

// Stats is a snapshot of what a Server has seen. Request, outcome and
// deadline counts cover the completion routes only.
type Stats struct {
	// Requests is the number of POSTs to the completion routes.
	Requests uint64
	// OK is the number answered 200.
	OK uint64
	// Status429 is the number answered 429.
	Status429 uint64
	// Status5xx is the number answered with a 5xx status.
	Status5xx uint64
	// Status4xx is the number answered with a 4xx status other than 429
	// (invalid bodies, bad X-Sim-* headers, forced 4xx).
	Status4xx uint64
	// Resets is the number whose connection was reset without a response.
	Resets uint64
	// Aborted is the number whose client went away (or whose server was
	// closed) before the answer was due; they got no answer.
	Aborted uint64
	// WithDeadline is the number that carried an X-Request-Deadline header.
	WithDeadline uint64
	// PastDeadline is the number answered after the deadline in their
	// X-Request-Deadline header.
	PastDeadline uint64
	// ByStatus counts answers by HTTP status.
	ByStatus map[int]uint64
	// ByPath counts every request by path, whatever its method; unknown paths
	// count under "other".
	ByPath map[string]uint64
	// Inflight is the number of completion requests in progress now.
	Inflight int64
	// MaxInflight is the highest Inflight seen.
	MaxInflight int64
}

// Server is a simulated inference gateway. Its handler may be served by
// Start or mounted in any http.Server (e.g. httptest).
type Server struct {
	cfg        Config
	seed       uint64
	retryAfter []string // Retry-After value of a 429; never modified
	ctJSON     []string // Content-Type values; never modified
	ctText     []string
	metrics    http.Handler // promhttp over a registry of this Server's own

	requests     atomic.Uint64 // also numbers the responses
	inflight     atomic.Int64
	maxInflight  atomic.Int64
	resets       atomic.Uint64
	aborted      atomic.Uint64
	withDeadline atomic.Uint64
	pastDeadline atomic.Uint64
	byStatus     [600]atomic.Uint64
	byPath       [numRoutes]atomic.Uint64

	bufs sync.Pool // *scratch

	mu        sync.Mutex // guards the lifecycle fields below; never taken per request
	srv       *http.Server
	cancel    context.CancelFunc // aborts the requests of srv
	serveDone chan struct{}
	serveErr  error
	started   bool
}

// New validates cfg, applies its defaults and returns a Server.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	seed := uint64(cfg.Seed)
	if seed == 0 {
		seed = rand.Uint64()
	}
	retry := (cfg.RetryAfter + time.Second - 1) / time.Second
	s := &Server{
		cfg:        cfg,
		seed:       seed,
		retryAfter: []string{strconv.FormatInt(int64(retry), 10)},
		ctJSON:     []string{"application/json"},
		ctText:     []string{"text/plain; charset=utf-8"},
		bufs:       sync.Pool{New: func() any { return new(scratch) }},
	}
	m, err := newMetricsHandler(s)
	if err != nil {
		return nil, fmt.Errorf("simulator: metrics registry: %w", err)
	}
	s.metrics = m
	return s, nil
}

// Config returns the server's configuration with its defaults applied.
func (s *Server) Config() Config { return s.cfg }

// Handler returns the handler serving the simulator's routes.
func (s *Server) Handler() http.Handler { return http.HandlerFunc(s.serveHTTP) }

// Start listens on addr (e.g. "127.0.0.1:0"), serves the handler in the
// background and returns the base URL, e.g. "http://127.0.0.1:41234".
// A Server starts at most once.
func (s *Server) Start(addr string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started {
		return "", errors.New("simulator: start: already started")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("simulator: listen on %s: %w", addr, err)
	}
	base, cancel := context.WithCancel(context.Background())
	s.srv = &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		BaseContext:       func(net.Listener) context.Context { return base },
		Protocols:         ServerProtocols(),
		HTTP2:             &http.HTTP2Config{MaxConcurrentStreams: MaxConcurrentStreams},
	}
	s.cancel = cancel
	s.serveDone = make(chan struct{})
	s.started = true
	go func(srv *http.Server, done chan<- struct{}) {
		defer close(done)
		if err := srv.Serve(BufferReads(ln)); !errors.Is(err, http.ErrServerClosed) {
			s.mu.Lock()
			s.serveErr = fmt.Errorf("simulator: serve: %w", err)
			s.mu.Unlock()
		}
	}(s.srv, s.serveDone)
	return "http://" + ln.Addr().String(), nil
}

// Close stops the server started by Start: it stops listening, lets requests
// in flight finish for up to Config.ShutdownTimeout, then aborts the rest and
// waits for their handlers to return. It is safe to call more than once; a
// Server that was never started has nothing to close.
func (s *Server) Close() error {
	s.mu.Lock()
	srv, cancel, done := s.srv, s.cancel, s.serveDone
	s.srv = nil
	s.mu.Unlock()
	if srv == nil {
		return nil
	}
	defer cancel()

	ctx, stop := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
	defer stop()
	var errs []error
	if err := srv.Shutdown(ctx); err != nil {
		// Time is up: abort the requests still waiting and drop their conns.
		cancel()
		if err := srv.Close(); err != nil {
			errs = append(errs, fmt.Errorf("simulator: close: %w", err))
		}
	}
	<-done
	// Shutdown does not wait for hijacked connections nor Close for handlers:
	// wait for the last handler to return, briefly (they were all aborted).
	cancel()
	for wait := time.Now().Add(time.Second); s.inflight.Load() > 0 && time.Now().Before(wait); {
		time.Sleep(time.Millisecond)
	}
	s.mu.Lock()
	if s.serveErr != nil {
		errs = append(errs, s.serveErr)
	}
	s.mu.Unlock()
	return errors.Join(errs...)
}

// Stats returns a snapshot of the server's counters.
func (s *Server) Stats() Stats {
	st := Stats{
		Requests:     s.requests.Load(),
		Resets:       s.resets.Load(),
		Aborted:      s.aborted.Load(),
		WithDeadline: s.withDeadline.Load(),
		PastDeadline: s.pastDeadline.Load(),
		ByStatus:     make(map[int]uint64),
		ByPath:       make(map[string]uint64, numRoutes),
		Inflight:     s.inflight.Load(),
		MaxInflight:  s.maxInflight.Load(),
	}
	for code := range s.byStatus {
		n := s.byStatus[code].Load()
		if n == 0 {
			continue
		}
		st.ByStatus[code] = n
		switch {
		case code == http.StatusOK:
			st.OK += n
		case code == http.StatusTooManyRequests:
			st.Status429 += n
		case code >= 500:
			st.Status5xx += n
		case code >= 400:
			st.Status4xx += n
		}
	}
	for i := range s.byPath {
		if n := s.byPath[i].Load(); n > 0 {
			st.ByPath[routeNames[i]] = n
		}
	}
	return st
}

func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case PathCompletions:
		s.byPath[routeCompletions].Add(1)
		if s.allow(w, r, http.MethodPost) {
			s.completion(w, r, false)
		}
	case PathChatCompletions:
		s.byPath[routeChat].Add(1)
		if s.allow(w, r, http.MethodPost) {
			s.completion(w, r, true)
		}
	case PathMetrics:
		s.byPath[routeMetrics].Add(1)
		if s.allow(w, r, http.MethodGet) {
			s.metrics.ServeHTTP(w, r)
		}
	case PathHealthz:
		s.byPath[routeHealthz].Add(1)
		if s.allow(w, r, http.MethodGet) {
			w.Header()["Content-Type"] = s.ctText
			_, _ = w.Write([]byte("ok\n"))
		}
	default:
		s.byPath[routeOther].Add(1)
		s.writeError(w, http.StatusNotFound, "invalid_request_error", "unknown_url", "no route for "+r.URL.Path)
	}
}

// allow reports whether r uses method (GET also allows HEAD), and answers 405
// when it does not.
func (s *Server) allow(w http.ResponseWriter, r *http.Request, method string) bool {
	if r.Method == method || (method == http.MethodGet && r.Method == http.MethodHead) {
		return true
	}
	allowed := method
	if method == http.MethodGet {
		allowed = "GET, HEAD"
	}
	w.Header().Set("Allow", allowed)
	s.writeError(w, http.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed",
		r.Method+" is not allowed on "+r.URL.Path+"; use "+method)
	return false
}

// noteInflight raises maxInflight to cur if cur is higher.
func (s *Server) noteInflight(cur int64) {
	for {
		seen := s.maxInflight.Load()
		if cur <= seen || s.maxInflight.CompareAndSwap(seen, cur) {
			return
		}
	}
}
