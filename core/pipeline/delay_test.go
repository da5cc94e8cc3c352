package pipeline

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluice-io/sluice/core/transport"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type recordingPublisher struct {
	mu    sync.Mutex
	got   []string
	at    []time.Time
	fails int
}

func (p *recordingPublisher) PublishRequest(_ context.Context, _ transport.Queue, payload []byte) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fails > 0 {
		p.fails--
		return errors.New("broker down")
	}
	p.got = append(p.got, string(payload))
	p.at = append(p.at, time.Now())
	return nil
}

func (p *recordingPublisher) snapshot() ([]string, []time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.got...), append([]time.Time(nil), p.at...)
}

func TestDelayQueueOrderAndTiming(t *testing.T) {
	pub := &recordingPublisher{}
	dq := newDelayQueue(pub, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { dq.run(ctx); close(done) }()
	start := time.Now()
	q := transport.Queue{ID: "q", Name: "q"}
	dq.add(q, []byte("late"), start.Add(300*time.Millisecond))
	dq.add(q, []byte("early"), start.Add(100*time.Millisecond))
	deadline := time.Now().Add(3 * time.Second)
	for {
		got, _ := pub.snapshot()
		if len(got) == 2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
	got, at := pub.snapshot()
	if len(got) != 2 || got[0] != "early" || got[1] != "late" {
		t.Fatalf("published %v", got)
	}
	if at[0].Sub(start) < 100*time.Millisecond || at[1].Sub(start) < 300*time.Millisecond {
		t.Errorf("published too early: %s, %s", at[0].Sub(start), at[1].Sub(start))
	}
}

func TestDelayQueueKeepsEntriesWhenPublishFailsAndFlushes(t *testing.T) {
	pub := &recordingPublisher{fails: 1}
	dq := newDelayQueue(pub, slog.New(slog.DiscardHandler))
	q := transport.Queue{ID: "q", Name: "q"}
	dq.add(q, []byte("a"), time.Now())
	due, _ := dq.popDue(time.Now())
	for _, e := range due {
		dq.publish(context.Background(), e) // fails once: kept for a second later
	}
	if got, _ := pub.snapshot(); len(got) != 0 {
		t.Fatalf("published %v despite the failure", got)
	}
	dq.add(q, []byte("b"), time.Now().Add(time.Hour))
	dq.flush(context.Background())
	if got, _ := pub.snapshot(); len(got) != 2 {
		t.Fatalf("flush published %v, want both entries", got)
	}
}
