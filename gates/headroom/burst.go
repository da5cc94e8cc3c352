package headroom

import (
	"math"
	"time"
)

// Burst tells the gate when the other traffic is in a burst and, while it
// is, how fast the queue's limit may grow. It is the gate's only state
// beyond its readings, kept apart so that the interactive-frontier
// benchmark runs the gate's own rule on its virtual clock.
//
// A burst starts with a reading whose others reach Threshold and lasts
// until no reading has for Window. Outside a burst the limit follows the
// readings at once. In a burst it falls at once but rises above what the
// queue has in flight by at most one request per Growth: every batch
// request that starts is a prefill that lengthens the pool's next steps,
// and in a burst those are the steps interactive first tokens wait for.
//
// The zero Burst (Threshold 0) never sees a burst. Burst is not safe for
// concurrent use; the gate calls it under its lock.
type Burst struct {
	// Threshold: the others of one reading that start or extend a burst
	// (0: off).
	Threshold int
	// Window is how long a burst lasts after the last reading at or over
	// Threshold.
	Window time.Duration
	// Growth is the shortest time between two rises of the limit in a burst.
	Growth time.Duration

	hot, grew time.Time // the last reading at or over Threshold; the last rise
	seen      bool      // hot is set
}

// Observe records one reading's others at now and reports whether the
// traffic is in a burst.
func (b *Burst) Observe(now time.Time, others int) bool {
	if b.Threshold <= 0 {
		return false
	}
	if others >= b.Threshold {
		b.hot, b.seen = now, true
	}
	return b.seen && now.Sub(b.hot) <= b.Window
}

// Cap bounds a limit of allowed requests, in a burst, to the queue's own
// in flight, plus one when Growth has passed since the last rise; outside
// a burst it returns allowed.
func (b *Burst) Cap(now time.Time, burst bool, allowed, own int) int {
	if !burst || allowed <= own {
		return allowed
	}
	if !b.grew.IsZero() && now.Sub(b.grew) < b.Growth {
		return own
	}
	b.grew = now
	return own + 1
}

// Rule is the gate's formula for one reading, kept apart (as Burst is) so
// that the interactive-frontier benchmark replays the gate's own rule:
//
//	keep    = (burst or no burst rule ? Reserve : IdleReserve) + ceil(ReserveShare × held)
//	allowed = max(0, Seats − keep − held), at most kvCap (≥ 0), then Burst.Cap
//
// Rule is not safe for concurrent use; the gate calls it under its lock.
type Rule struct {
	Seats, Reserve, IdleReserve int
	ReserveShare                float64
	Burst                       Burst
}

// Apply computes one reading at now: others and held (its peak within the
// hold) are the traffic sluice does not send, own what the queue has in
// flight, kvCap the KV-cache cap (-1: none). It reports whether the
// reading fell in a burst, the seats kept free and the limit.
func (r *Rule) Apply(now time.Time, others, held, own, kvCap int) (burst bool, keep, allowed int) {
	burst = r.Burst.Observe(now, others)
	reserve := r.Reserve
	if r.Burst.Threshold > 0 && !burst {
		reserve = r.IdleReserve
	}
	keep = reserve + int(math.Ceil(r.ReserveShare*float64(held)))
	allowed = max(0, r.Seats-keep-held)
	if kvCap >= 0 {
		allowed = min(allowed, kvCap)
	}
	return burst, keep, r.Burst.Cap(now, burst, allowed, own)
}
