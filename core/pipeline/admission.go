package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/metrics"
	"github.com/sluice-io/sluice/core/wire"
)

// Per-request gate decisions (admission): Admit dispatches and keeps the
// reservations until the request ends; Defer re-queues without counting an
// attempt; Reject answers with the gate's result or GATE_DROPPED; Wait keeps
// the request where it is and asks again when its pool frees capacity (a
// request of the pool ends, a reservation is given back, the pool gate's
// budget changes) or after the decision's delay (at most maxWait), bounded by
// the request's deadline and the gate-wait timeout (upstream's
// --gate-wait-timeout): at the deadline it ends with DEADLINE_EXCEEDED, at
// the timeout it is re-queued at once with no result
// (gate_wait_requeues_total); a shutdown re-queues it too. The same bounds
// hold for the wait for a worker of the lanes.

// minDefer is the delay of a deferral whose gate gave none: upstream takes
// such a request again at once, which spins through the gates (a quota
// script per pass) while the gate stays shut.
const minDefer = 250 * time.Millisecond

// maxWait bounds one wait of a Wait decision before the gates are asked
// again, for capacity no event announces (a metric falling).
const maxWait = time.Second

// errDraining ends a wait when shutdown begins: the request is re-queued.
var errDraining = errors.New("shutdown began while the request waited")

// admission asks the queue's gate, then takes a worker of the pool's lanes
// (tier-priority policy only), then asks the pool's gate, per request (see
// the notes above). gateTimeout bounds the waits of a request (upstream's
// --gate-wait-timeout; ≤ 0: only the deadline); draining closes when
// shutdown begins.
func admission(requeue requeuer, errDelay, gateTimeout time.Duration, draining <-chan struct{}, log *slog.Logger) message.HandlerMiddleware {
	return func(next message.HandlerFunc) message.HandlerFunc {
		return func(m *message.Message) ([]*message.Message, error) {
			d := deliveryOf(m)
			q, pool := d.Queue, d.Queue.pool
			if pool != nil {
				defer pool.freed.Wake() // capacity for a waiter, once this request ends
			}
			bound := d.Req.Deadline
			if gateTimeout > 0 {
				bound = minTime(bound, time.Now().Add(gateTimeout))
			}
			a := asker{d: d, bound: bound, draining: draining, errDelay: errDelay, log: log}

			// The queue's gate.
			dec, out, done, err := a.ask(q.admitter, d.mq(), pool)
			if done {
				return a.end(dec, out, err, requeue)
			}
			if dec.Release != nil {
				defer dec.Release()
			}
			d.Pod = dec.Pod
			// A worker of the pool, by lane.
			if pool != nil && pool.lanes != nil {
				if out, taken, err := takeWorker(d, pool, bound, draining, requeue); !taken {
					return out, err
				}
				defer pool.lanes.release(q.ID)
			}
			// The pool's gate.
			var poolObserve func(gate.Feedback)
			if pool != nil {
				pdec, out, done, err := a.ask(pool.admitter, pool.metrics, pool)
				if done {
					return a.end(pdec, out, err, requeue)
				}
				if pdec.Release != nil {
					defer pdec.Release()
				}
				poolObserve = pdec.Observe
				if d.Pod == "" {
					d.Pod = pdec.Pod
				}
			}
			return observed(d, next, m, dec.Observe, poolObserve)
		}
	}
}

// asker asks one gate for one request until it admits or ends the request.
type asker struct {
	d        *delivery
	bound    time.Time
	draining <-chan struct{}
	errDelay time.Duration
	log      *slog.Logger
}

// ask asks adm (nil: admit) until it does not answer Wait; done says the
// request does not go further: dec is the decision that stopped it (a
// Defer to re-queue when out and err are nil), or out and err end it.
func (a asker) ask(adm gate.Admitter, mq *metrics.Queue, pool *Pool) (dec gate.Decision, out []*message.Message, done bool, err error) {
	if adm == nil {
		return gate.Admitted, nil, false, nil
	}
	d := a.d
	waited := false
	for {
		var freed <-chan struct{}
		if pool != nil {
			freed = pool.freed.C() // before asking: no wake-up is lost
		}
		ctx, cancel := context.WithDeadline(d.Ctx, a.bound)
		dec, err := adm.Admit(ctx, d.Req)
		cancel()
		if err != nil {
			mq.Verdict("error").Inc()
			mq.Decision(metrics.ReasonError).Inc()
			a.log.Warn("gate admission failed; deferring", "queue", d.Queue.ID, "id", d.Req.ID, "err", err)
			return gate.Decision{Verdict: gate.Defer, Delay: a.errDelay, Reason: err.Error()}, nil, true, nil
		}
		mq.Verdict(dec.Verdict.String()).Inc()
		switch dec.Verdict {
		case gate.Admit:
			return dec, nil, false, nil
		case gate.Reject:
			mq.Decision(metrics.ReasonDropped).Inc()
			if dec.Result != nil {
				res := *dec.Result
				res.ID, res.Metadata = d.Req.ID, d.Req.Metadata
				return dec, finish(d, &res), true, nil
			}
			return dec, fail(d, wire.CodeGateDropped, "dropped by gate: "+dec.Reason), true, nil
		case gate.Wait:
			if !waited {
				mq.Decision(refusal(d.Req)).Inc()
			}
			waited = true
			if stop, out, done, err := a.waitOut(dec, freed); done {
				return stop, out, true, err
			}
			continue
		}
		if !waited {
			mq.Decision(refusal(d.Req)).Inc()
		}
		return dec, nil, true, nil
	}
}

