package credit

import (
	"context"
	"sync"
	"testing"
	"time"
)

// Loops sharing a pool take its credits in turn: none is starved, although
// the loop whose credit was just released is the one Go tends to run first.
func TestSharedTakesTurns(t *testing.T) {
	pool := NewPool(2, Ramp{})
	pool.SetBudget(1)
	shared := NewShared(pool)
	var mu sync.Mutex
	counts := map[int]int{}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	var wg, held sync.WaitGroup
	for i := range 3 {
		q := NewPool(2, Ramp{})
		q.SetBudget(1)
		c := Both(q, shared)
		wg.Go(func() {
			for {
				n, err := c.Acquire(ctx, 64)
				if err != nil {
					return
				}
				mu.Lock()
				counts[i] += n
				mu.Unlock()
				for range n {
					held.Go(func() { time.Sleep(2 * time.Millisecond); c.Release(1) })
				}
			}
		})
	}
	wg.Wait()
	held.Wait()
	total := counts[0] + counts[1] + counts[2]
	for i := range 3 {
		if counts[i] < total/5 {
			t.Errorf("loop %d took %d of %d credits (%v): starved", i, counts[i], total, counts)
		}
	}
	if in, _, _ := pool.Snapshot(); in != 0 {
		t.Errorf("%d credits still taken", in)
	}
}

// An acquirer that gives up while waiting for its turn leaves the line
// without blocking the ones behind it.
func TestSharedLeaveWhileWaiting(t *testing.T) {
	pool := NewPool(1, Ramp{})
	pool.SetBudget(1)
	shared := NewShared(pool)
	if n, err := shared.Acquire(context.Background(), 1); n != 1 || err != nil {
		t.Fatal(n, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	first := make(chan error, 1)
	go func() { _, err := shared.Acquire(ctx, 1); first <- err }() // the head of the line, waiting for a credit
	time.Sleep(20 * time.Millisecond)
	second := make(chan int, 1)
	go func() { n, _ := shared.Acquire(context.Background(), 1); second <- n }()
	time.Sleep(20 * time.Millisecond)
	cancel()
	if err := <-first; err == nil {
		t.Fatal("cancelled acquire returned no error")
	}
	shared.Release(1)
	select {
	case n := <-second:
		if n != 1 {
			t.Errorf("second got %d", n)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the acquirer behind a cancelled one never got its turn")
	}
}
