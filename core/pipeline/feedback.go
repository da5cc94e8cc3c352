package pipeline

import (
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-io/sluice/core/gate"
)

// observed runs the rest of the chain for an admitted request, then hands
// the gateway's answer to the gates that admitted it and observe answers
// (gate.Decision.Observe: the queue's gate, then the pool's), once, before
// their reservations are given back. A request that ended before its HTTP
// call is not observed.
func observed(d *delivery, next message.HandlerFunc, m *message.Message, queue, pool func(gate.Feedback)) ([]*message.Message, error) {
	out, err := next(m)
	if (queue == nil && pool == nil) || d.Dispatched.IsZero() {
		return out, err
	}
	o := &d.Dispatch
	fb := gate.Feedback{Sent: d.Dispatched, StatusCode: o.StatusCode, Header: o.Header, RetryAfter: o.RetryAfter, Err: o.Err}
	if queue != nil {
		queue(fb)
	}
	if pool != nil {
		pool(fb)
	}
	return out, err
}
