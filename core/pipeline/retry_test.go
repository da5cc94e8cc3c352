package pipeline

import (
	"testing"
	"time"
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
			d := p.backoff(tc.retries)
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
	if d := noJitter.backoff(3); d != 8*time.Second {
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
