// The middleware that carries one request from delivery to result.
//
// The middlewares share one *delivery per message, stored in the message's
// context by the first of them (recoverer). A middleware ends a request by
// returning finish(d, result): the result message the settler publishes to
// the queue's result destination before it acks the delivery. Returning an
// error makes the settler nack the delivery, which hands it back to the
// transport; that is reserved for shutdown and for failures to write a
// result or a retry, never for a request's own failure.

package pipeline

import (
	"context"
	"errors"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-io/sluice/core/dispatch"
	"github.com/sluice-io/sluice/core/metrics"
	"github.com/sluice-io/sluice/core/wire"
)

// errShutdown is the cancellation cause of requests still in flight when the
// drain timeout ends; such deliveries are handed back, not answered.
var errShutdown = errors.New("sluice is shutting down")

// outcome of one delivery, for metrics and logs.
type outcome int

const (
	// outcomeAnswered: a result was produced.
	outcomeAnswered outcome = iota
	// outcomeRequeued: re-queued for a retry or a gate deferral.
	outcomeRequeued
	// outcomeDeadLettered: kept in the dead-letter destination (no readable id).
	outcomeDeadLettered
	// outcomeHandedBack: nacked back to the transport unfinished.
	outcomeHandedBack
)

// delivery is the state of one message on its way through the middleware.
type delivery struct {
	// Queue is the queue the message came from.
	Queue *Queue
	// Msg is the Watermill message.
	Msg *message.Message
	// Req is the decoded request (nil until decoder ran, or when it failed).
	Req *wire.Request
	// Ctx bounds the work on the request: the pipeline's work context, the
	// request's deadline and its cancellation.
	Ctx context.Context
	// Received is when the delivery reached the handler.
	Received time.Time
	// Dispatched is when the HTTP call started (zero if it did not).
	Dispatched time.Time
	// Result is the result produced, if any.
	Result *wire.Result
	// outcome says how the delivery ended.
	Outcome outcome
	// Dispatch is the last gateway outcome.
	Dispatch dispatch.Outcome
	// DeadlineEnded says the request ended because its deadline passed,
	// whatever its result says (retries cut short answer with the last
	// response).
	DeadlineEnded bool
	// waited says the request waited in admission (a gate's Wait, or for a
	// worker of the lanes): its cancellation is checked again before the
	// dispatch (cancelRecheck).
	waited bool
	// afterSettle, when set, runs once the delivery is settled (the
	// evictor's count of the calls it took back).
	afterSettle func()
	// Pod is the base URL of the pod a gate placed the request on
	// (gate.Decision.Pod): its call goes there instead of to the queue's
	// gateway. "": the gateway.
	Pod string

	view       *metrics.Queue // the metrics view of Req, once decoded
	kept       bool           // Result was kept by an earlier delivery (wire.Request.KeptResult)
	resultCode string         // the code label the result is counted under once written
}

// afterSettle runs m's delivery's afterSettle hook, if any.
func afterSettle(m *message.Message) {
	if d := deliveryOf(m); d != nil && d.afterSettle != nil {
		d.afterSettle()
	}
}

type deliveryKey struct{}

// deliveryOf returns the message's delivery (nil outside the middleware chain).
func deliveryOf(m *message.Message) *delivery {
	d, _ := m.Context().Value(deliveryKey{}).(*delivery)
	return d
}

// finish records res as the delivery's result and returns the result message
// to publish. The result message carries the delivery's metadata, so a
// transport can fence the write with what it put there (a lease token).
func finish(d *delivery, res *wire.Result) []*message.Message {
	d.Result = res
	d.Outcome = outcomeAnswered
	out := message.NewMessage(d.Msg.UUID, res.Marshal())
	out.Metadata = d.Msg.Metadata
	out.SetContext(d.Msg.Context())
	return []*message.Message{out}
}

// fail finishes the delivery with an error result of code.
func fail(d *delivery, code wire.ErrorCode, text string) []*message.Message {
	return finish(d, wire.ErrorResult(d.Req, code, text))
}
