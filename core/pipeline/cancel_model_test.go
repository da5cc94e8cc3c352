package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"pgregory.net/rapid"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/metrics"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
)

// cancelModel is the executable model of cancellation tokens: a request
// is claimed (the claim-time check runs), waits in admission until its gate
// lets it through, and is dispatched or ended. A cancel takes effect when
// it is recorded (the transport's check answers true from then on). The
// invariants, checked after every step:
//
//   - no dispatch after a cancel took effect: a request cancelled before
//     its gate let it through is never dispatched, and ends CANCELLED;
//   - a request never cancelled is dispatched exactly once and ends with
//     the gateway's answer;
//   - every request ends in exactly one outcome.
type cancelModel struct {
	cancelledAt map[string]int // request → step its cancel took effect
	openedAt    map[string]int // request → step its gate let it through
	step        int
}

// cancelChecker is the transport's cancellation check: a set of ids.
type cancelChecker struct {
	mu  sync.Mutex
	ids map[string]bool
}

func (c *cancelChecker) Cancelled(_ context.Context, _ transport.Queue, req *wire.Request) (bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ids[req.ID], nil
}

// stepGate answers Wait for a request until the test opens it.
type stepGate struct {
	mu    sync.Mutex
	open  map[string]bool
	asked map[string]bool
}

func (g *stepGate) Admit(_ context.Context, req *wire.Request) (gate.Decision, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.asked[req.ID] = true
	if g.open[req.ID] {
		return gate.Admitted, nil
	}
	return gate.Decision{Verdict: gate.Wait, Delay: time.Millisecond}, nil
}

// cancelEnd is how one request ended.
type cancelEnd struct {
	dispatched bool
	results    []string
}

// TestModelCancel runs random interleavings of arrivals, cancels and gate
// openings through the pipeline's real middleware (claim-time check,
// admission with a gate that keeps requests waiting, the check before
// dispatch) and checks the model after every step.
func TestModelCancel(t *testing.T) {
	mets, err := metrics.New(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	rapid.Check(t, func(t *rapid.T) {
		checker := &cancelChecker{ids: map[string]bool{}}
		g := &stepGate{open: map[string]bool{}, asked: map[string]bool{}}
		q := &Queue{metrics: newQueueMetrics(mets, transport.MetricLabels{QueueID: "q", QueueName: "q"}, ""), admitter: g}
		var mu sync.Mutex
		ends := map[string]*cancelEnd{}
		var dispatch message.HandlerFunc = func(m *message.Message) ([]*message.Message, error) {
			d := deliveryOf(m)
			mu.Lock()
			ends[d.Req.ID].dispatched = true
			mu.Unlock()
			return finish(d, &wire.Result{ID: d.Req.ID, StatusCode: 200, Payload: "{}"}), nil
		}
		requeue := func(context.Context, *delivery, []byte, time.Time) error {
			return errors.New("no re-queue in this model")
		}
		dead := func(context.Context, *delivery, string) error { return errors.New("dead-lettered") }
		h := dispatch
		for _, mw := range []message.HandlerMiddleware{cancelRecheck(checker, log), admission(requeue, time.Second, 0, nil, log),
			cancelCheck(checker, nil, log), deadlineCheck(), decoder(dead, log), recoverer(q, context.Background(), dead, log)} {
			h = mw(h)
		}
		m := &cancelModel{cancelledAt: map[string]int{}, openedAt: map[string]int{}}
		var ids, waiting []string
		done := map[string]chan struct{}{}
		wait := func(t *rapid.T, id string) {
			select {
			case <-done[id]:
			case <-time.After(10 * time.Second):
				t.Fatalf("request %s did not end within 10 s", id)
			}
		}
		defer func() {
			// Let every request still waiting go, so no goroutine outlives the check.
			g.mu.Lock()
			for _, id := range ids {
				g.open[id] = true
			}
			g.mu.Unlock()
			for _, id := range ids {
				<-done[id]
			}
		}()
		t.Repeat(map[string]func(*rapid.T){
			"arrive": func(t *rapid.T) {
				id := fmt.Sprintf("r%d", len(ids))
				ids = append(ids, id)
				waiting = append(waiting, id)
				mu.Lock()
				ends[id] = &cancelEnd{}
				mu.Unlock()
				done[id] = make(chan struct{})
				payload := fmt.Appendf(nil, `{"id":%q,"deadline":%d,"payload":{"model":"m"}}`, id, time.Now().Add(time.Hour).Unix())
				go func() {
					defer close(done[id])
					out, err := h(message.NewMessage(id, payload))
					mu.Lock()
					defer mu.Unlock()
					if err != nil {
						ends[id].results = append(ends[id].results, "error:"+err.Error())
					}
					for _, o := range out {
						ends[id].results = append(ends[id].results, string(o.Payload))
					}
				}()
				// The step ends once the request waits at its gate (past
				// the claim-time check).
				for end := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
					g.mu.Lock()
					asked := g.asked[id]
					g.mu.Unlock()
					if asked {
						break
					}
					if time.Now().After(end) {
						t.Fatalf("request %s did not reach its gate within 10 s", id)
					}
				}
			},
			"cancel": func(t *rapid.T) {
				if len(ids) == 0 {
					t.Skip("no request")
				}
				id := rapid.SampledFrom(ids).Draw(t, "id")
				m.step++
				checker.mu.Lock()
				checker.ids[id] = true
				checker.mu.Unlock()
				if _, ok := m.cancelledAt[id]; !ok {
					m.cancelledAt[id] = m.step
				}
			},
			"open": func(t *rapid.T) {
				if len(waiting) == 0 {
					t.Skip("none waiting")
				}
				i := rapid.IntRange(0, len(waiting)-1).Draw(t, "waiting")
				id := waiting[i]
				waiting = append(waiting[:i:i], waiting[i+1:]...)
				m.step++
				m.openedAt[id] = m.step
				g.mu.Lock()
				g.open[id] = true
				g.mu.Unlock()
				wait(t, id)
			},
			"": func(t *rapid.T) {
				mu.Lock()
				defer mu.Unlock()
				for id, e := range ends {
					opened, isOpen := m.openedAt[id]
					cancelled, isCancelled := m.cancelledAt[id]
					if !isOpen {
						if e.dispatched || len(e.results) > 0 {
							t.Fatalf("%s ended (%v, dispatched %v) before its gate let it through", id, e.results, e.dispatched)
						}
						continue
					}
					if len(e.results) != 1 {
						t.Fatalf("%s: %d outcomes %q, want exactly one", id, len(e.results), e.results)
					}
					if isCancelled && cancelled < opened {
						if e.dispatched {
							t.Fatalf("%s dispatched although its cancel took effect (step %d) before its gate let it through (step %d)", id, cancelled, opened)
						}
						if !strings.Contains(e.results[0], string(wire.CodeCancelled)) {
							t.Fatalf("%s cancelled before dispatch ended %q, want %s", id, e.results[0], wire.CodeCancelled)
						}
						continue
					}
					if !e.dispatched {
						t.Fatalf("%s never cancelled before its gate opened, but not dispatched: %q", id, e.results[0])
					}
				}
			},
		})
	})
}

