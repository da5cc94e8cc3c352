// Package submittest is the conformance suite every transport's producer
// (submit.Producer) passes: requests enqueued through the Producer are
// answered by a real sluice dispatcher (the one the harness hands over, on
// the producer's transport, before an HTTP gateway of the suite's)
// onto the route each request names; a reader's lease lapses and the
// result is handed out again; Ack removes it; Cancel removes (or answers
// CANCELLED) what is still queued and aborts what is in flight.
package submittest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/submit"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
)

// Features say what an adapter's transport does beyond the contract.
type Features struct {
	// RemovesQueued: Cancel removes waiting requests, which then get no
	// result at all; otherwise they are answered CANCELLED without being
	// dispatched.
	RemovesQueued bool
	// CountsCancelled: Cancel returns how many waiting requests it
	// removed or answered (otherwise -1 is allowed).
	CountsCancelled bool
}

// Harness builds what the suite runs against.
type Harness struct {
	Features Features
	// TransportName is the transport's name in the dispatcher's config
	// (its metrics label).
	TransportName string
	// New returns a fresh dispatcher transport and a producer over the
	// same broker whose readers lease results for lease. The suite closes
	// the producer; the dispatcher closes the transport when it runs (the
	// suite closes it otherwise).
	New func(t testing.TB, lease time.Duration) (transport.Transport, submit.Producer)
	// Dispatch runs a sluice dispatcher of cfg on tr until the test ends
	// (core/app, with the constant gate the suite's queue names), failing
	// t if it cannot start or ends with an error. The suite builds cfg:
	// one queue before a gateway of its own.
	Dispatch func(t testing.TB, cfg *config.Config, tr transport.Transport)
}

// Run runs the suite.
func Run(t *testing.T, h Harness) {
	t.Run("RoundTripPerRoute", func(t *testing.T) { roundTrip(t, h) })
	t.Run("LeaseLapseAndAck", func(t *testing.T) { leaseLapse(t, h) })
	t.Run("CancelQueued", func(t *testing.T) { cancelQueued(t, h) })
	t.Run("CancelInFlight", func(t *testing.T) { cancelInFlight(t, h) })
}

const (
	queueName = "submittest-requests"
	wait      = 30 * time.Second
)

// gateway answers {"echo":<body>} and records the "id" of every body it
// got; a body with "block":true is held until its call is aborted.
type gateway struct {
	srv     *httptest.Server
	mu      sync.Mutex
	seen    map[string]int
	arrived chan string
	stop    chan struct{} // closed at the end: held calls return
}

