package pipeline

import (
	"container/heap"
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/sluice-io/sluice/core/transport"
)

// delayQueue is the generic delayed re-queue for transports without a native
// one: one timer heap and one goroutine for the whole pipeline, so a waiting
// retry holds no worker. Due entries are published back to their request
// queue. Entries do not survive a crash; on a clean shutdown they are
// published at once (early, never lost).
type delayQueue struct {
	pub transport.RequestPublisher
	log *slog.Logger

	mu      sync.Mutex
	entries delayEntries
	wake    chan struct{}
}

type delayEntry struct {
	q       transport.Queue
	payload []byte
	due     time.Time
}

type delayEntries []delayEntry

func (h delayEntries) Len() int           { return len(h) }
func (h delayEntries) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h delayEntries) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *delayEntries) Push(x any)        { *h = append(*h, x.(delayEntry)) }
func (h *delayEntries) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

func newDelayQueue(pub transport.RequestPublisher, log *slog.Logger) *delayQueue {
	return &delayQueue{pub: pub, log: log, wake: make(chan struct{}, 1)}
}

func (dq *delayQueue) add(q transport.Queue, payload []byte, due time.Time) {
	dq.mu.Lock()
	heap.Push(&dq.entries, delayEntry{q: q, payload: payload, due: due})
	dq.mu.Unlock()
	select {
	case dq.wake <- struct{}{}:
	default:
	}
}

// popDue removes the entries due at now and returns them with the wait
// until the next one (0 if none).
func (dq *delayQueue) popDue(now time.Time) ([]delayEntry, time.Duration) {
	dq.mu.Lock()
	defer dq.mu.Unlock()
	var due []delayEntry
	for len(dq.entries) > 0 && !dq.entries[0].due.After(now) {
		due = append(due, heap.Pop(&dq.entries).(delayEntry))
	}
	if len(dq.entries) == 0 {
		return due, 0
	}
	return due, dq.entries[0].due.Sub(now)
}

func (dq *delayQueue) run(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		due, wait := dq.popDue(time.Now())
		for _, e := range due {
			dq.publish(ctx, e)
		}
		if wait <= 0 {
			wait = time.Hour
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-dq.wake:
		case <-timer.C:
		}
	}
}

func (dq *delayQueue) publish(ctx context.Context, e delayEntry) {
	if err := dq.pub.PublishRequest(context.WithoutCancel(ctx), e.q, e.payload); err != nil {
		// Keep it: try again a second later rather than lose it.
		dq.log.Warn("re-queue failed; will try again", "queue", e.q.ID, "err", err)
		e.due = time.Now().Add(time.Second)
		dq.mu.Lock()
		heap.Push(&dq.entries, e)
		dq.mu.Unlock()
	}
}

// flush publishes every entry now (on shutdown), so none is lost.
func (dq *delayQueue) flush(ctx context.Context) {
	dq.mu.Lock()
	entries := dq.entries
	dq.entries = nil
	dq.mu.Unlock()
	for _, e := range entries {
		if err := dq.pub.PublishRequest(ctx, e.q, e.payload); err != nil {
			dq.log.Error("re-queue at shutdown failed; request lost", "queue", e.q.ID, "payload", string(e.payload), "err", err)
		}
	}
}
