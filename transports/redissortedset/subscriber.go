package redissortedset

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/credit"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/transports/redissortedset/internal/keys"
)

// minIdle is the first idle wait after a claim found the queue empty; it
// doubles up to the poll interval. A producer's notify wakes the loop early.
const minIdle = 2 * time.Millisecond

type subscriber struct {
	t       *Transport
	q       transport.Queue
	qs      *queueState
	credits *credit.Pool

	mu     sync.Mutex
	closed bool
	done   chan struct{}
	loops  sync.WaitGroup
}

var _ message.Subscriber = (*subscriber)(nil)

// claimed is one request taken by a claim.
type claimed struct {
	token, score string
	deliveries   int
	member       string
}

// claimResult is the answer of the claim script.
type claimResult struct {
	nextDue int64 // Unix ms of the next delayed request, -1 if none
	epoch   string
	now     int64
	items   []claimed
}

// claim runs the claim script for up to n requests.
func (t *Transport) claim(ctx context.Context, qs *queueState, n int) (claimResult, error) {
	prefix := t.id + ":" + strconv.FormatUint(t.seq.Add(1), 36) + ":"
	raw, err := keys.Claim.Run(ctx, t.client,
		[]string{qs.k.Name, qs.k.Leases, qs.k.Leased, qs.k.Redeliveries, qs.k.Delayed, t.names.CancelEpoch()},
		n, t.opts.LeaseMS, prefix, qs.k.JobPrefix).Slice()
	if err != nil {
		return claimResult{}, fmt.Errorf("claim from %s: %w", qs.k.Name, err)
	}
	if len(raw) < 3 || (len(raw)-3)%4 != 0 {
		return claimResult{}, fmt.Errorf("claim from %s: unexpected reply of %d elements", qs.k.Name, len(raw))
	}
	var res claimResult
	res.nextDue = -1
	if s, ok := raw[0].(string); ok {
		if f, err := strconv.ParseFloat(s, 64); err == nil {
			res.nextDue = int64(f)
		}
	}
	res.epoch, _ = raw[1].(string)
	res.now, _ = raw[2].(int64)
	res.items = make([]claimed, 0, (len(raw)-3)/4)
	for i := 3; i+3 < len(raw); i += 4 {
		c := claimed{}
		c.token, _ = raw[i].(string)
		c.score, _ = raw[i+1].(string)
		d, _ := raw[i+2].(int64)
		c.deliveries = int(d)
		c.member, _ = raw[i+3].(string)
		res.items = append(res.items, c)
	}
	t.claimed.Add(int64(len(res.items)))
	return res, nil
}