func newGateway(t testing.TB) *gateway {
	g := &gateway{seen: map[string]int{}, arrived: make(chan string, 1024), stop: make(chan struct{})}
	g.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var p struct {
			ID    string `json:"id"`
			Block bool   `json:"block"`
		}
		if json.Unmarshal(body, &p) != nil || p.ID == "" {
			w.WriteHeader(http.StatusOK) // a probe, not a request of the suite
			return
		}
		g.mu.Lock()
		g.seen[p.ID]++
		g.mu.Unlock()
		select {
		case g.arrived <- p.ID:
		default:
		}
		if p.Block {
			select {
			case <-r.Context().Done():
				return
			case <-g.stop:
			}
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"echo":%s}`, body)
	}))
	t.Cleanup(g.srv.Close)
	return g
}

func (g *gateway) count(id string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.seen[id]
}

// runSluice runs h's dispatcher on tr with one queue (queueName) whose
// results go where each request says, until the test ends.
func runSluice(t testing.TB, h Harness, tr transport.Transport, gw *gateway, concurrency int) {
	t.Helper()
	h.Dispatch(t, &config.Config{
		Transport: h.TransportName, Concurrency: concurrency, MetricsPort: -1, HealthPort: -1,
		TransportConfig: config.TransportConfig{ResultQueueName: "submittest-default-results",
			Queues: []config.Queue{{Queue: transport.Queue{Name: queueName}, IGWBaseURL: gw.srv.URL, GateType: "constant"}}},
	}, tr)
}

var seq atomic.Int64

// requests returns n requests of job on route, each with its id in its payload.
func requests(n int, job, route string, block bool) []*wire.Request {
	s := seq.Add(1)
	out := make([]*wire.Request, n)
	for i := range out {
		id := fmt.Sprintf("%s-%d-%d", job, s, i)
		out[i] = &wire.Request{
			ID: id, Deadline: time.Now().Add(time.Minute), ResultQueueName: route,
			Payload:  fmt.Appendf(nil, `{"id":%q,"block":%t}`, id, block),
			Metadata: map[string]string{"job_id": job},
		}
	}
	return out
}

// collect reads route until n results came (acking each), or fails.
func collect(t testing.TB, p submit.Producer, route string, n int) map[string]*wire.Result {
	t.Helper()
	r, err := p.Results(context.Background(), route)
	if err != nil {
		t.Fatalf("results %s: %v", route, err)
	}
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	got := map[string]*wire.Result{}
	for len(got) < n {
		rs, err := r.Next(ctx)
		if err != nil {
			t.Fatalf("route %s: %d of %d results, then: %v", route, len(got), n, err)
		}
		for _, res := range rs {
			if res.Err != nil || res.Result == nil {
				t.Fatalf("route %s: undecodable result %s: %v", route, res.Raw, res.Err)
			}
			if res.ID != res.Result.ID {
				t.Errorf("Result.ID %q, the result's id %q", res.ID, res.Result.ID)
			}
			if _, dup := got[res.ID]; dup {
				t.Errorf("route %s: result %s twice", route, res.ID)
			}
			got[res.ID] = res.Result
		}
		if err := r.Ack(ctx, rs...); err != nil {
			t.Fatalf("ack: %v", err)
		}
	}
	return got
}

// empty checks that route hands out nothing within d.
func empty(t testing.TB, p submit.Producer, route string, d time.Duration) {
	t.Helper()
	r, err := p.Results(context.Background(), route)
	if err != nil {
		t.Fatalf("results %s: %v", route, err)
	}
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	rs, err := r.Next(ctx)
	if len(rs) > 0 {
		t.Errorf("route %s: %d more result(s), want none (first %s)", route, len(rs), rs[0].Raw)
	}
	if err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Next on an empty route = %v, want the context's deadline", err)
	}
}

func roundTrip(t *testing.T, h Harness) {
	tr, p := h.New(t, time.Minute)
	defer p.Close()
	gw := newGateway(t)
	runSluice(t, h, tr, gw, 8)
	routeA, routeB := fmt.Sprint("route-a-", seq.Add(1)), fmt.Sprint("route-b-", seq.Add(1))
	a, b := requests(30, "job-a", routeA, false), requests(20, "job-b", routeB, false)
	ctx := context.Background()
	if err := p.Enqueue(ctx, queueName, a[:10]); err != nil {
		t.Fatal(err)
	}
	if err := p.Enqueue(ctx, queueName, b); err != nil {
		t.Fatal(err)
	}
	if err := p.Enqueue(ctx, queueName, a[10:]); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		route string
		reqs  []*wire.Request
	}{{routeA, a}, {routeB, b}} {
		got := collect(t, p, c.route, len(c.reqs))
		for _, r := range c.reqs {
			res, ok := got[r.ID]
			if !ok {
				t.Errorf("route %s: no result for %s", c.route, r.ID)
				continue
			}
			if res.StatusCode != 200 || res.Payload != fmt.Sprintf(`{"echo":%s}`, r.Payload) || res.Metadata["job_id"] != r.JobID() {
				t.Errorf("result %s = %+v, want the gateway's echo with the request's metadata", r.ID, res)
			}
		}
		if len(got) != len(c.reqs) {
			t.Errorf("route %s: %d results, want %d (only its own)", c.route, len(got), len(c.reqs))
		}
	}
	empty(t, p, routeA, 300*time.Millisecond)
}

func leaseLapse(t *testing.T, h Harness) {
	const lease = 400 * time.Millisecond
	tr, p := h.New(t, lease)
	defer p.Close()
	gw := newGateway(t)
	runSluice(t, h, tr, gw, 4)
	route := fmt.Sprint("route-lease-", seq.Add(1))
	reqs := requests(3, "job-l", route, false)
	want := map[string]bool{}
	for _, r := range reqs {
		want[r.ID] = true
	}
	if err := p.Enqueue(context.Background(), queueName, reqs); err != nil {
		t.Fatal(err)
	}
	first, err := p.Results(context.Background(), route)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	seen := map[string]bool{}
	for len(seen) < 3 {
		rs, err := first.Next(ctx)
		if err != nil {
			t.Fatalf("first lease: %d of 3, then %v", len(seen), err)
		}
		for _, r := range rs {
			if !want[r.ID] || seen[r.ID] {
				t.Fatalf("first lease: unexpected or repeated %q", r.ID)
			}
			seen[r.ID] = true
		}
	}
	// Not acked, the reader gone: a second reader gets them again once the lease lapsed.
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	second := collect(t, p, route, 3)
	for id := range want {
		if second[id] == nil {
			t.Errorf("%s was not handed out again after its lease", id)
		}
	}
	if d := time.Since(start); d < lease/2 {
		t.Errorf("handed out again after %s, before its lease (%s) lapsed", d, lease)
	}
	// Acked (collect acks): gone for good, also after another lease.
	empty(t, p, route, 2*lease+200*time.Millisecond)
}

func cancelQueued(t *testing.T, h Harness) {
	tr, p := h.New(t, time.Minute)
	defer p.Close()
	route := fmt.Sprint("route-cancel-", seq.Add(1))
	cancelled, kept := requests(10, fmt.Sprint("job-c-", seq.Add(1)), route, false), requests(1, "job-k", route, false)
	ctx := context.Background()
	if err := p.Enqueue(ctx, queueName, cancelled); err != nil {
		t.Fatal(err)
	}
	if err := p.Enqueue(ctx, queueName, kept); err != nil {
		t.Fatal(err)
	}
	n, err := p.Cancel(ctx, queueName, transport.Cancellation{JobID: cancelled[0].JobID()})
	if err != nil {
		t.Fatal(err)
	}
	if h.Features.CountsCancelled && n != len(cancelled) {
		t.Errorf("Cancel = %d, want %d", n, len(cancelled))
	}
	if !h.Features.CountsCancelled && n != -1 && n != len(cancelled) {
		t.Errorf("Cancel = %d, want %d or -1", n, len(cancelled))
	}
	gw := newGateway(t)
	// One worker: the cancelled requests, queued first, would be
	// dispatched before the kept one if they were still there.
	runSluice(t, h, tr, gw, 1)
	want := 1
	if !h.Features.RemovesQueued {
		want += len(cancelled)
	}
	got := collect(t, p, route, want)
	if got[kept[0].ID] == nil || !got[kept[0].ID].OK() {
		t.Errorf("the request not cancelled: %+v, want answered", got[kept[0].ID])
	}
	for _, r := range cancelled {
		if c := gw.count(r.ID); c != 0 {
			t.Errorf("cancelled %s was dispatched %d time(s)", r.ID, c)
		}
		if res := got[r.ID]; !h.Features.RemovesQueued && (res == nil || res.ErrorCode != wire.CodeCancelled) {
			t.Errorf("cancelled %s: result %+v, want CANCELLED", r.ID, res)
		}
	}
	empty(t, p, route, 300*time.Millisecond)
}

func cancelInFlight(t *testing.T, h Harness) {
	tr, p := h.New(t, time.Minute)
	defer p.Close()
	gw := newGateway(t)
	runSluice(t, h, tr, gw, 4)
	t.Cleanup(func() { close(gw.stop) }) // runs before the dispatcher's drain
	route := fmt.Sprint("route-inflight-", seq.Add(1))
	reqs := requests(1, fmt.Sprint("job-f-", seq.Add(1)), route, true)
	ctx := context.Background()
	if err := p.Enqueue(ctx, queueName, reqs); err != nil {
		t.Fatal(err)
	}
	select {
	case id := <-gw.arrived:
		if id != reqs[0].ID {
			t.Fatalf("gateway got %q, want %q", id, reqs[0].ID)
		}
	case <-time.After(wait):
		t.Fatal("the request never reached the gateway")
	}
	// The dispatcher may register the call a moment after it started:
	// cancel again until the result is there.
	r, err := p.Results(ctx, route)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	deadline := time.Now().Add(wait)
	for {
		if _, err := p.Cancel(ctx, queueName, transport.Cancellation{JobID: reqs[0].JobID()}); err != nil {
			t.Fatal(err)
		}
		nctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		rs, err := r.Next(nctx)
		cancel()
		if len(rs) > 0 {
			if len(rs) != 1 || rs[0].ID != reqs[0].ID || rs[0].Result.ErrorCode != wire.CodeCancelled {
				t.Fatalf("results %+v, want one CANCELLED for %s", rs, reqs[0].ID)
			}
			if err := r.Ack(ctx, rs...); err != nil {
				t.Fatal(err)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no result for the cancelled in-flight request: %v", err)
		}
	}
}
