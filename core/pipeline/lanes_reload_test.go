package pipeline

import (
	"context"
	"testing"
)

// A queue registered again in the lanes (a reload changed it) keeps the
// workers its requests hold: releasing them later does not drive its count
// below zero, and its new max_concurrency bounds what starts.
func TestLanesSourceReRegistered(t *testing.T) {
	l := newLanes(4, nil)
	l.addSource("q", 2).SetBudget(1)
	never := make(chan struct{})
	for range 2 {
		if _, err := l.acquire(context.Background(), 0, "q", never); err != nil {
			t.Fatal(err)
		}
	}
	f := l.addSource("q", 3) // changed: max 2 → 3
	f.SetBudget(1)
	l.mu.Lock()
	src := *l.sources["q"]
	l.mu.Unlock()
	if src.running != 2 || src.max != 3 || src.limit != 3 {
		t.Fatalf("re-registered source %+v, want running 2, max 3, limit 3", src)
	}
	l.release("q")
	l.release("q")
	l.mu.Lock()
	running, free := l.sources["q"].running, l.free
	l.mu.Unlock()
	if running != 0 || free != 4 {
		t.Errorf("after the old requests ended: running %d, free %d, want 0 and 4", running, free)
	}
}
