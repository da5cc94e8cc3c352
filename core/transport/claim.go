package transport

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/cenkalti/backoff/v5"

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

// Prefetcher is implemented by sources whose messages may be claimed ahead
// of the credits that will dispatch them. Prefetch is how many the loop may
// hold claimed and undelivered beyond its credits (0: none). The loop
// claims them only while the queue is busy (its last claim came back full),
// hands one on the moment a credit frees, so a freed credit need not wait
// for a claim's round trip, and hands them all back to the source when no
// credit freed for PrefetchHold, so a queue whose gate closed does not keep
// requests from other replicas. Credits still bound what is dispatched: a
// message held ahead holds none.
type Prefetcher interface {
	Prefetch() int
}

// PrefetchHold is how long the loop keeps messages claimed ahead while no
// credit frees before it hands them back.
const PrefetchHold = time.Second

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
	ahead := 0
	if p, ok := src.(Prefetcher); ok {
		ahead = max(p.Prefetch(), 0)
	}
	return &subscriber{src: src, q: q, pool: pool, log: log, batch: batch, ahead: ahead, done: make(chan struct{})}, nil
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
	ahead int // Prefetcher's Prefetch: messages claimed ahead of credits

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
//
// With a Prefetcher's allowance the loop also claims up to that many
// messages ahead of its credits while the queue is busy, and hands them on
// as credits free, before it claims again: a freed credit then takes the
// next request at once instead of after a claim's round trip (the claim
// refills the messages held ahead when half of them were handed on), and
// it does not wait for a full batch's delivery. Messages held ahead when
// no credit freed for PrefetchHold, or when the subscription ends, are
// handed back.
func (s *subscriber) run(ctx context.Context, out chan<- *message.Message) {
	feed := make(chan handoff, feedDepth)
	var rest []*message.Message
	var held ahead
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
		if ms, _ := held.take(len(held.ms)); len(ms) > 0 { // claimed ahead: they hold no credit
			s.src.HandBack(ms)
		}
	}()
	// The wait after a failed claim: claimErrMin, doubling up to
	// claimErrMax, no jitter (internal/retry.Doubling, which core does not
	// link: see core/app's TestLinksOnlyCore).
	pause := &backoff.ExponentialBackOff{InitialInterval: claimErrMin, Multiplier: 2, MaxInterval: claimErrMax}
	var lastLog time.Time
	busy := false // the last claim came back full
	for {
		granted, err := s.acquire(ctx, len(held.ms) > 0)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			// no credit freed for PrefetchHold: let other replicas have them
			ms, _ := held.take(len(held.ms))
			s.src.HandBack(ms)
			busy = false
			continue
		}
		if n := min(granted, len(held.ms)); n > 0 {
			ms, at := held.take(n)
			for i, m := range ms {
				onSettle(m, s.src, s.pool, at[i])
			}
			s.deliver(ctx, feed, ms, false)
			granted -= n
		}
		refill := 0
		if s.ahead > 0 && busy && len(held.ms) <= s.ahead/2 {
			refill = max(min(s.ahead-len(held.ms), s.batch-granted), 0)
		}
		if granted == 0 && refill == 0 {
			continue
		}
		ask := granted + refill
		ms, err := s.src.Claim(ctx, ask)
		if err != nil {
			s.pool.Release(granted)
			busy = false
			if ctx.Err() != nil {
				return
			}
			if time.Since(lastLog) >= claimErrLog {
				s.log.Warn("claim failed; retrying", "queue", s.q.Name, "err", err)
				lastLog = time.Now()
			}
			if !sleep(ctx, pause.NextBackOff()) {
				return
			}
			continue
		}
		pause.Reset()
		if len(ms) > ask { // a source bug; never hand out more than asked
			s.log.Error("source claimed more than asked; handing the excess back", "queue", s.q.Name, "asked", ask, "claimed", len(ms))
			s.src.HandBack(ms[ask:])
			ms = ms[:ask]
		}
		claimed := time.Now()
		busy = len(ms) == ask
		n := min(granted, len(ms))
		s.pool.Release(granted - n)
		held.add(ms[n:], claimed)
		if n > 0 {
			for _, m := range ms[:n] {
				onSettle(m, s.src, s.pool, claimed)
			}
			// a full batch without an allowance: wait for its delivery
			s.deliver(ctx, feed, ms[:n], n == granted && s.ahead == 0)
		}
		if len(ms) < ask && len(held.ms) == 0 {
			s.src.Wait(ctx)
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// acquire takes up to a batch of credits; while messages are held ahead it
// waits at most PrefetchHold (an error with ctx still live).
func (s *subscriber) acquire(ctx context.Context, holding bool) (int, error) {
	if !holding {
		return s.pool.Acquire(ctx, s.batch)
	}
	hctx, cancel := context.WithTimeout(ctx, PrefetchHold)
	defer cancel()
	return s.pool.Acquire(hctx, s.batch)
}

// deliver hands ms, each holding a credit and its settle hook, to the
// feeder; with wait it returns once they were delivered (or ctx ended).
func (s *subscriber) deliver(ctx context.Context, feed chan<- handoff, ms []*message.Message, wait bool) {
	h := handoff{ms: ms}
	if wait {
		h.done = make(chan struct{})
	}
	feed <- h // the feeder returns what it cannot deliver
	if wait {
		select {
		case <-h.done:
		case <-ctx.Done():
		}
	}
}

// ahead is what the loop claimed ahead of its credits, oldest first, with
// the time of each message's claim.
type ahead struct {
	ms []*message.Message
	at []time.Time
}

func (a *ahead) add(ms []*message.Message, at time.Time) {
	for _, m := range ms {
		a.ms = append(a.ms, m)
		a.at = append(a.at, at)
	}
}

// take removes the n oldest and returns them with their claim times. The
// returned slices are the front of a's: later adds append past its end
// (or into a new array), never over them, so they need no copy.
func (a *ahead) take(n int) ([]*message.Message, []time.Time) {
	if n == 0 {
		return nil, nil
	}
	ms, at := a.ms[:n:n], a.at[:n:n]
	a.ms, a.at = a.ms[n:], a.at[n:]
	return ms, at
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
