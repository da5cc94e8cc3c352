package main

import (
	"context"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// idHeader is the request header the harness puts in every message it
// sends (through the message's `headers`), so the gateway knows which
// request each call is.
const idHeader = "X-Chaos-Id"

// gatewayFaults say how the recording gateway misbehaves. Rates are
// fractions of calls, drawn independently per call; they sum to at most 1.
type gatewayFaults struct {
	latencyMin, latencyMax time.Duration // each call waits a uniform draw in [min,max]
	rate429                float64       // 429 with Retry-After
	retryAfter             int           // seconds, for the 429s
	rate5xx                float64       // 503
	rateReset              float64       // TCP reset, no response
	rateStall              float64       // 200, half a body, then nothing until the client gives up
}

// alwaysOK reports whether every call is answered with a 200 (a latency
// at most): a fault run against such a gateway allows no other result.
func (f gatewayFaults) alwaysOK() bool {
	return f.rate429 == 0 && f.rate5xx == 0 && f.rateReset == 0 && f.rateStall == 0
}

// attempt is one call the gateway received.
type attempt struct {
	start, end time.Time
	outcome    string // ok, 429, 503, reset, stall
}

// gateway is an HTTP gateway that answers completions and records every
// call it receives per request id, with timestamps.
type gateway struct {
	f   gatewayFaults
	srv *http.Server
	URL string

	mu       sync.Mutex
	rng      *rand.Rand
	attempts map[string][]attempt
	inflight map[string]int
	calls    int
	onCall   func(id string, start, end time.Time) // each finished call (nil: none)
}

func startGateway(f gatewayFaults) (*gateway, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	g := &gateway{f: f, rng: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7)),
		attempts: map[string][]attempt{}, inflight: map[string]int{}, URL: "http://" + ln.Addr().String()}
	g.srv = &http.Server{Handler: g, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = g.srv.Serve(ln) }()
	return g, nil
}

func (g *gateway) close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = g.srv.Shutdown(ctx)
	_ = g.srv.Close()
}

// draw picks a call's outcome and latency.
func (g *gateway) draw() (string, time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.calls++
	lat := g.f.latencyMin
	if g.f.latencyMax > g.f.latencyMin {
		lat += time.Duration(g.rng.Int64N(int64(g.f.latencyMax - g.f.latencyMin)))
	}
	x := g.rng.Float64()
	for _, c := range []struct {
		rate float64
		name string
	}{{g.f.rate429, "429"}, {g.f.rate5xx, "503"}, {g.f.rateReset, "reset"}, {g.f.rateStall, "stall"}} {
		if x < c.rate {
			return c.name, lat
		}
		x -= c.rate
	}
	return "ok", lat
}

func (g *gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == "PRI" {
		// The h2c preface of sluice's dispatch.protocol auto detection
		// (net/http hands it to an HTTP/1.1 handler as PRI *): not a call.
		return
	}
	id := r.Header.Get(idHeader)
	start := time.Now()
	_, _ = io.Copy(io.Discard, r.Body)
	outcome, lat := g.draw()
	g.mu.Lock()
	g.inflight[id]++
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		if g.inflight[id]--; g.inflight[id] <= 0 {
			delete(g.inflight, id)
		}
		end := time.Now()
		g.attempts[id] = append(g.attempts[id], attempt{start: start, end: end, outcome: outcome})
		onCall := g.onCall
		g.mu.Unlock()
		if onCall != nil {
			onCall(id, start, end)
		}
	}()
	if lat > 0 {
		t := time.NewTimer(lat)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			outcome += "-aborted"
			return
		}
	}
	switch outcome {
	case "429":
		w.Header().Set("Retry-After", strconv.Itoa(g.f.retryAfter))
		http.Error(w, `{"error":"slow down"}`, http.StatusTooManyRequests)
	case "503":
		http.Error(w, `{"error":"unavailable"}`, http.StatusServiceUnavailable)
	case "reset":
		hj, ok := w.(http.Hijacker)
		if !ok {
			panic(http.ErrAbortHandler)
		}
		c, _, err := hj.Hijack()
		if err != nil {
			return
		}
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		_ = c.Close()
	case "stall":
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", "200")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, `{"id":"cmpl-stall","object":"text_completion","choices":[{"text":"`)
		if fl, ok := w.(http.Flusher); ok {
			fl.Flush()
		}
		t := time.NewTimer(2 * time.Minute)
		defer t.Stop()
		select {
		case <-t.C:
		case <-r.Context().Done():
		}
	default:
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"4","finish_reason":"stop"}]}`)
	}
}

// observe makes f see every call that finishes from now on.
func (g *gateway) observe(f func(id string, start, end time.Time)) {
	g.mu.Lock()
	g.onCall = f
	g.mu.Unlock()
}

// inflightIDs returns the ids with a call in progress now.
func (g *gateway) inflightIDs() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	ids := make([]string, 0, len(g.inflight))
	for id := range g.inflight {
		ids = append(ids, id)
	}
	return ids
}

// snapshot returns every call the gateway has finished, per request id.
func (g *gateway) snapshot() map[string][]attempt {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make(map[string][]attempt, len(g.attempts))
	for id, a := range g.attempts {
		out[id] = append([]attempt(nil), a...)
	}
	return out
}

// totalCalls is how many calls the gateway has received.
func (g *gateway) totalCalls() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.calls
}
