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

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/metrics"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
)

// blockingAdmitter blocks until its context ends and records the deadline
// the context carried.
type blockingAdmitter struct{ deadline chan time.Time }

func (a blockingAdmitter) Admit(ctx context.Context, _ *wire.Request) (gate.Decision, error) {
	dl, _ := ctx.Deadline()
	a.deadline <- dl
	<-ctx.Done()
	return gate.Decision{}, ctx.Err()
}

// The deadline middleware adds no context; the admission hook is still
// bounded by the request's deadline, and a request whose hook outlives its
// deadline ends with a DEADLINE_EXCEEDED result instead of hanging.
func TestAdmissionBoundedByDeadline(t *testing.T) {
	mets, err := metrics.New(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	adm := blockingAdmitter{deadline: make(chan time.Time, 1)}
	q := &Queue{metrics: newQueueMetrics(mets, transport.MetricLabels{QueueID: "q", QueueName: "q"}, ""), admitter: adm}
	deadline := time.Now().Add(150 * time.Millisecond)
	payload := fmt.Appendf(nil, `{"id":"r1","deadline":%d,"payload":{"model":"m"}}`, deadline.Unix())
	// Unix seconds are too coarse for a 150 ms deadline: set it on the
	// decoded request instead, before the deadline middleware runs.
	setDeadline := func(next message.HandlerFunc) message.HandlerFunc {
		return func(m *message.Message) ([]*message.Message, error) {
			deliveryOf(m).Req.Deadline = deadline
			return next(m)
		}
	}
	requeued := false
	requeue := func(context.Context, *delivery, []byte, time.Time) error { requeued = true; return nil }
	dead := func(context.Context, *delivery, string) error { return errors.New("dead-lettered") }
	log := slog.New(slog.DiscardHandler)
	var h message.HandlerFunc = func(*message.Message) ([]*message.Message, error) {
		t.Error("dispatched although admission never admitted")
		return nil, nil
	}
	for _, m := range []message.HandlerMiddleware{admission(requeue, time.Second, time.Minute, nil, log), deadlineCheck(), setDeadline, decoder(dead, log), recoverer(q, context.Background(), dead, log)} {
		h = m(h)
	}
	done := make(chan []*message.Message, 1)
	go func() {
		out, err := h(message.NewMessage("1", payload))
		if err != nil {
			t.Error(err)
		}
		done <- out
	}()
	select {
	case dl := <-adm.deadline:
		if !dl.Equal(deadline) {
			t.Fatalf("admission context deadline %v, want the request's %v", dl, deadline)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("admission hook not called")
	}
	select {
	case out := <-done:
		if requeued {
			// An admission error defers; a deferral past the deadline is
			// answered instead of re-queued.
			t.Fatal("re-queued past the deadline")
		}
		if len(out) != 1 || !strings.Contains(string(out[0].Payload), string(wire.CodeDeadlineExceeded)) {
			t.Fatalf("got %d results (%v), want one %s result", len(out), out, wire.CodeDeadlineExceeded)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the admission hook was not cut off at the request's deadline")
	}
}
