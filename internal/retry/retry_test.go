package retry_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/sluice-io/sluice/internal/retry"
)

// next draws n waits from b.
func next(b backoff.BackOff, n int) []time.Duration {
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = b.NextBackOff()
	}
	return out
}

const ms = time.Millisecond

func TestDoubling(t *testing.T) {
	b := retry.Doubling(50*ms, time.Second)
	want := []time.Duration{50 * ms, 100 * ms, 200 * ms, 400 * ms, 800 * ms, time.Second, time.Second}
	if got := next(b, len(want)); !slices.Equal(got, want) {
		t.Fatalf("waits %v, want %v", got, want)
	}
	b.Reset()
	if got := next(b, 2); !slices.Equal(got, want[:2]) {
		t.Fatalf("after Reset: %v, want %v", got, want[:2])
	}
}

func TestLinear(t *testing.T) {
	b := &retry.Linear{Step: 20 * ms}
	want := []time.Duration{20 * ms, 40 * ms, 60 * ms, 80 * ms}
	if got := next(b, len(want)); !slices.Equal(got, want) {
		t.Fatalf("waits %v, want %v", got, want)
	}
	b.Reset()
	if got := next(b, 1); !slices.Equal(got, want[:1]) {
		t.Fatalf("after Reset: %v, want %v", got, want[:1])
	}
}

// TestWithRetry: the schedules drive backoff.Retry as they are (Retry
// resets them first, and MaxTries counts every attempt).
func TestWithRetry(t *testing.T) {
	b := retry.Doubling(time.Millisecond, 4*time.Millisecond)
	_ = next(b, 5) // Retry starts it again
	var waits []time.Duration
	tries := 0
	_, err := backoff.Retry(context.Background(), func() (int, error) {
		tries++
		return 0, errors.New("no")
	}, backoff.WithBackOff(b), backoff.WithMaxTries(4), backoff.WithNotify(func(_ error, d time.Duration) { waits = append(waits, d) }))
	if err == nil || tries != 4 || !slices.Equal(waits, []time.Duration{ms, 2 * ms, 4 * ms}) {
		t.Fatalf("err %v after %d tries, waits %v", err, tries, waits)
	}
}

// TestAfter: the failure the caller had counts as Retry's first attempt:
// Retry waits, then calls op; a nil first error calls op at once.
func TestAfter(t *testing.T) {
	first := errors.New("first")
	calls := 0
	op := func() (int, error) {
		calls++
		if calls < 2 {
			return 0, errors.New("again")
		}
		return 7, nil
	}
	var seen []error
	v, err := backoff.Retry(context.Background(), retry.After(first, op), backoff.WithBackOff(retry.Doubling(ms, ms)),
		backoff.WithNotify(func(err error, _ time.Duration) { seen = append(seen, err) }))
	if err != nil || v != 7 || calls != 2 || len(seen) != 2 || seen[0] != first {
		t.Fatalf("Retry: %d, %v after %d calls of op, notified %v", v, err, calls, seen)
	}
	calls = 1
	if v, err := retry.After(nil, op)(); err != nil || v != 7 || calls != 2 {
		t.Fatalf("nil first: %d, %v after %d calls", v, err, calls)
	}
}
