package transport

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-io/sluice/core/credit"
)

// A busy queue's loop claims its Prefetch ahead of its one credit, hands
// them on in order as the credit frees, and hands them back when no credit
// frees for PrefetchHold.
func TestPrefetch(t *testing.T) {
	workers := credit.NewPool(1, credit.Ramp{})
	workers.SetBudget(1)
	queue := credit.NewPool(1, credit.Ramp{})
	queue.SetBudget(1)
	src := &countingSource{modelSource: &modelSource{claimed: map[string]bool{}, wake: make(chan struct{}, 1), ahead: 2}, batch: 8}
	out := subscribeOne(t, src, queue, workers)
	src.put("a", "b", "c", "d", "e")
	next := func() *message.Message {
		t.Helper()
		select {
		case m := <-out:
			return m
		case <-time.After(10 * time.Second):
			t.Fatal("nothing delivered in 10 s")
			return nil
		}
	}
	Ack(next()) // the first claim asks for the one credit: it comes back full
	m := next() // the next claims two more ahead
	if got := src.inHand(); got != 3 {
		t.Fatalf("claimed and not settled: %d, want 3 (one delivered, two ahead)", got)
	}
	Ack(m)
	if m = next(); m.UUID != "c" {
		t.Errorf("delivered %s, want c (held ahead, in the queue's order)", m.UUID)
	}
	// No credit frees: after PrefetchHold the one left ahead goes back.
	deadline := time.Now().Add(PrefetchHold + 5*time.Second)
	for src.inHand() != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("claimed and not settled %s after the hold: %d, want 1", PrefetchHold+5*time.Second, src.inHand())
		}
		time.Sleep(5 * time.Millisecond)
	}
	Ack(m)
	if m = next(); m.UUID != "d" {
		t.Errorf("after the hand-back delivered %s, want d", m.UUID)
	}
	Ack(m)
}
