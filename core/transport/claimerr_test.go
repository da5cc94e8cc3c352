package transport

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-io/sluice/core/credit"
	"github.com/sluice-io/sluice/internal/testenv"
)

// failingSource is a modelSource whose first fail claims fail; it notes
// when each claim was made.
type failingSource struct {
	*modelSource
	mu     sync.Mutex
	fail   int
	claims []time.Time
}

func (s *failingSource) Claim(ctx context.Context, n int) ([]*message.Message, error) {
	s.mu.Lock()
	s.claims = append(s.claims, time.Now())
	failing := s.fail > 0
	if failing {
		s.fail--
	}
	s.mu.Unlock()
	if failing {
		return nil, errors.New("broker unreachable (test)")
	}
	return s.modelSource.Claim(ctx, n)
}

// TestClaimFailuresBackOff: after a failed claim the loop waits 10 ms,
// then twice as long after each further failure, logs the failures once
// (not once per claim), and delivers once a claim succeeds.
func TestClaimFailuresBackOff(t *testing.T) {
	var logs testenv.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	src := &failingSource{modelSource: &modelSource{claimed: map[string]bool{}, wake: make(chan struct{}, 1)}, fail: 5}
	src.put("a")
	pool := credit.NewPool(1, credit.Ramp{})
	pool.SetBudget(1)
	sub, err := NewSubscriber(sourceTransport{src}, Queue{Name: "q"}, pool, log)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	out, err := sub.Subscribe(context.Background(), "q")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-out:
		if m.UUID != "a" {
			t.Fatalf("delivered %s", m.UUID)
		}
		m.Ack()
	case <-time.After(10 * time.Second):
		t.Fatal("nothing delivered after the claims stopped failing")
	}
	src.mu.Lock()
	claims := append([]time.Time(nil), src.claims...)
	src.mu.Unlock()
	if len(claims) < 6 {
		t.Fatalf("%d claims, want 5 failed and 1 that took the message", len(claims))
	}
	want := claimErrMin
	for i := 1; i <= 5; i++ {
		if gap := claims[i].Sub(claims[i-1]); gap < want {
			t.Errorf("claim %d came %s after the failure before it, want at least %s", i+1, gap, want)
		}
		want = min(2*want, claimErrMax)
	}
	if n := strings.Count(logs.String(), "claim failed; retrying"); n != 1 {
		t.Errorf("%d log lines for 5 failed claims within %s, want 1", n, claimErrLog)
	}
}
