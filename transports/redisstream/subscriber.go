package redisstream

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/credit"
	"github.com/sluice-io/sluice/core/transport"
)

// subscriber reads one stream through the consumer group in windows sized
// by the free credits, keeps its entries in flight claimed (heartbeat), and
// takes over entries of dead consumers.
type subscriber struct {
	t       *Transport
	credits *credit.Pool

	mu      sync.Mutex
	stream  string
	started bool
	closed  bool
	mine    map[string]*delivery // this subscriber's deliveries in flight, by entry id

	done  chan struct{}
	loops sync.WaitGroup
}

var _ message.Subscriber = (*subscriber)(nil)

// Subscribe creates the consumer group if needed and starts delivering.
// The channel closes when ctx ends or the subscriber closes.
func (s *subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, ErrClosed
	}
	if s.started {
		s.mu.Unlock()
		return nil, fmt.Errorf("redis-stream subscriber: already subscribed to %s", s.stream)
	}
	s.started, s.stream, s.mine = true, topic, map[string]*delivery{}
	s.mu.Unlock()
	if err := s.t.ensureGroup(ctx, topic); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	out := make(chan *message.Message)
	s.loops.Add(3)
	go func() {
		defer s.loops.Done()
		select {
		case <-ctx.Done():
		case <-s.done:
		}
		cancel()
	}()
	go func() {
		defer s.loops.Done()
		defer close(out)
		s.read(ctx, out)
	}()
	s.t.bg.Add(1)
	go func() {
		defer s.t.bg.Done()
		s.heartbeat(s.t.ctx) // until the transport closes: the drain outlives the reads
	}()
	go func() {
		defer s.loops.Done()
		s.moveDue(ctx)
	}()
	return out, nil
}

// ensureGroup creates the group at the start of the stream (MKSTREAM).
func (t *Transport) ensureGroup(ctx context.Context, stream string) error {
	t.mu.Lock()
	done := t.groups[stream]
	t.mu.Unlock()
	if done {
		return nil
	}
	err := t.client.XGroupCreateMkStream(ctx, stream, t.opts.ConsumerGroup, "0").Err()
	if err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
		return fmt.Errorf("create group %s on %s: %w", t.opts.ConsumerGroup, stream, err)
	}
	t.mu.Lock()
	t.groups[stream] = true
	t.mu.Unlock()
	return nil
}

func (s *subscriber) read(ctx context.Context, out chan<- *message.Message) {
	t := s.t
	claimEvery := time.Duration(t.opts.ClaimIdleMS) * time.Millisecond / 2
	var lastClaim time.Time
	claimCursor := "0-0"
	for ctx.Err() == nil {
		granted, err := s.credits.Acquire(ctx, t.opts.BatchSize)
		if err != nil {
			return
		}
		var entries []redis.XMessage
		if time.Since(lastClaim) >= claimEvery || claimCursor != "0-0" {
			claimed, next, err := t.client.XAutoClaim(ctx, &redis.XAutoClaimArgs{
				Stream: s.stream, Group: t.opts.ConsumerGroup, Consumer: t.opts.Consumer,
				MinIdle: time.Duration(t.opts.ClaimIdleMS) * time.Millisecond, Start: claimCursor, Count: int64(granted),
			}).Result()
			if err == nil {
				entries, claimCursor = s.notMine(claimed), next
				t.reclaimed.Add(int64(len(entries)))
				if claimCursor == "0-0" {
					lastClaim = time.Now()
				}
			} else if ctx.Err() == nil {
				t.log.Warn("taking over idle entries failed", "stream", s.stream, "err", err)
				lastClaim = time.Now()
			}
		}
		if want := granted - len(entries); want > 0 {
			if more, err := s.readNew(ctx, want, -1); err == nil {
				entries = append(entries, more...)
			}
		}
		if len(entries) == 0 {
			// Idle: wait for new entries holding one credit, not the whole window.
			s.credits.Release(granted - 1)
			granted = 1
			entries, _ = s.readNew(ctx, 1, time.Duration(t.opts.BlockMS)*time.Millisecond)
		}
		s.credits.Release(granted - len(entries))
		for i, e := range entries {
			d := s.delivery(e)
			transport.OnSettle(d.msg, func(acked bool) { s.settle(d, acked) })
			select {
			case out <- d.msg:
				t.delivered.Add(1)
			case <-ctx.Done():
				// Still pending for us: hand back what was read but not delivered.
				for _, rest := range entries[i:] {
					rd := s.delivery(rest)
					s.drop(rd)
					_ = t.handBack(rd)
				}
				s.credits.Release(len(entries) - i)
				return
			}
		}
	}
}

