package headroom

import "time"

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
