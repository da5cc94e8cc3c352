package transport

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-io/sluice/core/credit"
	"github.com/sluice-io/sluice/internal/mutant"
)

// Source is the broker side of one request queue: the calls the claim loop
// makes. It knows nothing of credits; the loop (NewSubscriber) takes a
// credit before every message it asks for, so a Source never hands out more
// than the queue's gate allows.
//
// The loop calls Open once, then Claim and Wait from one goroutine; Settle
// runs on the core's goroutines (one call per delivered message, possibly
// after the subscription ended); HandBack and Close run after the loop
// stopped.
type Source interface {
	// Open starts the source. ctx ends when the subscription ends; work the
	// source runs by itself (a reader, a heartbeat, a wake-up listener) may
	// stop with it.
	Open(ctx context.Context) error
	// Claim takes up to n (≥ 1) messages without waiting for new ones to
	// arrive and returns them, possibly none. A claimed message is the
	// source's until it is settled or handed back. An error means nothing
	// was claimed; the loop backs off and asks again.
	Claim(ctx context.Context, n int) ([]*message.Message, error)
	// Wait blocks, holding no credit, until messages may be available again
	// (a producer's notification, a retry falling due, the source's poll
	// interval) or ctx ends. The loop calls it after a claim returned fewer
	// messages than asked for.
	Wait(ctx context.Context)
	// Settle ends one delivered message: acked means done (its result, retry
	// or dead letter was written), otherwise the message must become
	// available again without loss. It runs once per delivered message.
	Settle(m *message.Message, acked bool)
	// HandBack returns claimed messages that were never delivered (the
	// subscription ended while they waited); they must become available again.
	HandBack(ms []*message.Message)
	// Close releases what the source holds after the loop stopped. Messages
	// delivered earlier are still settled afterwards.
	Close() error
}

// BatchSizer is implemented by sources that claim in batches of their own
// size; without it the loop asks for up to DefaultBatch at once.
type BatchSizer interface {
	BatchSize() int
}

// DefaultBatch is the most messages the loop claims at once from a source
// that does not say (BatchSizer).
const DefaultBatch = 64

// Claim loop back-off after a failed claim: it starts at claimErrMin and
// doubles up to claimErrMax; failures are logged at most every claimErrLog.
const (
	claimErrMin = 10 * time.Millisecond
	claimErrMax = time.Second
	claimErrLog = 10 * time.Second
)

