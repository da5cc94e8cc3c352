package credit

import (
	"context"
	"sync"
	"testing"
	"time"
)

// fakeClock drives the ramp deterministically.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func TestPoolLimitIsCeilOfBudget(t *testing.T) {
	for _, tc := range []struct {
		max    int
		budget float64
		want   int
	}{
		{100, 1, 100}, {100, 0, 0}, {100, 0.001, 1}, {100, 0.5, 50}, {100, 0.501, 51},
		{8, 0.05, 1}, {64, 2, 64}, {64, -1, 0},
	} {
		c := NewPool(tc.max, Ramp{})
		c.SetBudget(tc.budget)
		if got := c.TryAcquire(1 << 20); got != tc.want {
			t.Errorf("max %d budget %v: granted %d, want %d", tc.max, tc.budget, got, tc.want)
		}
	}
}

func TestPoolReleaseAndAcquireWait(t *testing.T) {
	c := NewPool(2, Ramp{})
	c.SetBudget(1)
	if n := c.TryAcquire(5); n != 2 {
		t.Fatalf("granted %d, want 2", n)
	}
	got := make(chan int, 1)
	go func() {
		n, _ := c.Acquire(context.Background(), 3)
		got <- n
	}()
	select {
	case n := <-got:
		t.Fatalf("Acquire returned %d with no credit free", n)
	case <-time.After(50 * time.Millisecond):
	}
	c.Release(1)
	select {
	case n := <-got:
		if n != 1 {
			t.Fatalf("granted %d, want 1", n)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Acquire did not wake on Release")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.Acquire(ctx, 1); err == nil {
		t.Fatal("Acquire on a cancelled context succeeded with no credit free")
	}
}

func TestPoolFallAtOnceRiseAlongRamp(t *testing.T) {
	clk := &fakeClock{now: time.Unix(1000, 0)}
	c := NewPool(100, Ramp{Step: 10, Interval: 100 * time.Millisecond})
	c.now = clk.Now
	c.SetBudget(1) // first budget applies at once
	if _, limit, _ := c.Snapshot(); limit != 100 {
		t.Fatalf("initial limit %d, want 100", limit)
	}
	c.SetBudget(0) // closes at once
	if _, limit, _ := c.Snapshot(); limit != 0 {
		t.Fatalf("limit after close %d, want 0", limit)
	}
	c.SetBudget(1) // reopens along the ramp
	if n := c.TryAcquire(100); n != 0 {
		t.Fatalf("granted %d right after reopening, want 0 before the first step", n)
	}
	granted := 0
	for step := 1; step <= 10; step++ {
		clk.Add(100 * time.Millisecond)
		granted += c.TryAcquire(100)
		if granted > 10*step {
			t.Fatalf("step %d: %d granted, ramp allows %d", step, granted, 10*step)
		}
		inflight, limit, _ := c.Snapshot()
		if inflight > limit {
			t.Fatalf("in flight %d above limit %d", inflight, limit)
		}
	}
	if granted != 100 {
		t.Fatalf("after the ramp %d granted, want 100", granted)
	}
}

func TestPoolConcurrentNeverExceedLimit(t *testing.T) {
	c := NewPool(7, Ramp{})
	c.SetBudget(1)
	var mu sync.Mutex
	held, peak := 0, 0
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				n, err := c.Acquire(context.Background(), 3)
				if err != nil {
					return
				}
				mu.Lock()
				held += n
				peak = max(peak, held)
				mu.Unlock()
				mu.Lock()
				held -= n
				mu.Unlock()
				c.Release(n)
			}
		}()
	}
	wg.Wait()
	if peak > 7 {
		t.Fatalf("peak %d above the limit 7", peak)
	}
}
