package transport

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-io/sluice/core/credit"
	"github.com/sluice-io/sluice/internal/mutant"
)

// Settling without a goroutine per message.
//
// A Watermill subscriber learns that a delivery was acked or nacked by
// waiting on its Acked and Nacked channels, which costs one goroutine per
// message in flight. The claim loop instead attaches a settle hook to every
// message it delivers; the core settles each delivery with Ack or Nack
// below, which run the hook once (Source.Settle, then the credit goes back
// to the pool) and then ack or nack the message as usual. Consumers of a
// subscriber from NewSubscriber outside the core must settle the same way.

type settleKey struct{}

type settleHook struct {
	done    atomic.Bool
	freed   atomic.Bool // the credit went back before the settle (FreeCredit)
	src     Source
	pool    credit.Credits
	claimed time.Time
}

// onSettle makes m's first Ack or Nack settle it with src and free its
// credit in pool; claimed is when its batch was claimed.
func onSettle(m *message.Message, src Source, pool credit.Credits, claimed time.Time) {
	m.SetContext(context.WithValue(m.Context(), settleKey{}, &settleHook{src: src, pool: pool, claimed: claimed}))
}

// Claimed returns when the claim loop claimed m (zero for a message that
// did not come from NewSubscriber).
func Claimed(m *message.Message) time.Time {
	if h, ok := m.Context().Value(settleKey{}).(*settleHook); ok {
		return h.claimed
	}
	return time.Time{}
}

// settle runs m's settle hook, once.
func settle(m *message.Message, acked bool) {
	if h, ok := m.Context().Value(settleKey{}).(*settleHook); ok && h.done.CompareAndSwap(false, true) {
		h.src.Settle(m, acked)
		if !acked && mutant.On(mutant.CreditNotReturnedOnHandBack) {
			return // planted: a handed-back delivery keeps its credit
		}
		if h.freed.CompareAndSwap(false, true) {
			h.pool.Release(1)
		}
	}
}

// FreeCredit gives m's credit back to its pool before m is settled, once:
// its gateway call is over and only its result remains to be written. The
// settle then frees nothing more. It reports whether a credit was freed.
func FreeCredit(m *message.Message) bool {
	if h, ok := m.Context().Value(settleKey{}).(*settleHook); ok && !h.done.Load() && h.freed.CompareAndSwap(false, true) {
		h.pool.Release(1)
		return true
	}
	return false
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