// readNew reads up to n new entries, waiting up to block (-1: not at all).
// An error was logged and waited on; the caller tries again.
func (s *subscriber) readNew(ctx context.Context, n int, block time.Duration) ([]redis.XMessage, error) {
	t := s.t
	res, err := t.client.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group: t.opts.ConsumerGroup, Consumer: t.opts.Consumer, Streams: []string{s.stream, ">"},
		Count: int64(n), Block: block,
	}).Result()
	switch {
	case err == nil:
		var out []redis.XMessage
		for _, st := range res {
			out = append(out, st.Messages...)
		}
		return out, nil
	case errors.Is(err, redis.Nil):
		return nil, nil
	case ctx.Err() != nil:
		return nil, ctx.Err()
	}
	t.log.Warn("reading the stream failed; retrying", "stream", s.stream, "err", err)
	if strings.HasPrefix(err.Error(), "NOGROUP") {
		t.mu.Lock()
		delete(t.groups, s.stream)
		t.mu.Unlock()
		_ = t.ensureGroup(ctx, s.stream)
	}
	sleep(ctx, 200*time.Millisecond)
	return nil, err
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// notMine drops re-claimed entries that this subscriber is running already
// (its heartbeat was late): they must not run twice.
func (s *subscriber) notMine(es []redis.XMessage) []redis.XMessage {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := es[:0]
	for _, e := range es {
		if _, running := s.mine[e.ID]; !running {
			out = append(out, e)
		}
	}
	return out
}

// delivery builds and indexes the message of entry e.
func (s *subscriber) delivery(e redis.XMessage) *delivery {
	m, err := redisstream.DefaultMarshallerUnmarshaller{}.Unmarshal(e.Values)
	if err != nil {
		// Not written by Watermill: take the payload field as it is.
		p, _ := e.Values["payload"].(string)
		m = message.NewMessage(e.ID, []byte(p))
	}
	if m.Metadata == nil {
		m.Metadata = message.Metadata{}
	}
	m.Metadata.Set(MetaStream, s.stream)
	m.Metadata.Set(MetaEntry, e.ID)
	d := &delivery{sub: s, stream: s.stream, id: e.ID, msg: m}
	s.mu.Lock()
	s.mine[e.ID] = d
	s.mu.Unlock()
	s.t.mu.Lock()
	s.t.inflight[key(s.stream, e.ID)] = d
	s.t.mu.Unlock()
	return d
}

// drop removes d from both indexes; it reports whether the transport still held it.
func (s *subscriber) drop(d *delivery) bool {
	s.mu.Lock()
	if s.mine[d.id] == d {
		delete(s.mine, d.id)
	}
	s.mu.Unlock()
	return s.t.forget(d)
}

// settle settles one delivery when the core acks or nacks it (through
// transport.Ack / transport.Nack; no goroutine waits per message). An ack
// after a fenced write (result, retry, dead letter) has nothing left to do;
// a bare ack acks the entry (fenced); a nack re-appends it at the tail, at
// once available to every consumer.
func (s *subscriber) settle(d *delivery, acked bool) {
	defer s.credits.Release(1)
	nacked := !acked
	if !s.drop(d) {
		return // handed back by Transport.Close
	}
	if nacked {
		_ = s.t.handBack(d)
		return
	}
	if d.settled.Load() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := s.t.fenced(ctx, ackScript, d, nil); err != nil {
		s.t.log.Error("ack failed; the entry stays pending and is taken over after claim_idle_ms", "stream", d.stream, "entry", d.id, "err", err)
	}
}

// ackScript acks the entry, if still owned.
var ackScript = redis.NewScript(ownedPrelude + ackTail)

// heartbeat keeps this subscriber's entries in flight claimed, so no other
// consumer sees them idle while they run.
func (s *subscriber) heartbeat(ctx context.Context) {
	t := s.t
	tick := time.NewTicker(time.Duration(t.opts.HeartbeatMS) * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		s.mu.Lock()
		ids := make([]any, 0, 2+len(s.mine))
		ids = append(ids, t.opts.ConsumerGroup, t.opts.Consumer)
		for id := range s.mine {
			ids = append(ids, id)
		}
		s.mu.Unlock()
		if len(ids) == 2 {
			continue
		}
		if err := touchScript.Run(ctx, t.client, []string{s.stream}, ids...).Err(); err != nil && ctx.Err() == nil {
			t.log.Warn("heartbeat of entries in flight failed", "stream", s.stream, "err", err)
		}
	}
}

// moveDue moves due retries of the stream back to it.
func (s *subscriber) moveDue(ctx context.Context) {
	t := s.t
	tick := time.NewTicker(time.Duration(t.opts.RetryPollIntervalMS) * time.Millisecond)
	defer tick.Stop()
	const limit = 256
	for {
		for {
			n, err := moveScript.Run(ctx, t.client, []string{s.stream, s.stream + t.opts.DelayedSuffix}, time.Now().UnixMilli(), limit).Int()
			if err != nil {
				if ctx.Err() == nil {
					t.log.Warn("moving due retries failed; will try again", "stream", s.stream, "err", err)
				}
				break
			}
			if n < limit {
				break
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// Close stops reading; deliveries in flight are still settled when acked
// or nacked (Transport.Close hands back what is left).
func (s *subscriber) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.done)
	s.mu.Unlock()
	s.loops.Wait()
	return nil
}
