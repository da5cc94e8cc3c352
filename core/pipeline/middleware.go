package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-io/sluice/core/dispatch"
	"github.com/sluice-io/sluice/core/metrics"
	"github.com/sluice-io/sluice/core/resume"
	"github.com/sluice-io/sluice/core/transform"
	"github.com/sluice-io/sluice/core/wire"
)

// deadLetterFunc keeps a message that has no readable id.
type deadLetterFunc func(ctx context.Context, d *delivery, reason string) error

// recoverer starts the chain: it creates the delivery (bound to work, the
// pipeline's context that ends when the drain timeout does) and turns a panic
// into an INFERENCE_ERROR result, or a dead letter when no request was
// decoded, so a poison message cannot loop.
func recoverer(q *Queue, work context.Context, deadLetter deadLetterFunc, log *slog.Logger) message.HandlerMiddleware {
	return func(next message.HandlerFunc) message.HandlerFunc {
		return func(m *message.Message) (out []*message.Message, err error) {
			d := &delivery{Queue: q, Msg: m, Ctx: work, Received: time.Now()}
			m.SetContext(context.WithValue(m.Context(), deliveryKey{}, d))
			defer func() {
				r := recover()
				if r == nil {
					return
				}
				log.Error("panic while handling a request", "queue", q.ID, "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
				if d.Req != nil {
					out, err = fail(d, wire.CodeInferenceError, fmt.Sprintf("internal error: %v", r)), nil
					return
				}
				d.Outcome = outcomeDeadLettered
				out, err = nil, deadLetter(context.WithoutCancel(work), d, fmt.Sprintf("panic: %v", r))
			}()
			return next(m)
		}
	}
}

// decoder decodes the request. A message with a readable id but invalid
// content gets an INVALID_REQUEST result; one without goes to deadLetter.
func decoder(deadLetter deadLetterFunc, log *slog.Logger) message.HandlerMiddleware {
	return func(next message.HandlerFunc) message.HandlerFunc {
		return func(m *message.Message) ([]*message.Message, error) {
			d := deliveryOf(m)
			req, err := wire.Decode(m.Payload)
			if err == nil {
				for k, v := range d.Queue.Labels { // the queue's labels, unless the request carries its own
					if _, ok := req.Labels[k]; !ok {
						req.SetLabel(k, v)
					}
				}
				d.Req = req
				if req.KeptResult != nil {
					// Answered by an earlier delivery whose result could not be
					// written: write that result, do not call the gateway again.
					if res, rerr := wire.DecodeResult(req.KeptResult); rerr == nil && res.ID == req.ID {
						out := finish(d, res)
						d.kept = true
						return out, nil
					}
					log.Warn("ignoring a kept result that does not decode or answers another id; handling the request anew", "queue", d.Queue.ID, "id", req.ID)
				}
				return next(m)
			}
			de, ok := wire.AsDecodeError(err)
			if ok && de.ID != "" {
				d.Req = &wire.Request{ID: de.ID, Metadata: de.Metadata}
				return finish(d, de.Result()), nil
			}
			log.Warn("dead-lettering a message without a readable id", "queue", d.Queue.ID, "err", err)
			if err := deadLetter(context.WithoutCancel(d.Ctx), d, err.Error()); err != nil {
				return nil, fmt.Errorf("dead-letter: %w", err)
			}
			d.Outcome = outcomeDeadLettered
			return nil, nil
		}
	}
}

// limiter answers INVALID_REQUEST, naming the limit, for a request over one
// of limits (wire.Limits.Check), before anything else is done with it.
func limiter(limits wire.Limits) message.HandlerMiddleware {
	return func(next message.HandlerFunc) message.HandlerFunc {
		return func(m *message.Message) ([]*message.Message, error) {
			d := deliveryOf(m)
			if err := limits.Check(d.Req); err != nil {
				return fail(d, wire.CodeInvalidRequest, err.Error()), nil
			}
			return next(m)
		}
	}
}

// deadlineCheck answers DEADLINE_EXCEEDED for a request whose deadline passed
// before dispatch. It adds no context of its own: the steps that can block
// are bounded by the deadline where they run (the HTTP call by
// dispatch.Client.Do, which also tells a deadline from a timeout; the
// cancellation check and the admission hook by boundedByDeadline), which
// saves a timer and a context per request.
func deadlineCheck() message.HandlerMiddleware {
	return func(next message.HandlerFunc) message.HandlerFunc {
		return func(m *message.Message) ([]*message.Message, error) {
			d := deliveryOf(m)
			if d.Req.Expired(time.Now()) {
				return fail(d, wire.CodeDeadlineExceeded, "deadline exceeded"), nil // upstream's text
			}
			return next(m)
		}
	}
}

// validator runs the transforms' checks once per delivery, before the gates:
// a request they refuse is answered INVALID_REQUEST, as upstream.
func validator(transforms *transform.Chain) message.HandlerMiddleware {
	return func(next message.HandlerFunc) message.HandlerFunc {
		return func(m *message.Message) ([]*message.Message, error) {
			d := deliveryOf(m)
			if err := transforms.Validate(d.Ctx, d.Req.Payload, d.Req.Metadata, d.Req.Deadline); err != nil {
				return fail(d, wire.CodeInvalidRequest, "Failed to validate request for transform: "+err.Error()), nil
			}
			return next(m)
		}
	}
}

// answer is the result carrying the gateway's response as it came.
func answer(req *wire.Request, o dispatch.Outcome) *wire.Result {
	return &wire.Result{ID: req.ID, StatusCode: o.StatusCode, Payload: string(o.Body), Metadata: req.Metadata}
}

// Dispatcher sends a request to the gateway; *dispatch.Client implements
// it. o carries a transformed body and the headers that win over the
// request's (the priority lane).
type Dispatcher interface {
	DoWith(ctx context.Context, t dispatch.Target, req *wire.Request, o dispatch.Overrides) dispatch.Outcome
}

// dispatchHandler is the handler at the end of the chain: one HTTP call, whose
// outcome the dispatch client classified (the one place that tells a
// deadline from a cancellation or a timeout); here each class becomes what
// the request gets. The transforms (nil: none) rewrite the body of each
// attempt; a failure is INVALID_REQUEST, as upstream.
func dispatchHandler(client Dispatcher, transforms *transform.Chain) message.HandlerFunc {
	return func(m *message.Message) ([]*message.Message, error) {
		d := deliveryOf(m)
		var ov dispatch.Overrides
		if p := d.Queue.priority; p != nil {
			ov.Headers = p.headers[p.lane(d.Req)]
		}
		if transforms != nil && transforms.Len() > 0 {
			body, ct, handled, err := transforms.Apply(d.Ctx, d.Req.Payload, d.Req.Metadata)
			if err != nil {
				return fail(d, wire.CodeInvalidRequest, "Failed to transform request body: "+err.Error()), nil
			}
			if handled {
				ov.Body, ov.ContentType = body, ct
			}
		}
		var rc *resume.Call
		if d.Queue.Resume && ov.Body == nil {
			var answered []byte
			if rc, answered = resumeCall(d); answered != nil {
				// the earlier attempts made every token allowed
				return finish(d, answer(d.Req, dispatch.Outcome{Class: dispatch.Success, StatusCode: http.StatusOK, Body: answered})), nil
			}
			if rc != nil {
				ov.Body, ov.ReadBody = rc.Body(), rc.Read
			}
		}
		mq := d.mq()
		mq.Inflight.Inc()
		mq.Dispatched.Inc()
		d.Dispatched = time.Now()
		ctx, req, end := httpSpan(d)
		untrack := func() {}
		if ev := d.Queue.evictor; ev != nil {
			ctx, untrack = ev.track(d, ctx)
		}
		o := client.DoWith(ctx, d.Queue.Target, req, ov)
		untrack()
		if rc != nil && o.Class == dispatch.Cancelled && errors.Is(o.Err, errEvicted) {
			// keep what the aborted call made for the next attempt
			s := rc.State()
			d.Req.SetLabel(resume.StateLabel, s.Encode())
			if made := s.Tokens - rc.Prior().Tokens; made > 0 {
				d.mq().Resumed.Add(float64(made))
			}
		}
		mq.InferenceMs.Observe(metrics.Millis(time.Since(d.Dispatched)))
		mq.Inflight.Dec()
		end(o.StatusCode)
		d.Dispatch = o
		if o.StatusCode == http.StatusTooManyRequests {
			mq.Shedded.Inc()
		}
		if o.DroppedReason != "" {
			mq.GatewayDropped.Inc()
		}
		if o.StatusCode >= 200 && o.StatusCode < 300 {
			if in, out, ok := dispatch.ParseUsage(o.Body); ok {
				mq.TokensIn.Add(float64(in))
				mq.TokensOut.Add(float64(out))
			}
		}
		switch o.Class {
		case dispatch.Success:
			return finish(d, answer(d.Req, o)), nil
		case dispatch.Fatal:
			switch {
			case errors.Is(o.Err, dispatch.ErrInvalidEndpoint):
				return fail(d, wire.CodeInvalidRequest, o.Err.Error()), nil
			case errors.Is(o.Err, dispatch.ErrResponseTooLarge):
				return fail(d, wire.CodeInferenceError, fmt.Sprintf("%v (limit: dispatch.max_response_bytes)", o.Err)), nil
			case o.StatusCode == 0:
				return fail(d, wire.CodeInferenceError, fmt.Sprint(o.Err)), nil
			}
			// A non-retryable answer (4xx other than 429), empty body or not:
			// passed on as it came, without an error code, as upstream does.
			return finish(d, answer(d.Req, o)), nil
		case dispatch.DeadlineExceeded:
			return fail(d, wire.CodeDeadlineExceeded, "deadline exceeded"), nil // upstream's text
		case dispatch.Cancelled:
			// Err is the cause the call was cancelled with.
			switch {
			case errors.Is(o.Err, errCancelled):
				return fail(d, wire.CodeCancelled, "cancelled during dispatch"), nil
			case errors.Is(o.Err, errShutdown):
				return nil, errShutdown
			case errors.Is(o.Err, errEvicted):
				return nil, errEvicted // retrier re-queues it
			}
		}
		return nil, &retryableError{Outcome: o}
	}
}

// resumeCall prepares d's attempt under Queue.Resume: the call that
// streams and continues from the request's StateLabel, or nil when the
// request cannot be resumed (it is sent as it is); answered is the final
// answer when the earlier attempts already made every token allowed. A
// label that does not decode is dropped: the request starts again.
func resumeCall(d *delivery) (rc *resume.Call, answered []byte) {
	prior, err := resume.Decode(d.Req.Label(resume.StateLabel))
	if err != nil {
		// only sluice writes the label: a damaged one costs the tokens it
		// held, not the request
		prior = resume.State{}
	}
	rc, ok := resume.Start(d.Req.Payload, prior)
	if !ok {
		return nil, nil
	}
	if b, done := rc.Finished(); done {
		return nil, b
	}
	return rc, nil
}
