package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-io/sluice/core/dispatch"
	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/metrics"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
)

// admitAll is a queue gate that lets every request through at once.
type admitAll struct{}

func (admitAll) Admit(context.Context, *wire.Request) (gate.Decision, error) {
	return gate.Admitted, nil
}

// noCancels is a transport's cancellation check that finds nothing
// cancelled.
type noCancels struct{}

func (noCancels) Cancelled(context.Context, transport.Queue, *wire.Request) (bool, error) {
	return false, nil
}

// BenchmarkRequestPath measures one request through the per-request chain
// in handlerOf's order (recovery, metrics, decoding, limits, deadline,
// cancellation with an in-flight index, a gate that admits at once, the
// recheck, retry) and the dispatch handler, against a dispatcher that
// answers 200 at once. The settler is left out: it needs a transport's
// publisher, and its cost is the transport's.
func BenchmarkRequestPath(b *testing.B) {
	mets, err := metrics.New(prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	q := &Queue{Queue: transport.Queue{Name: "q"}, metrics: newQueueMetrics(mets, transport.MetricLabels{QueueID: "q", QueueName: "q"}, ""), admitter: admitAll{}}
	requeue := func(context.Context, *delivery, []byte, time.Time) error { return errors.New("no re-queue here") }
	dead := func(context.Context, *delivery, string) error { return errors.New("no dead letters here") }
	var checker transport.CancelChecker = noCancels{}
	chain := []message.HandlerMiddleware{
		recoverer(q, context.Background(), dead, log),
		recordMetrics(q),
		decoder(dead, log),
		limiter(wire.Limits{}),
		deadlineCheck(),
		cancelCheck(checker, newInflightIndex(), log),
		admission(requeue, time.Second, 0, nil, log),
		cancelRecheck(checker, log),
		retrier(RetryPolicy{MaxAttempts: 3}, requeue),
	}
	h := dispatchHandler(fixedDispatcher{Class: dispatch.Success, StatusCode: 200, Body: []byte(`{"ok":true}`)}, nil)
	for i := len(chain) - 1; i >= 0; i-- {
		h = chain[i](h)
	}
	payload := fmt.Appendf(nil, `{"id":"r1","deadline":%d,"payload":{"model":"m","prompt":"hello","max_tokens":8},"metadata":{"job_id":"bench"}}`, time.Now().Add(time.Hour).Unix())
	b.ReportAllocs()
	for b.Loop() {
		m := message.NewMessage("1", payload)
		out, err := h(m)
		if err != nil || len(out) != 1 || deliveryOf(m).Result.StatusCode != 200 {
			b.Fatalf("out %d, err %v", len(out), err)
		}
	}
}