// NewSubscriber returns the Watermill subscriber of queue q: the one claim
// loop every transport runs through, over tp's Source for q. It takes
// credits from pool before each claim, claims at most what it was granted,
// gives back what it did not use, and frees a message's credit when the
// core settles it with Ack or Nack (the settle hook: no goroutine waits per
// message), or earlier, when the core says with FreeCredit that only the
// message's result is left to write. Watermill's router starts a goroutine per delivered message and
// has no limit of its own, so this is where a gate's budget bounds the
// requests in flight.
//
// Subscribe may be called once, with q.Name; its channel closes when ctx
// ends or the subscriber closes, and what was claimed but not delivered by
// then is handed back.
func NewSubscriber(tp Transport, q Queue, pool credit.Credits, log *slog.Logger) (message.Subscriber, error) {
	if pool == nil {
		return nil, fmt.Errorf("subscriber %s: no credits", q.Name)
	}
	q.MaxConcurrency = pool.Max()
	src, err := tp.Source(q)
	if err != nil {
		return nil, fmt.Errorf("source %s: %w", q.Name, err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	batch := DefaultBatch
	if b, ok := src.(BatchSizer); ok && b.BatchSize() > 0 {
		batch = b.BatchSize()
	}
	return &subscriber{src: src, q: q, pool: pool, log: log, batch: batch, done: make(chan struct{})}, nil
}

// ErrSubscribed is returned by a second Subscribe on one subscriber.
var ErrSubscribed = errors.New("already subscribed")

// ErrSubscriberClosed is returned by Subscribe after Close.
var ErrSubscriberClosed = errors.New("subscriber closed")

type subscriber struct {
	src   Source
	q     Queue
	pool  credit.Credits
	log   *slog.Logger
	batch int

	mu      sync.Mutex
	started bool
	closed  bool
	done    chan struct{}
	loop    sync.WaitGroup
}

var _ message.Subscriber = (*subscriber)(nil)

// Subscribe opens the source and starts the claim loop.
func (s *subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if topic != s.q.Name {
		return nil, fmt.Errorf("subscriber of %s cannot subscribe to %s", s.q.Name, topic)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return nil, fmt.Errorf("subscribe %s: %w", topic, ErrSubscriberClosed)
	case s.started:
		return nil, fmt.Errorf("subscribe %s: %w", topic, ErrSubscribed)
	}
	ctx, cancel := context.WithCancel(ctx)
	if err := s.src.Open(ctx); err != nil {
		cancel()
		return nil, fmt.Errorf("open %s: %w", topic, err)
	}
	s.started = true
	out := make(chan *message.Message)
	s.loop.Add(2)
	go func() {
		defer s.loop.Done()
		select {
		case <-s.done:
		case <-ctx.Done():
		}
		cancel()
	}()
	go func() {
		defer s.loop.Done()
		defer close(out)
		s.run(ctx, out)
	}()
	return out, nil
}

// run is the claim loop: acquire → claim → give back the unused credits →
// hand the batch to the feeder (each message with its settle hook) → wait
// when the batch came back short.
//
// The feeder (feed) delivers the batches in order, one message at a time
// as the router takes them (Watermill's router and its decorator take each
// message one goroutine hop after the other). After a short batch the
// queue is drained: the loop does not wait for the router, so a request
// written meanwhile is claimed at the next wake-up instead of behind the
// previous batch's delivery. After a full batch (more is likely waiting,
// and the loop is bound by its credits) it waits until the batch was
// delivered, as a loop delivering by itself would, so the credits freed
// meanwhile are claimed together and a busy queue takes no more claims per
// request. A batch held by the feeder keeps its credits: nothing is added
// to what is in flight.
func (s *subscriber) run(ctx context.Context, out chan<- *message.Message) {
	feed := make(chan handoff, feedDepth)
	var rest []*message.Message
	fed := make(chan struct{})
	go func() {
		defer close(fed)
		rest = s.feed(ctx, feed, out)
	}()
	defer func() {
		close(feed)
		<-fed
		if len(rest) > 0 { // never delivered: the subscription ended
			s.src.HandBack(rest)
			if !mutant.On(mutant.CreditNotReturnedOnHandBack) { // planted: the hand-back keeps its credits
				s.pool.Release(len(rest))
			}
		}
	}()
	backoff := claimErrMin
	var lastLog time.Time
	for {
		granted, err := s.pool.Acquire(ctx, s.batch)
		if err != nil {
			return
		}
		ms, err := s.src.Claim(ctx, granted)
		if err != nil {
			s.pool.Release(granted - len(ms))
			if ctx.Err() != nil {
				return
			}
			if time.Since(lastLog) >= claimErrLog {
				s.log.Warn("claim failed; retrying", "queue", s.q.Name, "err", err)
				lastLog = time.Now()
			}
			if !sleep(ctx, backoff) {
				return
			}
			backoff = min(2*backoff, claimErrMax)
			continue
		}
		backoff = claimErrMin
		if len(ms) > granted { // a source bug; never hand out more than granted
			s.log.Error("source claimed more than asked; handing the excess back", "queue", s.q.Name, "asked", granted, "claimed", len(ms))
			s.src.HandBack(ms[granted:])
			ms = ms[:granted]
		}
		s.pool.Release(granted - len(ms))
		claimed := time.Now()
		for _, m := range ms {
			onSettle(m, s.src, s.pool, claimed)
		}
		full := len(ms) == granted
		if len(ms) > 0 {
			h := handoff{ms: ms}
			if full {
				h.done = make(chan struct{})
			}
			feed <- h // the feeder returns what it cannot deliver
			if full {
				select {
				case <-h.done:
				case <-ctx.Done():
				}
			}
		}
		if !full {
			s.src.Wait(ctx)
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// feedDepth is how many batches the loop may hand to the feeder ahead of
// the one it is delivering.
const feedDepth = 4

// handoff is one claimed batch for the feeder; done, when set, is closed
// once the batch was delivered (or kept for the hand-back).
type handoff struct {
	ms   []*message.Message
	done chan struct{}
}

// feed delivers the batches of feed to out in order until feed closes, and
// returns the messages it could not deliver because ctx ended.
func (s *subscriber) feed(ctx context.Context, feed <-chan handoff, out chan<- *message.Message) (rest []*message.Message) {
	for h := range feed {
		for i, m := range h.ms {
			if ctx.Err() != nil {
				rest = append(rest, h.ms[i:]...)
				break
			}
			select {
			case out <- m:
				continue
			case <-ctx.Done():
				rest = append(rest, h.ms[i:]...)
			}
			break
		}
		if h.done != nil {
			close(h.done)
		}
	}
	return rest
}

// sleep waits for d or the end of ctx (false).
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Close stops claiming, waits for the loop, and closes the source.
// Deliveries made earlier are still settled when the core acks or nacks
// them.
func (s *subscriber) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.done)
	s.mu.Unlock()
	s.loop.Wait()
	if err := s.src.Close(); err != nil {
		return fmt.Errorf("close source %s: %w", s.q.Name, err)
	}
	return nil
}