// TestCancelWhileWaitingRegression is TestModelCancel's shrunk failure
// with the cancel-only-at-claim mutant, kept as a fixed case: a request
// waits at its gate, is cancelled, then let through: it ends CANCELLED and
// is never dispatched.
func TestCancelWhileWaitingRegression(t *testing.T) {
	mets, err := metrics.New(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	checker := &cancelChecker{ids: map[string]bool{}}
	g := &stepGate{open: map[string]bool{}, asked: map[string]bool{}}
	q := &Queue{metrics: newQueueMetrics(mets, transport.MetricLabels{QueueID: "q", QueueName: "q"}, ""), admitter: g}
	out, dispatched := runCancelChain(q, checker)
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		g.mu.Lock()
		asked := g.asked["r0"]
		g.mu.Unlock()
		if asked {
			break
		}
		if time.Now().After(end) {
			t.Fatal("r0 never reached its gate")
		}
	}
	checker.mu.Lock()
	checker.ids["r0"] = true
	checker.mu.Unlock()
	g.mu.Lock()
	g.open["r0"] = true
	g.mu.Unlock()
	endsCancelled(t, out, dispatched)
}

// runCancelChain runs request r0 through the cancellation steps of q's
// chain (the claim-time check, admission, the recheck) to a dispatch that
// reports on dispatched; out gets what the chain returns.
func runCancelChain(q *Queue, checker *cancelChecker) (out chan []*message.Message, dispatched chan string) {
	log := slog.New(slog.DiscardHandler)
	dispatched = make(chan string, 1)
	var h message.HandlerFunc = func(m *message.Message) ([]*message.Message, error) {
		dispatched <- deliveryOf(m).Req.ID
		return finish(deliveryOf(m), &wire.Result{ID: "r0", StatusCode: 200}), nil
	}
	requeue := func(context.Context, *delivery, []byte, time.Time) error { return errors.New("no re-queue") }
	dead := func(context.Context, *delivery, string) error { return errors.New("dead-lettered") }
	for _, mw := range []message.HandlerMiddleware{cancelRecheck(checker, log), admission(requeue, time.Second, 0, nil, log),
		cancelCheck(checker, nil, log), decoder(dead, log), recoverer(q, context.Background(), dead, log)} {
		h = mw(h)
	}
	out = make(chan []*message.Message, 1)
	go func() {
		o, _ := h(message.NewMessage("r0", fmt.Appendf(nil, `{"id":"r0","deadline":%d,"payload":{}}`, time.Now().Add(time.Hour).Unix())))
		out <- o
	}()
	return out, dispatched
}

// endsCancelled checks that r0 (runCancelChain) ends CANCELLED and was
// never dispatched.
func endsCancelled(t *testing.T, out <-chan []*message.Message, dispatched <-chan string) {
	t.Helper()
	select {
	case o := <-out:
		if len(o) != 1 || !strings.Contains(string(o[0].Payload), string(wire.CodeCancelled)) {
			t.Fatalf("results %v, want one %s", o, wire.CodeCancelled)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("r0 did not end")
	}
	select {
	case id := <-dispatched:
		t.Fatalf("%s dispatched after its cancel took effect", id)
	default:
	}
}
