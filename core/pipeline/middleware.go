package pipeline

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

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
// cancellation checks by cancelledNow; admission by its bound), which saves
// a timer and a context per request.
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
