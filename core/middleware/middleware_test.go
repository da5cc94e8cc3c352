package middleware

import (
	"context"
	"errors"
	"testing"
	"time"

	msg "github.com/sluice-io/sluice/core/message"
	"github.com/sluice-io/sluice/core/transport"
)

func TestBackoffDoublesToCapWithJitter(t *testing.T) {
	p := RetryPolicy{}
	p.SetDefaults()
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		retries int
		centre  time.Duration
	}{{0, 2 * time.Second}, {1, 4 * time.Second}, {2, 8 * time.Second}, {4, 32 * time.Second}, {5, 60 * time.Second}, {50, 60 * time.Second}, {1000, 60 * time.Second}} {
		lo, hi := time.Duration(float64(tc.centre)*0.8), time.Duration(float64(tc.centre)*1.2)
		seen := map[time.Duration]bool{}
		for range 200 {
			d := p.Backoff(tc.retries)
			if d < lo || d > hi {
				t.Fatalf("retries %d: backoff %s outside [%s, %s]", tc.retries, d, lo, hi)
			}
			seen[d] = true
		}
		if len(seen) < 10 {
			t.Errorf("retries %d: only %d distinct delays: no jitter?", tc.retries, len(seen))
		}
	}
	noJitter := RetryPolicy{Base: time.Second, Max: 10 * time.Second, Jitter: -1}
	noJitter.SetDefaults()
	if d := noJitter.Backoff(3); d != 8*time.Second {
		t.Errorf("no jitter: %s, want 8s", d)
	}
}

func TestRetryPolicyValidate(t *testing.T) {
	for _, p := range []RetryPolicy{
		{Base: 2 * time.Second, Max: time.Second, Jitter: 0.1},
		{Base: time.Second, Max: time.Second, Jitter: 2},
		{Base: time.Second, Max: time.Second, MaxAttempts: -1},
	} {
		if p.Validate() == nil {
			t.Errorf("%+v accepted", p)
		}
	}
}

func TestInflightCancelByJobAndID(t *testing.T) {
	f := NewInflight()
	type entry struct {
		ctx  context.Context
		done func()
	}
	reg := func(id, job string) entry {
		ctx, cancel := context.WithCancelCause(context.Background())
		return entry{ctx, f.Register(&msg.Request{ID: id, Metadata: map[string]string{"job_id": job}}, cancel)}
	}
	a1, a2, b1 := reg("a1", "A"), reg("a2", "A"), reg("b1", "B")
	if n := f.Cancel(transport.Cancellation{JobID: "A"}); n != 2 {
		t.Fatalf("cancelled %d, want 2", n)
	}
	for _, e := range []entry{a1, a2} {
		if !errors.Is(context.Cause(e.ctx), ErrCancelled) {
			t.Errorf("cause %v, want ErrCancelled", context.Cause(e.ctx))
		}
	}
	if b1.ctx.Err() != nil {
		t.Error("job B cancelled with job A")
	}
	a1.done()
	a2.done()
	if n := f.Cancel(transport.Cancellation{RequestID: "b1"}); n != 1 || b1.ctx.Err() == nil {
		t.Errorf("cancel by id: %d", n)
	}
	b1.done()
	if f.Len() != 0 {
		t.Errorf("%d entries left", f.Len())
	}
	if n := f.Cancel(transport.Cancellation{JobID: "A"}); n != 0 {
		t.Errorf("cancelled %d finished requests", n)
	}
}
