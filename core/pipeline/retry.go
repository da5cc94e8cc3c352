package pipeline

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-io/sluice/core/dispatch"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
)

// Retries: a retryable failure re-queues the request with a delay (never a
// sleep in a worker), through the transport's native delay or the generic
// delay queue; the attempt count travels with the message.

// requeuer puts a delivery back for later with new bytes (which carry the
// attempt count). The pipeline backs it with the transport's native delay or
// with its generic DelayQueue.
type requeuer func(ctx context.Context, d *delivery, payload []byte, due time.Time) error

// RetryPolicy is the backoff of retryable failures.
type RetryPolicy struct {
	// Base is the first delay (default 2s); it doubles per attempt.
	Base time.Duration
	// Max caps the delay (default 60s).
	Max time.Duration
	// Jitter spreads each delay by ±Jitter×delay (default 0.2; negative: none).
	Jitter float64
	// MaxAttempts ends retries after that many attempts (0: only the deadline does).
	MaxAttempts int
}

// SetDefaults fills zero fields.
func (p *RetryPolicy) SetDefaults() {
	if p.Base <= 0 {
		p.Base = 2 * time.Second
	}
	if p.Max <= 0 {
		p.Max = 60 * time.Second
	}
	if p.Jitter == 0 {
		p.Jitter = 0.2
	}
	if p.Jitter < 0 {
		p.Jitter = 0
	}
}

// Validate reports an unusable policy.
func (p RetryPolicy) Validate() error {
	switch {
	case p.Max < p.Base:
		return fmt.Errorf("retry: max backoff %s is below the base %s", p.Max, p.Base)
	case p.Jitter > 1:
		return fmt.Errorf("retry: jitter %v is above 1", p.Jitter)
	case p.MaxAttempts < 0:
		return fmt.Errorf("retry: max attempts %d is negative", p.MaxAttempts)
	}
	return nil
}

// backoff returns the delay before the retry that follows `retries` earlier
// retries: Base×2^retries capped at Max, spread by the jitter. It is a pure
// function of the attempt count, which travels with the message, so any
// replica computes the same schedule.
func (p RetryPolicy) backoff(retries int) time.Duration {
	d := float64(p.Base) * math.Pow(2, float64(min(retries, 62)))
	if d > float64(p.Max) {
		d = float64(p.Max)
	}
	if p.Jitter > 0 {
		d *= 1 + p.Jitter*(2*rand.Float64()-1)
	}
	return time.Duration(d)
}

// retryableError is returned by the dispatch handler for a failure worth
// retrying; retrier turns it into a delayed re-queue or a final result.
type retryableError struct{ Outcome dispatch.Outcome }

func (e *retryableError) Error() string {
	if e.Outcome.StatusCode != 0 {
		return "gateway returned " + strconv.Itoa(e.Outcome.StatusCode)
	}
	if e.Outcome.Err != nil {
		return e.Outcome.Err.Error()
	}
	return "retryable failure"
}

// retrier re-queues a request after a retryable failure with the policy's
// backoff (a longer Retry-After wins), never past its deadline: a retry
// that could not happen before the deadline ends as DEADLINE_EXCEEDED, one
// past MaxAttempts as INFERENCE_ERROR with the last response.
func retrier(p RetryPolicy, requeue requeuer) message.HandlerMiddleware {
	return func(next message.HandlerFunc) message.HandlerFunc {
		return func(m *message.Message) ([]*message.Message, error) {
			out, err := next(m)
			if errors.Is(err, errEvicted) {
				return evicted(m, requeue)
			}
			var re *retryableError
			if err == nil || !errors.As(err, &re) {
				return out, err
			}
			d := deliveryOf(m)
			attempts := d.Req.RetryCount + 1
			if p.MaxAttempts > 0 && attempts >= p.MaxAttempts {
				return finish(d, lastAnswer(d.Req, re.Outcome, wire.CodeInferenceError, fmt.Sprintf("gave up after %d attempts: %s", attempts, re.Error()))), nil
			}
			wait := p.backoff(d.Req.RetryCount)
			if re.Outcome.RetryAfter > wait {
				wait = re.Outcome.RetryAfter
			}
			due := time.Now().Add(wait)
			if !due.Before(d.Req.Deadline) {
				d.DeadlineEnded = true
				return finish(d, lastAnswer(d.Req, re.Outcome, wire.CodeDeadlineExceeded, fmt.Sprintf("no time left to retry before the deadline (after %d attempts; last: %s)", attempts, re.Error()))), nil
			}
			payload, perr := requeuePayload(d, attempts)
			if perr != nil {
				return fail(d, wire.CodeInvalidRequest, "cannot re-encode for retry: "+perr.Error()), nil
			}
			if err := requeue(context.WithoutCancel(d.Ctx), d, payload, due); err != nil {
				return nil, fmt.Errorf("retry %s: %w", d.Req.ID, err)
			}
			d.mq().Retries.Inc()
			d.Outcome = outcomeRequeued
			return nil, nil
		}
	}
}

// evicted re-queues a request the evictor took back, due now with its
// attempt count unchanged: it goes back in its deadline order and runs
// again when the budget lets it. Its deadline still ends it (at the next
// claim, as any request's).
func evicted(m *message.Message, requeue requeuer) ([]*message.Message, error) {
	d := deliveryOf(m)
	d.Req.SetLabel(EvictionsLabel, strconv.Itoa(evictions(d.Req)+1))
	payload, err := requeuePayload(d, d.Req.RetryCount)
	if err != nil {
		return fail(d, wire.CodeInvalidRequest, "cannot re-encode after eviction: "+err.Error()), nil
	}
	if err := requeue(context.WithoutCancel(d.Ctx), d, payload, time.Now()); err != nil {
		return nil, fmt.Errorf("re-queue evicted %s: %w", d.Req.ID, err)
	}
	d.Outcome = outcomeRequeued
	return nil, nil
}

// requeuePayload is the message's bytes for a re-queue: retry count n and
// the request's labels as they are now (a gate's classification included).
func requeuePayload(d *delivery, n int) ([]byte, error) {
	return wire.WithEnvelope(d.Msg.Payload, n, d.Req.Labels)
}

// lastAnswer ends a request whose retries ran out: with the gateway's last
// response as it came (status and body, no error code), as upstream answers,
// or, when no response came back, with an error result of code.
func lastAnswer(req *wire.Request, o dispatch.Outcome, code wire.ErrorCode, text string) *wire.Result {
	if o.StatusCode != 0 {
		return answer(req, o)
	}
	return wire.ErrorResult(req, code, text)
}

// requeue re-queues through the transport, or through the generic delay queue.
func (p *Pipeline) requeue(ctx context.Context, d *delivery, payload []byte, due time.Time) error {
	if rq, ok := p.cfg.Transport.(transport.Requeuer); ok {
		return rq.Requeue(ctx, d.Queue.Queue, d.Msg, payload, due)
	}
	p.delay.add(d.Queue.Queue, payload, due)
	return nil
}
