// Package credit turns a gate's budget into an in-flight limit: a Pool of
// credits, one per request in flight. It is a leaf package: the gates set a
// pool's budget, the claim loop (core/transport) takes and returns credits,
// and neither needs the other.
package credit

import (
	"context"
	"math"
	"sync"
	"time"
)

// Ramp bounds how fast credits come back when a budget rises.
type Ramp struct {
	// Step is the most credits added per Interval (0: a tenth of the maximum, at least 1).
	Step int
	// Interval is the ramp's tick (default 50ms).
	Interval time.Duration
}

func (r *Ramp) setDefaults(max int) {
	if r.Step <= 0 {
		r.Step = int(math.Ceil(float64(max) / 10))
		if r.Step < 1 {
			r.Step = 1
		}
	}
	if r.Interval <= 0 {
		r.Interval = 50 * time.Millisecond
	}
}

// Pool is a queue's in-flight allowance. Its limit follows the gate's
// budget: ceil(max × budget), so any budget above zero lets at least one
// request through. A falling budget lowers the limit at once (requests in
// flight finish; no new ones start); a rising budget raises it by at most
// Ramp.Step per Ramp.Interval, so a gate that reopens over a
// deep backlog does not release a thundering herd. The first budget applies
// at once.
//
// The claim loop (core/transport) calls Acquire before it claims messages,
// claims at most what it was granted, gives back what it did not use with
// Release, and calls Release(1) when a delivered message is settled.
type Pool struct {
	max  int
	ramp Ramp
	now  func() time.Time

	mu        sync.Mutex
	target    int
	limit     int
	inflight  int
	lastRamp  time.Time
	hasBudget bool
	avail     chan struct{} // one token: "credits may be free, look again"
}

// NewPool returns credits for a queue whose limit at budget 1 is max.
// Until the first SetBudget the limit is 0.
func NewPool(max int, ramp Ramp) *Pool {
	if max < 1 {
		max = 1
	}
	ramp.setDefaults(max)
	return &Pool{max: max, ramp: ramp, now: time.Now, avail: make(chan struct{}, 1)}
}

// Max returns the limit at budget 1.
func (c *Pool) Max() int { return c.max }

// SetBudget sets the budget; values outside [0,1] are clamped.
func (c *Pool) SetBudget(b float64) {
	if b != b || b < 0 { // NaN or negative
		b = 0
	}
	if b > 1 {
		b = 1
	}
	target := int(math.Ceil(float64(c.max) * b))
	c.mu.Lock()
	c.target = target
	switch {
	case !c.hasBudget:
		c.limit = target
		c.hasBudget = true
	case target < c.limit:
		c.limit = target
	}
	c.lastRampIfIdle()
	c.mu.Unlock()
	c.signal()
}

// lastRampIfIdle starts the ramp clock when a rise begins. Caller holds mu.
func (c *Pool) lastRampIfIdle() {
	if c.limit >= c.target {
		c.lastRamp = time.Time{}
	} else if c.lastRamp.IsZero() {
		c.lastRamp = c.now()
	}
}

// advance moves the limit toward the target along the ramp and returns how
// long until the next step (0 when there is none). Caller holds mu.
func (c *Pool) advance() time.Duration {
	if c.limit >= c.target {
		return 0
	}
	now := c.now()
	if c.lastRamp.IsZero() {
		c.lastRamp = now
	}
	if steps := int(now.Sub(c.lastRamp) / c.ramp.Interval); steps > 0 {
		c.limit += steps * c.ramp.Step
		if c.limit >= c.target {
			c.limit = c.target
			c.lastRamp = time.Time{}
			return 0
		}
		c.lastRamp = c.lastRamp.Add(time.Duration(steps) * c.ramp.Interval)
	}
	return c.lastRamp.Add(c.ramp.Interval).Sub(now)
}

// TryAcquire takes up to want free credits without waiting and returns how
// many it took.
func (c *Pool) TryAcquire(want int) int {
	c.mu.Lock()
	n, _ := c.take(want)
	c.mu.Unlock()
	return n
}

// take is TryAcquire under mu; it also returns the wait until the ramp's next step.
func (c *Pool) take(want int) (int, time.Duration) {
	next := c.advance()
	free := c.limit - c.inflight
	if free <= 0 || want <= 0 {
		return 0, next
	}
	if want > free {
		want = free
	}
	c.inflight += want
	if free > want {
		c.signal()
	}
	return want, next
}

// Acquire waits until at least one credit is free and takes up to want of
// them. It returns ctx's error when ctx ends first.
func (c *Pool) Acquire(ctx context.Context, want int) (int, error) {
	if want <= 0 {
		want = 1
	}
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		c.mu.Lock()
		n, next := c.take(want)
		c.mu.Unlock()
		if n > 0 {
			return n, nil
		}
		var tick <-chan time.Time
		if next > 0 {
			if timer == nil {
				timer = time.NewTimer(next)
			} else {
				timer.Reset(next)
			}
			tick = timer.C
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-c.avail:
		case <-tick:
		}
	}
}

// Release gives back n credits (unused grants, or finished messages).
func (c *Pool) Release(n int) {
	if n <= 0 {
		return
	}
	c.mu.Lock()
	c.inflight -= n
	if c.inflight < 0 {
		c.inflight = 0
	}
	c.mu.Unlock()
	c.signal()
}

func (c *Pool) signal() {
	select {
	case c.avail <- struct{}{}:
	default:
	}
}

// Snapshot reports the in-flight count, the current limit and the target the
// limit is ramping toward.
func (c *Pool) Snapshot() (inflight, limit, target int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.advance()
	return c.inflight, c.limit, c.target
}
