package pipeline

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/cenkalti/backoff/v5"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
)

// Writing a result that the destination refuses.
//
// A result that cannot be written (a Pub/Sub result topic that does not
// exist, a Redis key of the wrong type, a broker that is down) is not a
// reason to call the gateway again. The settler keeps the result and
// retries writing it with an exponential backoff, holding the delivery (and
// its credit: while every credit is held no new request is claimed, so the
// gateway is not called for requests whose results could not be written
// either) for at most Config.ResultWriteTimeout, and never longer than the
// transport may hold a delivery (transport.HoldLimiter, less a margin).
// Then, or at shutdown, it hands the request back through Requeue with the
// result kept in the message (wire.WithKeptResult), due after
// Config.ResultHandBackDelay (at shutdown: at once), so a destination that
// stays broken is not a hot loop, so that whichever replica gets it
// next only writes the result. Only when that re-queue fails too is the
// delivery nacked (the transport redelivers it, and it will be answered
// again). Failures are logged at most once per resultLogEvery per queue,
// with the count of the lines suppressed, and counted in
// sluice_result_write_errors_total; a result is counted in
// sluice_results_total once, when it is written.
//
// The backoff is cenkalti/backoff/v5's (already in the module graph through
// the OpenTelemetry exporter): its Retry bounds the attempts by elapsed
// time and by a context, and reports each failure with the next wait,
// which is all this needs.
const (
	resultBackoffInitial = 100 * time.Millisecond
	resultBackoffMax     = 30 * time.Second
	// holdMargin is kept free of a transport's hold limit: the hand-back
	// must happen while the delivery is still ours.
	holdMargin = 10 * time.Second
	// resultLogEvery bounds the write-failure log lines per queue.
	resultLogEvery = 10 * time.Second
)

// everyLog lets one log line through per interval and counts the others.
type everyLog struct {
	every time.Duration

	mu         sync.Mutex
	last       time.Time
	suppressed int
}

// allow reports whether a line may be logged at now, and how many were
// suppressed since the last one (reset when it returns true).
func (e *everyLog) allow(now time.Time) (bool, int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.last.IsZero() && now.Sub(e.last) < e.every {
		e.suppressed++
		return false, 0
	}
	n := e.suppressed
	e.last, e.suppressed = now, 0
	return true, n
}

// Freeing a credit before the result is written.
//
// A credit bounds a queue's requests at the gateway. Once a call has
// answered, only the result write is left (a group-committed round trip on
// Redis), so the settler gives the credit back before writing and the
// claim loop can take the next request meanwhile: a 0-ms gateway is then
// bound by the calls, not by the calls plus the writes. The results being
// written on freed credits are bounded too (earlyWrites, as many as the
// queue's concurrency): when writes are slow or failing, the next results
// keep their credits while they are written, and once every credit is held
// that way no new request is claimed, as before.
type earlyWrites struct {
	max int64
	n   atomic.Int64
}

// take reserves one early write, if fewer than max are under way.
func (e *earlyWrites) take() bool {
	if e.n.Add(1) <= e.max {
		return true
	}
	e.n.Add(-1)
	return false
}

// give ends an early write.
func (e *earlyWrites) give() { e.n.Add(-1) }

// resultWriter writes the results of one queue (see above).
type resultWriter struct {
	p      *Pipeline
	q      *Queue
	pub    message.Publisher
	work   context.Context // ends (cause errShutdown) when the drain is over
	routes bool            // a request may name its own result destination
	hold   time.Duration   // how long a delivery may be held after its claim (0: no limit)
	logs   everyLog
	early  earlyWrites // results written after their credit went back
}

func (p *Pipeline) newResultWriter(work context.Context, pub message.Publisher, q *Queue) *resultWriter {
	_, routes := p.cfg.Transport.(transport.ResultRouter)
	w := &resultWriter{p: p, q: q, pub: pub, work: work, routes: routes && q.ResultFromMessage, logs: everyLog{every: resultLogEvery},
		early: earlyWrites{max: int64(max(q.MaxConcurrency, 1))}}
	if hl, ok := p.cfg.Transport.(transport.HoldLimiter); ok {
		w.hold = hl.MaxHold(q.Queue)
	}
	return w
}

