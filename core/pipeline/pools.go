package pipeline

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-io/sluice/core/credit"
	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/metrics"
	"github.com/sluice-io/sluice/core/wire"
)

// Worker pools and per-request gate decisions.
//
// A worker pool (upstream's) bounds the requests in flight of all its
// queues together: its credits are taken with each queue's own (credit.Both)
// before the claim loop claims, so a saturated pool leaves requests in the
// broker, in deadline order, instead of claiming and refusing them. Its gate,
// when it has one, decides per request after the queue's gate; a pool gate
// whose budget falls to 0 closes the pool's credits (upstream refuses every
// request then), and reopens them when it rises.
//
// Decisions (Admission): Admit dispatches and keeps the reservations until
// the request ends; Defer re-queues without counting an attempt; Reject
// answers with the gate's result or GATE_DROPPED; Wait keeps the request
// where it is and asks again when its pool frees capacity (a request of the
// pool ends, a reservation is given back, the pool gate's budget changes) or
// after the decision's delay (at most maxWait), bounded by the request's
// deadline and the gate timeout; a shutdown re-queues it.

// Pool is one worker pool of the pipeline.
type Pool struct {
	// ID names the pool; queues name it in Queue.WorkerPool.
	ID string
	// Workers is the most requests of the pool's queues in flight at once.
	Workers int
	// Gate is the refresh loop of the pool's gate (nil: none).
	Gate *gate.Refresher

	credits  *credit.Pool
	admitter gate.Admitter // Gate's per-request hook (nil: none)
	metrics  *metrics.Queue
	freed    *waker
}

// maxWait bounds one wait of a Wait decision before the gates are asked
// again, for capacity no event announces (a metric falling).
const maxWait = time.Second

// waker wakes every waiter at once: C returns a channel closed by the next
// Wake.
type waker struct {
	mu sync.Mutex
	ch chan struct{}
}

// C returns the channel the next Wake closes.
func (w *waker) C() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ch == nil {
		w.ch = make(chan struct{})
	}
	return w.ch
}

// Wake wakes the waiters of the current channel.
func (w *waker) Wake() {
	w.mu.Lock()
	if w.ch != nil {
		close(w.ch)
		w.ch = nil
	}
	w.mu.Unlock()
}

// poolFollower makes a pool's credits follow its gate as upstream's pool
// gate acts: open while the budget is above 0, closed at 0.
type poolFollower struct {
	credits *credit.Pool
	freed   *waker
}

// SetBudget opens or closes the pool and wakes its waiters.
func (f poolFollower) SetBudget(b float64) {
	if b > 0 {
		f.credits.SetBudget(1)
	} else {
		f.credits.SetBudget(0)
	}
	f.freed.Wake()
}

// initPools builds the pools' credits and the metrics they export, and
// returns them by id.
func initPools(cfg *Config) (map[string]*Pool, error) {
	pools := map[string]*Pool{}
	for i := range cfg.Pools {
		p := cfg.Pools[i]
		switch {
		case p.ID == "":
			return nil, fmt.Errorf("pipeline: pool %d: empty id", i)
		case pools[p.ID] != nil:
			return nil, fmt.Errorf("pipeline: duplicate pool %q", p.ID)
		case p.Workers < 1:
			return nil, fmt.Errorf("pipeline: pool %q: %d workers < 1", p.ID, p.Workers)
		}
		p.credits = credit.NewPool(p.Workers, credit.Ramp{})
		p.freed = &waker{}
		p.metrics = cfg.Metrics.For(metrics.Labels{Pool: p.ID}) // upstream: pool gates count with empty queue labels
		if p.Gate != nil {
			p.admitter, _ = p.Gate.Gate().(gate.Admitter)
			p.Gate.Attach(poolFollower{p.credits, p.freed})
		} else {
			p.credits.SetBudget(1)
		}
		cfg.Metrics.PoolWorkerLimit.WithLabelValues(p.ID).Set(float64(p.Workers))
		pools[p.ID] = &p
	}
	return pools, nil
}

