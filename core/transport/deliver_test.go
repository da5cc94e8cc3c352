package transport

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-io/sluice/core/credit"
)

// countingSource counts the claims made on a modelSource that took
// something (a claim of an empty queue, such as the loop's first when it
// starts before the test writes, is not counted) and claims at most batch
// at once (BatchSizer).
type countingSource struct {
	*modelSource
	batch  int
	claims atomic.Int32
}

func (s *countingSource) Claim(ctx context.Context, n int) ([]*message.Message, error) {
	ms, err := s.modelSource.Claim(ctx, n)
	if len(ms) > 0 {
		s.claims.Add(1)
	}
	return ms, err
}

func (s *countingSource) BatchSize() int { return s.batch }

var errNoPublisher = errors.New("no publisher")

// sourceTransport serves one Source.
type sourceTransport struct{ src Source }

func (t sourceTransport) Source(Queue) (Source, error)               { return t.src, nil }
func (t sourceTransport) Publisher(Queue) (message.Publisher, error) { return nil, errNoPublisher }
func (t sourceTransport) Close() error                               { return nil }

// startCounting subscribes to a countingSource of batch with credits.
func startCounting(t *testing.T, credits, batch int) (*countingSource, *credit.Pool, message.Subscriber, <-chan *message.Message) {
	t.Helper()
	pool := credit.NewPool(credits, credit.Ramp{})
	pool.SetBudget(1)
	src := &countingSource{modelSource: &modelSource{claimed: map[string]bool{}, wake: make(chan struct{}, 1)}, batch: batch}
	sub, err := NewSubscriber(sourceTransport{src}, Queue{Name: "q"}, pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	out, err := sub.Subscribe(context.Background(), "q")
	if err != nil {
		t.Fatal(err)
	}
	return src, pool, sub, out
}

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(end) {
			t.Fatalf("not within 10 s: %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestLoopClaimsWhileRouterBusy checks that after a short batch (the queue
// drained) the claim loop does not wait for the consumer to take each
// message: with nobody reading, it still claims what is written next, so
// such a request does not wait behind the previous batch's delivery.
// Closing the subscriber then hands back what was never taken, with its
// credits.
func TestLoopClaimsWhileRouterBusy(t *testing.T) {
	src, pool, sub, _ := startCounting(t, 8, 8)
	src.put("a", "b")
	waitFor(t, "the first batch claimed", func() bool { return src.inHand() == 2 })
	src.put("c")
	waitFor(t, "the loop claims again while the first batch waits for the consumer", func() bool { return src.inHand() == 3 })
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	if n := src.inHand(); n != 0 {
		t.Errorf("after Close, %d messages never taken are still claimed (not handed back)", n)
	}
	if in, _, _ := pool.Snapshot(); in != 0 {
		t.Errorf("after Close, %d credits still in use", in)
	}
}

// TestLoopFullBatchWaitsForDelivery checks that after a full batch (more
// is likely waiting) the loop claims again only once the batch was taken,
// so a busy queue is claimed in batches of the credits freed meanwhile
// rather than one claim per freed credit: with credits to spare and
// requests waiting, no second claim is made while the first batch waits
// for the consumer.
func TestLoopFullBatchWaitsForDelivery(t *testing.T) {
	src, _, sub, out := startCounting(t, 8, 2)
	defer sub.Close()
	src.put("a", "b", "c", "d")
	waitFor(t, "the first batch claimed", func() bool { return src.claims.Load() >= 1 })
	time.Sleep(100 * time.Millisecond)
	if n := src.claims.Load(); n != 1 {
		t.Fatalf("%d claims before the consumer took the first full batch, want 1", n)
	}
	for range 2 {
		select {
		case m := <-out:
			Ack(m)
		case <-time.After(10 * time.Second):
			t.Fatal("the first batch was not delivered")
		}
	}
	waitFor(t, "the second batch claimed once the first was taken", func() bool { return src.inHand() == 2 && src.claims.Load() == 2 })
}
