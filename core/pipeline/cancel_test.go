package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-io/sluice/core/metrics"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
)

func TestInflightCancelByJobAndID(t *testing.T) {
	f := newInflightIndex()
	type entry struct {
		ctx  context.Context
		done func()
	}
	reg := func(id, job string) entry {
		ctx, cancel := context.WithCancelCause(context.Background())
		return entry{ctx, f.Register(transport.Queue{Name: "q"}, &wire.Request{ID: id, Metadata: map[string]string{"job_id": job}}, cancel)}
	}
	a1, a2, b1 := reg("a1", "A"), reg("a2", "A"), reg("b1", "B")
	if n := f.Cancel(transport.Cancellation{JobID: "A"}); n != 2 {
		t.Fatalf("cancelled %d, want 2", n)
	}
	for _, e := range []entry{a1, a2} {
		if !errors.Is(context.Cause(e.ctx), errCancelled) {
			t.Errorf("cause %v, want ErrCancelled", context.Cause(e.ctx))
		}
	}
	if b1.ctx.Err() != nil {
		t.Error("job B cancelled with job A")
	}
	a1.done()
	a2.done()
	if n := f.Cancel(transport.Cancellation{RequestID: "b1"}); n != 1 || b1.ctx.Err() == nil {
		t.Errorf("cancel by id: %d", n)
	}
	b1.done()
	if f.Len() != 0 {
		t.Errorf("%d entries left", f.Len())
	}
	if n := f.Cancel(transport.Cancellation{JobID: "A"}); n != 0 {
		t.Errorf("cancelled %d finished requests", n)
	}
}

// A request that waited for a worker of its pool's lanes (not for a gate)
// is checked for cancellation again before its dispatch: a cancel that
// took effect while it waited ends it CANCELLED, undispatched.
func TestCancelWhileWaitingForWorker(t *testing.T) {
	mets, err := metrics.New(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	l := newLanes(1, nil)
	never := make(chan struct{})
	if _, err := l.acquire(context.Background(), 0, "other", never); err != nil { // the only worker
		t.Fatal(err)
	}
	checker := &cancelChecker{ids: map[string]bool{}}
	q := &Queue{Queue: transport.Queue{ID: "q", Name: "q"}, metrics: newQueueMetrics(mets, transport.MetricLabels{QueueID: "q", QueueName: "q"}, ""),
		priority: &Priority{}, pool: &Pool{ID: "p", lanes: l, freed: &waker{}}}
	dispatched := make(chan string, 1)
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
	out := make(chan []*message.Message, 1)
	go func() {
		o, _ := h(message.NewMessage("r0", fmt.Appendf(nil, `{"id":"r0","deadline":%d,"payload":{}}`, time.Now().Add(time.Hour).Unix())))
		out <- o
	}()
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		l.mu.Lock()
		waiting := 0
		for i := range l.queues {
			waiting += l.queues[i].nwaiting
		}
		l.mu.Unlock()
		if waiting > 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatal("r0 never waited for a worker")
		}
	}
	checker.mu.Lock()
	checker.ids["r0"] = true
	checker.mu.Unlock()
	l.release("other")
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
