package pipeline

import (
	"context"
	"errors"
	"testing"
	"time"

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
	l := newLanes(1, nil)
	never := make(chan struct{})
	if _, err := l.acquire(context.Background(), 0, "other", never); err != nil { // the only worker
		t.Fatal(err)
	}
	checker := &cancelChecker{ids: map[string]bool{}}
	q := &Queue{Queue: transport.Queue{ID: "q", Name: "q"}, metrics: newQueueMetrics(mets, transport.MetricLabels{QueueID: "q", QueueName: "q"}, ""),
		priority: &Priority{}, pool: &Pool{ID: "p", lanes: l, freed: &waker{}}}
	out, dispatched := runCancelChain(q, checker)
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
	endsCancelled(t, out, dispatched)
}