// budget is how long the delivery m may still be held while its result is retried.
func (w *resultWriter) budget(m *message.Message) time.Duration {
	b := w.p.cfg.ResultWriteTimeout
	if w.hold > 0 {
		held := time.Duration(0)
		if c := transport.Claimed(m); !c.IsZero() {
			held = time.Since(c)
		}
		b = min(b, w.hold-holdMargin-held)
	}
	return max(b, 0)
}

// write publishes the result messages out of delivery m and settles m:
// Ack once the result is written or handed back with the result kept; Nack
// (and the error) when neither could be done.
func (w *resultWriter) write(m *message.Message, out []*message.Message) error {
	d := deliveryOf(m)
	topic := w.q.ResultName
	if w.routes && d != nil && d.Req != nil && d.Req.ResultQueueName != "" {
		topic = d.Req.ResultQueueName
	}
	err := w.pub.Publish(topic, out...) // the common case: no backoff state at all
	if err != nil {
		err = w.retry(m, d, topic, out, err)
	}
	if err == nil {
		if d != nil && d.Result != nil {
			code := d.resultCode
			if code == "" {
				code = resultCode(d)
			}
			d.mq().Result(code).Inc()
		}
		transport.Ack(m)
		return nil
	}
	if errors.Is(err, transport.ErrDeliveryLost) {
		w.logFailure("cannot write a result: the delivery is lost; handing it back (it will be answered again)", topic, err)
		transport.Nack(m)
		return fmt.Errorf("publish result: %w", err)
	}
	due := time.Now().Add(w.p.cfg.ResultHandBackDelay)
	if w.work.Err() != nil {
		due = time.Now() // shutting down: another replica may write it at once
	}
	if herr := w.handBackKept(d, out, due); herr != nil {
		w.logFailure("cannot write a result nor hand the request back with it; handing it back without it (it will be answered again)",
			topic, errors.Join(err, herr))
		transport.Nack(m)
		return fmt.Errorf("publish result: %w", err)
	}
	w.logFailure("cannot write a result; handed the request back with the result kept", topic, err, "due", due.UTC().Format(time.RFC3339))
	d.Outcome = outcomeHandedBack
	d.mq().HandedBack.Inc()
	transport.Ack(m)
	return nil
}

// retry retries publishing out after its first failure, err, with the
// backoff, for as long as m may be held; it returns nil once written.
func (w *resultWriter) retry(m *message.Message, d *delivery, topic string, out []*message.Message, err error) error {
	failed := func() {
		if d != nil {
			d.mq().ResultWriteErrors.Inc()
		}
	}
	failed()
	if errors.Is(err, transport.ErrDeliveryLost) {
		return err // a retry cannot succeed
	}
	w.logFailure("cannot write a result; keeping it and retrying", topic, err)
	publish := func() (struct{}, error) {
		err := w.pub.Publish(topic, out...)
		if err != nil {
			failed()
		}
		if errors.Is(err, transport.ErrDeliveryLost) {
			return struct{}{}, backoff.Permanent(err)
		}
		return struct{}{}, err
	}
	exp := backoff.NewExponentialBackOff()
	exp.InitialInterval, exp.MaxInterval = resultBackoffInitial, resultBackoffMax
	b := w.budget(m)
	if b <= 0 {
		return err // no time left to hold it
	}
	_, err = backoff.Retry(w.work, publish,
		backoff.WithBackOff(exp),
		backoff.WithMaxElapsedTime(b),
		backoff.WithNotify(func(err error, next time.Duration) {
			w.logFailure("cannot write a result; keeping it and retrying", topic, err, "retry_in", next.Round(time.Millisecond).String())
		}))
	return err
}

// handBackKept re-queues d's request with its result kept, due at due.
func (w *resultWriter) handBackKept(d *delivery, out []*message.Message, due time.Time) error {
	if d == nil || d.Req == nil || len(out) != 1 {
		return errors.New("no request to hand back")
	}
	payload, err := wire.WithKeptResult(d.Msg.Payload, out[0].Payload)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(w.work), 10*time.Second)
	defer cancel()
	return w.p.requeue(ctx, d, payload, due)
}

// logFailure logs a write failure, at most once per resultLogEvery.
func (w *resultWriter) logFailure(msg, topic string, err error, attrs ...any) {
	ok, suppressed := w.logs.allow(time.Now())
	if !ok {
		return
	}
	w.p.log.Error(msg, append([]any{"queue", w.q.ID, "destination", topic, "err", err, "suppressed", suppressed,
		"suppressed_window", w.logs.every.String()}, attrs...)...)
}
