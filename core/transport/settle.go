package transport

import (
	"context"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Settling without a goroutine per message.
//
// A Watermill subscriber learns that a delivery was acked or nacked by
// waiting on its Acked and Nacked channels, which costs one goroutine per
// message in flight. A transport may instead attach a hook with OnSettle
// before it hands the message out; the core then settles every delivery
// with Ack or Nack below, which run the hook (once) and then ack or nack the
// message as usual. Consumers of such a transport outside the core must
// settle the same way.

type settleKey struct{}

type settleHook struct {
	done atomic.Bool
	fn   func(acked bool)
}

// OnSettle makes fn run once when m is settled through Ack or Nack.
func OnSettle(m *message.Message, fn func(acked bool)) {
	m.SetContext(context.WithValue(m.Context(), settleKey{}, &settleHook{fn: fn}))
}

func settle(m *message.Message, acked bool) {
	if h, ok := m.Context().Value(settleKey{}).(*settleHook); ok && h.done.CompareAndSwap(false, true) {
		h.fn(acked)
	}
}

// Ack runs m's settle hook, if any, and acks m.
func Ack(m *message.Message) {
	settle(m, true)
	m.Ack()
}

// Nack runs m's settle hook, if any, and nacks m.
func Nack(m *message.Message) {
	settle(m, false)
	m.Nack()
}
