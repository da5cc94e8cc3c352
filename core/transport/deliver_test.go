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

// countingSource counts the claims made on a modelSource.
type countingSource struct {
	*modelSource
	claims atomic.Int32
}

func (s *countingSource) Claim(ctx context.Context, n int) ([]*message.Message, error) {
	s.claims.Add(1)
	return s.modelSource.Claim(ctx, n)
}

// TestLoopClaimsWhileRouterBusy checks that the claim loop hands a claimed
// batch over without waiting for the consumer to take each message: with
// nobody reading the channel, it still claims again (here: the batch after
// the first), so requests written meanwhile do not wait for the previous
// batch's delivery. Closing the subscriber then hands back what was never
// taken, with its credits.
func TestLoopClaimsWhileRouterBusy(t *testing.T) {
	pool := credit.NewPool(8, credit.Ramp{})
	pool.SetBudget(8)
	src := &countingSource{modelSource: &modelSource{claimed: map[string]bool{}, wake: make(chan struct{}, 1)}}
	sub, err := NewSubscriber(sourceTransport{src}, Queue{Name: "q"}, pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	src.put("a", "b")
	if _, err := sub.Subscribe(context.Background(), "q"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for src.inHand() < 3 {
		if src.inHand() == 2 && src.claims.Load() >= 2 {
			src.put("c") // the loop came back for more: give it a second batch
		}
		if time.Now().After(deadline) {
			t.Fatalf("with nobody reading, the loop claimed %d messages in %d claims (want 3: it should claim again without waiting for the consumer)", src.inHand(), src.claims.Load())
		}
		time.Sleep(time.Millisecond)
	}
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

var errNoPublisher = errors.New("no publisher")

// sourceTransport serves one Source.
type sourceTransport struct{ src Source }

func (t sourceTransport) Source(Queue) (Source, error)               { return t.src, nil }
func (t sourceTransport) Publisher(Queue) (message.Publisher, error) { return nil, errNoPublisher }
func (t sourceTransport) Close() error                               { return nil }
