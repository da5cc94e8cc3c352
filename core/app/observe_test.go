package app

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/transports/memory"
)

// observeGate admits every request with an Observe and a Release and
// records, per request id, the order in which they were called and the
// status each Observe saw. Requests whose id starts with "defer-" are
// admitted by it and then deferred by a second gate (a composite), so
// they are never dispatched.
type observeGate struct {
	mu    sync.Mutex
	calls map[string][]string // id → "observe:<status>" and "release", in order
	fbs   map[string][]gate.Feedback
}

func (g *observeGate) Budget(context.Context) (float64, error) { return 1, nil }

func (g *observeGate) Admit(_ context.Context, req *wire.Request) (gate.Decision, error) {
	id := req.ID
	return gate.Decision{
		Verdict: gate.Admit,
		Observe: func(fb gate.Feedback) {
			g.mu.Lock()
			defer g.mu.Unlock()
			g.calls[id] = append(g.calls[id], "observe")
			g.fbs[id] = append(g.fbs[id], fb)
		},
		Release: func() {
			g.mu.Lock()
			defer g.mu.Unlock()
			g.calls[id] = append(g.calls[id], "release")
		},
	}, nil
}

// deferGate defers ids starting with "defer-" once.
type deferGate struct {
	mu   sync.Mutex
	seen map[string]bool
}

func (g *deferGate) Budget(context.Context) (float64, error) { return 1, nil }

func (g *deferGate) Admit(_ context.Context, req *wire.Request) (gate.Decision, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if strings.HasPrefix(req.ID, "defer-") && !g.seen[req.ID] {
		g.seen[req.ID] = true
		return gate.Decision{Verdict: gate.Defer, Delay: 50 * time.Millisecond, Reason: "later"}, nil
	}
	return gate.Admitted, nil
}

// TestGateObservesAnswers checks the feedback hook end to end: every
// dispatched request's answer reaches the admitting gate's Observe once,
// before its Release, with the status and headers the gateway sent; a
// request a later gate deferred is released without being observed; a
// chain (gate.Chain, as a composite runs) passes the Observe on.
func TestGateObservesAnswers(t *testing.T) {
	_, url := newGateway(t)
	og := &observeGate{calls: map[string][]string{}, fbs: map[string][]gate.Feedback{}}
	dg := &deferGate{seen: map[string]bool{}}
	chained := chainGate{og, dg}
	ad := testAdapters(t)
	if err := ad.Gates.Register("test-observe", func(gate.Params, gate.Env) (gate.Gate, error) { return chained, nil }); err != nil {
		t.Fatal(err)
	}
	cfg := &config.Config{
		Transport: memory.Name, Concurrency: 4, MetricsPort: -1, HealthPort: -1,
		DrainTimeout: config.Duration(time.Second),
		Retry:        config.Retry{Base: config.Duration(50 * time.Millisecond), Max: config.Duration(100 * time.Millisecond)},
		TransportConfig: config.TransportConfig{ResultQueueName: e2eResults,
			Queues: []config.Queue{{Queue: transport.Queue{Name: e2eQueue}, IGWBaseURL: url, GateType: "test-observe"}}},
	}
	h := startAppWith(t, cfg, Options{Adapters: ad, Transport: memory.New(memory.Options{})})
	far := time.Now().Add(time.Minute)
	for id, script := range map[string]map[string]any{
		"ok":      nil,
		"shed":    {"fail_times": 1, "fail_status": 429},
		"bad":     {"status": 400},
		"defer-1": nil,
	} {
		if err := h.mem.Enqueue(e2eQueue, request(id, far, script)); err != nil {
			t.Fatal(err)
		}
	}
	h.waitResults(4, 10*time.Second)
	if err := h.shutdown(); err != nil {
		t.Fatal(err)
	}
	og.mu.Lock()
	defer og.mu.Unlock()
	want := map[string]struct {
		calls    []string
		statuses []int
	}{
		"ok":   {[]string{"observe", "release"}, []int{200}},
		"shed": {[]string{"observe", "release", "observe", "release"}, []int{429, 200}},
		"bad":  {[]string{"observe", "release"}, []int{400}},
		// Admitted by observeGate, deferred by deferGate: released, not
		// observed; then admitted again and dispatched.
		"defer-1": {[]string{"release", "observe", "release"}, []int{200}},
	}
	for id, w := range want {
		if got := og.calls[id]; strings.Join(got, ",") != strings.Join(w.calls, ",") {
			t.Errorf("%s: calls %v, want %v", id, got, w.calls)
		}
		fbs := og.fbs[id]
		if len(fbs) != len(w.statuses) {
			t.Errorf("%s: %d observations, want %d", id, len(fbs), len(w.statuses))
			continue
		}
		for i, fb := range fbs {
			if fb.StatusCode != w.statuses[i] {
				t.Errorf("%s: observation %d status %d, want %d", id, i, fb.StatusCode, w.statuses[i])
			}
			if fb.Sent.IsZero() || fb.Header == nil {
				t.Errorf("%s: observation %d has no send time or headers: %+v", id, i, fb)
			}
			if (fb.StatusCode == 200) != (fb.Err == nil) {
				t.Errorf("%s: observation %d: status %d with err %v", id, i, fb.StatusCode, fb.Err)
			}
		}
	}
}

// chainGate runs its members under gate.Chain, as a composite does.
type chainGate []gate.Admitter

func (c chainGate) Budget(context.Context) (float64, error) { return 1, nil }

func (c chainGate) Admit(ctx context.Context, req *wire.Request) (gate.Decision, error) {
	return gate.Chain(ctx, req, c...)
}
