// Package retry holds the backoff schedules of sluice's retry loops, as
// github.com/cenkalti/backoff/v5 BackOffs: a loop that retries one
// operation hands one to backoff.Retry (with WithMaxTries,
// WithMaxElapsedTime and WithNotify for its bounds and its log line); a
// loop that runs for good and only slows down after a failure (a claim or
// fetch loop), or a supervisor that schedules the next restart, calls
// NextBackOff after each failure and Reset after each success.
//
// The schedules have no jitter: each loop waits exactly what it waited
// when it was written by hand. Use the library's ExponentialBackOff with a
// RandomizationFactor where replicas must not retry in step.
package retry

import (
	"time"

	"github.com/cenkalti/backoff/v5"
)

// Doubling returns the schedule first, 2×first, 4×first, ... capped at
// limit; Reset starts it again at first.
func Doubling(first, limit time.Duration) *backoff.ExponentialBackOff {
	return &backoff.ExponentialBackOff{InitialInterval: first, Multiplier: 2, MaxInterval: limit}
}

// Linear is the schedule Step, 2×Step, 3×Step, ... without a cap: for
// short retries of a race that clears by itself (two writers creating one
// table). Its zero value with Step set is ready; it is not safe for
// concurrent use.
type Linear struct {
	// Step is the first wait and the increment of every further one.
	Step time.Duration
	n    int
}

var _ backoff.BackOff = (*Linear)(nil)

// NextBackOff returns the next wait.
func (l *Linear) NextBackOff() time.Duration {
	l.n++
	return time.Duration(l.n) * l.Step
}

// Reset starts the schedule again at Step.
func (l *Linear) Reset() { l.n = 0 }

// After returns op as an operation for backoff.Retry whose first call
// returns first, a failure of op the caller already had, without calling
// op: Retry then waits its first backoff (and reports first through
// WithNotify) before it calls op. It lets a loop try once outside Retry,
// the common case that succeeds with no backoff state at all, and hand
// only a failure to Retry with the schedule it had: the wait after the
// first failure included.
func After[T any](first error, op backoff.Operation[T]) backoff.Operation[T] {
	return func() (T, error) {
		if first != nil {
			err := first
			first = nil
			var zero T
			return zero, err
		}
		return op()
	}
}