// waitOut waits out dec, a gate's Wait, before the gate is asked again
// (done false). done says the wait ended the request: stop is a Defer back
// to the queue now (at the gate-wait timeout before the deadline, or when
// shutdown began), or out and err are its end (DEADLINE_EXCEEDED at the
// deadline).
func (a asker) waitOut(dec gate.Decision, freed <-chan struct{}) (stop gate.Decision, out []*message.Message, done bool, err error) {
	d := a.d
	d.waited = true
	waiting := d.mq().GateWaiting
	waiting.Inc()
	out, done, timedOut, err := wait(d, freed, dec.Delay, a.bound, a.draining)
	waiting.Dec()
	switch {
	case timedOut: // the gate-wait timeout, before the deadline: back to the queue now, no result
		d.mq().GateWaitRequeues.Inc()
		return gate.Decision{Verdict: gate.Defer, Delay: time.Nanosecond, Reason: "waited the gate-wait timeout"}, nil, true, nil
	case done && out == nil && err == nil: // shutdown: back to the queue now
		return gate.Decision{Verdict: gate.Defer, Reason: "shutdown while waiting for the gate"}, nil, true, nil
	case done:
		return dec, out, true, err
	}
	return dec, nil, false, nil
}

// takeWorker takes a worker of pool's lanes for d, by its lane, waiting
// until bound at most. When none is taken (taken false), out and err end
// the request: re-queued now at shutdown or at the gate-wait timeout
// before the deadline, DEADLINE_EXCEEDED at the deadline, or the cause of
// d's context when that ended. A taken worker is released by the caller.
func takeWorker(d *delivery, pool *Pool, bound time.Time, draining <-chan struct{}, requeue requeuer) (out []*message.Message, taken bool, err error) {
	ctx, cancel := context.WithDeadline(d.Ctx, bound)
	waited, err := pool.lanes.acquire(ctx, d.Queue.priority.lane(d.Req), d.Queue.ID, draining)
	cancel()
	d.waited = d.waited || waited
	switch {
	case errors.Is(err, errDraining):
		out, err = deferTo(d, requeue, time.Now(), "shutdown while waiting for a worker")
		return out, false, err
	case err != nil && d.Ctx.Err() != nil:
		return nil, false, context.Cause(d.Ctx)
	case err != nil && time.Now().Before(d.Req.Deadline):
		d.mq().GateWaitRequeues.Inc()
		out, err = deferTo(d, requeue, time.Now(), "waited the gate-wait timeout for a worker")
		return out, false, err
	case err != nil:
		return fail(d, wire.CodeDeadlineExceeded, "no worker of the pool was free before the deadline"), false, nil
	}
	return nil, true, nil
}

// end finishes a request a gate stopped: a Defer re-queues it (without an
// attempt), anything else is already its result or error.
func (a asker) end(dec gate.Decision, out []*message.Message, err error, requeue requeuer) ([]*message.Message, error) {
	if out != nil || err != nil || dec.Verdict != gate.Defer {
		return out, err
	}
	d := a.d
	delay := dec.Delay
	if delay <= 0 {
		delay = minDefer
	}
	due := time.Now().Add(delay)
	if !due.Before(d.Req.Deadline) {
		return fail(d, wire.CodeDeadlineExceeded, "gate deferred the request past its deadline: "+dec.Reason), nil
	}
	return deferTo(d, requeue, due, dec.Reason)
}

// wait waits for a Wait decision to be asked again: done is false when it
// is time to ask; timedOut says the bound passed before the deadline (the
// gate-wait timeout); otherwise out and err end the request
// (DEADLINE_EXCEEDED at the deadline), or both are nil when shutdown began.
func wait(d *delivery, freed <-chan struct{}, delay time.Duration, bound time.Time, draining <-chan struct{}) (out []*message.Message, done, timedOut bool, err error) {
	if delay <= 0 || delay > maxWait {
		delay = maxWait
	}
	left := time.Until(bound)
	if left <= 0 {
		if time.Now().Before(d.Req.Deadline) {
			return nil, true, true, nil
		}
		return fail(d, wire.CodeDeadlineExceeded, "gate kept the request waiting until its deadline"), true, false, nil
	}
	t := time.NewTimer(min(delay, left))
	defer t.Stop()
	select {
	case <-freed:
	case <-t.C:
	case <-draining:
	case <-d.Ctx.Done():
		return nil, true, false, context.Cause(d.Ctx)
	}
	select {
	case <-draining: // whatever woke it, a waiting request does not start during shutdown
		return nil, true, false, nil
	default:
	}
	return nil, false, false, nil
}

// deferTo re-queues the request without counting an attempt.
func deferTo(d *delivery, requeue requeuer, due time.Time, reason string) ([]*message.Message, error) {
	payload, err := requeuePayload(d, d.Req.RetryCount)
	if err != nil {
		return fail(d, wire.CodeInvalidRequest, "cannot re-encode to defer: "+err.Error()), nil
	}
	if err := requeue(context.WithoutCancel(d.Ctx), d, payload, due); err != nil {
		return nil, fmt.Errorf("defer %s (%s): %w", d.Req.ID, reason, err)
	}
	d.mq().Deferred.Inc()
	d.Outcome = outcomeRequeued
	return nil, nil
}

// refusal is upstream's reason for a refusal or a wait: quota_exhausted
// when a gate classified the request as over its quota.
func refusal(req *wire.Request) string {
	if req.Classification() == wire.ClassOverflow {
		return metrics.ReasonQuotaExhausted
	}
	return metrics.ReasonGateClosed
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