// Admission asks the queue's gate and then its pool's, per request (see
// the package notes above). gateTimeout bounds the waits of a request
// (upstream's --request-timeout); draining closes when shutdown begins.
func Admission(requeue Requeuer, errDelay, gateTimeout time.Duration, draining <-chan struct{}, log *slog.Logger) message.HandlerMiddleware {
	return func(next message.HandlerFunc) message.HandlerFunc {
		return func(m *message.Message) ([]*message.Message, error) {
			d := From(m)
			q := d.Queue
			if q.admitter == nil && (q.pool == nil || q.pool.admitter == nil) {
				if q.pool != nil {
					defer q.pool.freed.Wake() // capacity for a waiter of another queue
				}
				return next(m)
			}
			bound := d.Req.Deadline
			if gateTimeout > 0 {
				bound = minTime(bound, time.Now().Add(gateTimeout))
			}
			waited := false
			for {
				var freed <-chan struct{}
				if q.pool != nil {
					freed = q.pool.freed.C() // before asking: no wake-up is lost
				}
				dec, by, err := admit(d, bound)
				mq := by
				if err != nil {
					mq.Verdict("error").Inc()
					mq.Decision(metrics.ReasonError).Inc()
					log.Warn("gate admission failed; deferring", "queue", q.ID, "id", d.Req.ID, "err", err)
					dec = gate.Decision{Verdict: gate.Defer, Delay: errDelay, Reason: err.Error()}
				} else {
					mq.Verdict(dec.Verdict.String()).Inc()
				}
				switch dec.Verdict {
				case gate.Admit:
					if dec.Release != nil {
						defer func() {
							dec.Release()
							if q.pool != nil {
								q.pool.freed.Wake()
							}
						}()
					} else if q.pool != nil {
						defer q.pool.freed.Wake()
					}
					return next(m)
				case gate.Reject:
					mq.Decision(metrics.ReasonDropped).Inc()
					if dec.Result != nil {
						res := *dec.Result
						res.ID, res.Metadata = d.Req.ID, d.Req.Metadata
						return Finish(d, &res), nil
					}
					return Fail(d, wire.CodeGateDropped, "dropped by gate: "+dec.Reason), nil
				case gate.Wait:
					if !waited && err == nil {
						mq.Decision(refusal(d.Req)).Inc()
					}
					waited = true
					if out, done, err := wait(d, freed, dec.Delay, bound, draining); done {
						if out == nil && err == nil { // shutdown: back to the queue, no attempt counted
							return deferTo(d, requeue, time.Now(), "shutdown while waiting for the gate")
						}
						return out, err
					}
					continue
				}
				if err == nil && !waited {
					mq.Decision(refusal(d.Req)).Inc()
				}
				due := time.Now().Add(max(dec.Delay, time.Millisecond))
				if !due.Before(d.Req.Deadline) {
					return Fail(d, wire.CodeDeadlineExceeded, "gate deferred the request past its deadline: "+dec.Reason), nil
				}
				return deferTo(d, requeue, due, dec.Reason)
			}
		}
	}
}

// admit asks the queue's gate, then the pool's; a reservation the queue's
// gate made is given back when the pool's does not admit. It returns the
// metrics view the deciding gate counts under.
func admit(d *Delivery, bound time.Time) (gate.Decision, *metrics.Queue, error) {
	ctx, cancel := context.WithDeadline(d.Ctx, bound)
	defer cancel()
	q := d.Queue
	dec := gate.Admitted
	if q.admitter != nil {
		var err error
		if dec, err = q.admitter.Admit(ctx, d.Req); err != nil || dec.Verdict != gate.Admit {
			return dec, d.mq(), err
		}
	}
	if q.pool == nil || q.pool.admitter == nil {
		return dec, d.mq(), nil
	}
	pdec, err := q.pool.admitter.Admit(ctx, d.Req)
	if err != nil || pdec.Verdict != gate.Admit {
		if dec.Release != nil {
			dec.Release()
		}
		return pdec, q.pool.metrics, err
	}
	pdec.Release = gate.JoinReleases(nonNil(dec.Release, pdec.Release)...)
	return pdec, d.mq(), nil
}

// wait waits for a Wait decision to be asked again: done is false when it
// is time to ask; otherwise out and err end the request (DEADLINE_EXCEEDED
// at the bound), or both are nil when shutdown began.
func wait(d *Delivery, freed <-chan struct{}, delay time.Duration, bound time.Time, draining <-chan struct{}) (out []*message.Message, done bool, err error) {
	if delay <= 0 || delay > maxWait {
		delay = maxWait
	}
	left := time.Until(bound)
	if left <= 0 {
		return Fail(d, wire.CodeDeadlineExceeded, "gate kept the request waiting until its deadline"), true, nil
	}
	t := time.NewTimer(min(delay, left))
	defer t.Stop()
	select {
	case <-freed:
	case <-t.C:
	case <-draining:
	case <-d.Ctx.Done():
		return nil, true, context.Cause(d.Ctx)
	}
	select {
	case <-draining: // whatever woke it, a waiting request does not start during shutdown
		return nil, true, nil
	default:
	}
	return nil, false, nil
}

// deferTo re-queues the request without counting an attempt.
func deferTo(d *Delivery, requeue Requeuer, due time.Time, reason string) ([]*message.Message, error) {
	payload, err := requeuePayload(d, d.Req.RetryCount)
	if err != nil {
		return Fail(d, wire.CodeInvalidRequest, "cannot re-encode to defer: "+err.Error()), nil
	}
	if err := requeue(context.WithoutCancel(d.Ctx), d, payload, due); err != nil {
		return nil, fmt.Errorf("defer %s (%s): %w", d.Req.ID, reason, err)
	}
	d.mq().Deferred.Inc()
	d.Outcome = Requeued
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

func nonNil(fs ...func()) []func() {
	out := fs[:0:0]
	for _, f := range fs {
		if f != nil {
			out = append(out, f)
		}
	}
	return out
}
