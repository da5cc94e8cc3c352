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

// admitGate rejects ids starting with "no-", defers ids starting with
// "later-" once, and admits the rest; it records every decision.
type admitGate struct {
	mu       sync.Mutex
	deferred map[string]int
	seen     map[string][]int // id → RetryCount at each Admit
}

func (g *admitGate) Budget(context.Context) (float64, error) { return 1, nil }

func (g *admitGate) Admit(_ context.Context, req *wire.Request) (gate.Decision, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.seen[req.ID] = append(g.seen[req.ID], req.RetryCount)
	switch {
	case strings.HasPrefix(req.ID, "no-"):
		return gate.Decision{Verdict: gate.Reject, Reason: "tenant over quota"}, nil
	case strings.HasPrefix(req.ID, "later-") && g.deferred[req.ID] == 0:
		g.deferred[req.ID]++
		return gate.Decision{Verdict: gate.Defer, Delay: 200 * time.Millisecond, Reason: "busy"}, nil
	}
	return gate.Admitted, nil
}

func TestAdmission(t *testing.T) {
	gw, url := newGateway(t)
	ag := &admitGate{deferred: map[string]int{}, seen: map[string][]int{}}
	ad := testAdapters(t)
	if err := ad.Gates.Register("test-admit", func(gate.Params, gate.Env) (gate.Gate, error) { return ag, nil }); err != nil {
		t.Fatal(err)
	}
	cfg := &config.Config{
		Transport: memory.Name, Concurrency: 4, MetricsPort: -1, HealthPort: -1,
		DrainTimeout: config.Duration(time.Second),
		TransportConfig: config.TransportConfig{ResultQueueName: e2eResults,
			Queues: []config.Queue{{Queue: transport.Queue{Name: e2eQueue}, IGWBaseURL: url, GateType: "test-admit"}}},
	}
	h := startAppWith(t, cfg, Options{Adapters: ad, Transport: memory.New(memory.Options{})})
	far := time.Now().Add(time.Minute)
	for _, id := range []string{"ok-1", "no-1", "later-1"} {
		if err := h.mem.Enqueue(e2eQueue, request(id, far, nil)); err != nil {
			t.Fatal(err)
		}
	}
	// A deferral past the deadline ends the request instead of parking it.
	if err := h.mem.Enqueue(e2eQueue, request("later-2", time.Now().Add(100*time.Millisecond), nil)); err != nil {
		t.Fatal(err)
	}
	res := h.waitResults(4, 10*time.Second)
	if r := res["ok-1"]; r.ErrorCode != wire.CodeNone {
		t.Errorf("ok-1: %+v", r)
	}
	if r := res["no-1"]; r.ErrorCode != wire.CodeGateDropped || !strings.Contains(r.ErrorMessage, "tenant over quota") {
		t.Errorf("no-1: %+v", r)
	}
	if n := len(gw.attempts("no-1")); n != 0 {
		t.Errorf("rejected request dispatched %d times", n)
	}
	if r := res["later-1"]; r.ErrorCode != wire.CodeNone {
		t.Errorf("later-1: %+v", r)
	}
	if r := res["later-2"]; r.ErrorCode != wire.CodeDeadlineExceeded {
		t.Errorf("later-2: %+v", r)
	}
	ag.mu.Lock()
	defer ag.mu.Unlock()
	if got := ag.seen["later-1"]; len(got) != 2 || got[0] != 0 || got[1] != 0 {
		t.Errorf("later-1 admitted with retry counts %v, want [0 0] (a deferral is not an attempt)", got)
	}
}