// Subscribe starts delivering topic's requests in deadline order while
// credits are free. topic must be the queue the subscriber was made for.
// The channel closes when ctx ends or the subscriber closes; messages
// delivered by then are still settled when acked or nacked.
func (s *subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if topic != s.q.Name {
		return nil, fmt.Errorf("redis-sortedset subscriber of %s cannot subscribe to %s", s.q.Name, topic)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	if err := s.t.startLoops(s.qs); err != nil {
		return nil, err
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	if err := s.t.client.SAdd(rctx, s.t.names.Registry(), s.q.Name).Err(); err != nil {
		s.t.log.Warn("registering the queue failed (only `sluice queues` needs it)", "queue", s.q.Name, "err", err)
	}
	cancel()
	ctx, cancel = context.WithCancel(ctx)
	wake := make(chan struct{}, 1)
	ps := s.t.client.Subscribe(ctx, s.qs.k.Notify)
	out := make(chan *message.Message)
	s.loops.Add(3)
	go func() {
		defer s.loops.Done()
		select {
		case <-s.done:
		case <-s.t.closing:
		case <-ctx.Done():
		}
		cancel()
		_ = ps.Close()
	}()
	go func() {
		defer s.loops.Done()
		for range ps.Channel() {
			select {
			case wake <- struct{}{}:
			default:
			}
		}
	}()
	go func() {
		defer s.loops.Done()
		defer close(out)
		s.deliver(ctx, out, wake)
	}()
	return out, nil
}

func (s *subscriber) deliver(ctx context.Context, out chan<- *message.Message, wake <-chan struct{}) {
	t := s.t
	poll := ms(t.opts.PollIntervalMS)
	idle := minIdle
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var lastErrLog time.Time
	for {
		granted, err := s.credits.Acquire(ctx, t.opts.BatchSize)
		if err != nil {
			return
		}
		res, err := t.claim(ctx, s.qs, granted)
		if err != nil {
			s.credits.Release(granted)
			if ctx.Err() != nil {
				return
			}
			if time.Since(lastErrLog) > 10*time.Second {
				t.log.Warn("claim failed; retrying", "queue", s.q.Name, "err", err)
				lastErrLog = time.Now()
			}
			if !s.sleep(ctx, timer, wake, idle) {
				return
			}
			idle = min(idle*2, poll)
			continue
		}
		if unused := granted - len(res.items); unused > 0 {
			s.credits.Release(unused)
		}
		if res.epoch != t.cancels.currentEpoch() {
			t.refreshCancels(ctx, res.epoch)
		}
		toks := make([]string, len(res.items))
		for i, c := range res.items {
			toks[i] = c.token
		}
		s.qs.hold(toks...)
		for i, c := range res.items {
			if c.deliveries > t.opts.MaxDeliveries {
				s.giveUp(c)
				s.credits.Release(1)
				continue
			}
			m := message.NewMessage(c.token, []byte(c.member))
			m.Metadata = message.Metadata{MetaLease: c.token, MetaScore: c.score,
				MetaDeliveries: strconv.Itoa(c.deliveries), MetaQueue: s.q.Name}
			transport.OnSettle(m, s.settleFunc(m, c.token))
			select {
			case out <- m:
			case <-ctx.Done():
				var rest []string
				for _, r := range res.items[i:] {
					if s.qs.settle(r.token) {
						rest = append(rest, r.token)
					}
				}
				t.releaseRetrying(s.qs, rest...)
				s.credits.Release(len(res.items) - i)
				return
			}
		}
		if len(res.items) == granted {
			idle = minIdle
			continue // a full batch: there may be more
		}
		wait := idle
		if len(res.items) > 0 {
			wait = minIdle
		}
		if res.nextDue >= 0 {
			wait = min(wait, time.Duration(max(res.nextDue-res.now, 1))*time.Millisecond)
		}
		if !s.sleep(ctx, timer, wake, min(wait, poll)) {
			return
		}
		if len(res.items) == 0 {
			idle = min(idle*2, poll)
		} else {
			idle = minIdle
		}
	}
}

// sleep waits for d, a wake-up or the end of ctx (false).
func (s *subscriber) sleep(ctx context.Context, timer *time.Timer, wake <-chan struct{}, d time.Duration) bool {
	timer.Reset(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-wake:
		return true
	case <-timer.C:
		return true
	}
}

// settleFunc settles a delivered message when the core acks or nacks it
// (through transport.Ack / transport.Nack; no goroutine waits per message).
// It may run after the subscription ended: requests in flight at shutdown
// are settled by the core later. An ack finds the lease already settled by
// the result publisher, Requeue or DeadLetter; a nack hands the request back.
// After Close it does nothing: Close hands back what is still held.
func (s *subscriber) settleFunc(m *message.Message, token string) func(acked bool) {
	return func(acked bool) {
		select {
		case <-s.t.closing:
			return
		default:
		}
		if s.qs.settle(token) {
			if acked {
				s.t.log.Error("a request was acked without a result, retry or dead letter; handing it back", "queue", s.q.Name, "uuid", m.UUID)
			}
			s.t.releaseRetrying(s.qs, token)
		}
		s.credits.Release(1)
	}
}

// giveUp answers a request claimed more than max_deliveries times with an
// INFERENCE_ERROR result and dead-letters it, in one fenced step.
func (s *subscriber) giveUp(c claimed) {
	t := s.t
	t.gaveUp.Add(1)
	text := fmt.Sprintf("gave up after %d deliveries: each time the lease expired before a result was written (max_deliveries %d)",
		c.deliveries-1, t.opts.MaxDeliveries)
	var res *wire.Result
	if req, err := wire.Decode([]byte(c.member)); err == nil {
		res = wire.ErrorResult(req, wire.CodeInferenceError, text)
	} else if de, ok := wire.AsDecodeError(err); ok && de.ID != "" {
		res = &wire.Result{ID: de.ID, Payload: wire.ErrorPayload(text), Metadata: de.Metadata, ErrorCode: wire.CodeInferenceError, ErrorMessage: text}
	}
	t.log.Error("dead-lettering a request that kept losing its lease", "queue", s.q.Name, "deliveries", c.deliveries-1)
	var err error
	if res != nil {
		err = t.settleRetrying(s.qs, s.q.ResultName, 'b', c.token, res.Marshal(), nil)
	} else {
		err = t.settleRetrying(s.qs, s.q.ResultName, 'd', c.token, nil, []byte(c.member))
	}
	if err != nil {
		t.log.Error("dead-lettering failed; the lease will expire and the request come back", "queue", s.q.Name, "err", err)
	}
}

// Close stops delivering and waits for the delivery loop.
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

// redisNil reports a missing key.
func redisNil(err error) bool { return err == redis.Nil }
