package wmtransport

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-io/sluice/core/transport"
)

// source is the broker side of one request queue for the claim loop. The
// broker's subscription runs from Open until the source is closed and its
// last delivery settled (or the transport closes), so that a delivery
// settled after the claim loop stopped still reaches the broker.
type source struct {
	t      *Transport
	q      transport.Queue
	window int

	// Loop goroutine only (Open, Claim, Wait; HandBack and Close after the loop).
	ch    <-chan *message.Message
	stash *message.Message // taken by an idle Wait, handed out by the next Claim
	held  heldHeap         // not yet due (sluice_not_before), holding no credit
	timer *time.Timer

	mu       sync.Mutex
	sub      message.Subscriber
	cancel   context.CancelFunc // ends the broker subscription
	inflight map[*message.Message]*message.Message
	closing  bool          // Close was called: stop once inflight is empty
	stopped  bool          // the broker subscription was ended
	idle     chan struct{} // closed when inflight becomes empty while closing
}

var _ transport.Source = (*source)(nil)

func newSource(t *Transport, q transport.Queue, window int) *source {
	return &source{t: t, q: q, window: window, inflight: map[*message.Message]*message.Message{}, idle: make(chan struct{})}
}

// Open subscribes to the queue's topic at the broker. The subscription
// outlives ctx: it ends when the source is closed and every delivery was
// settled, or when the transport closes.
func (s *source) Open(context.Context) error {
	if err := s.t.track(s); err != nil {
		return err
	}
	sub, err := s.t.broker.Subscriber(s.q.Name, s.window)
	if err != nil {
		s.t.untrack(s)
		return fmt.Errorf("broker subscriber for %s: %w", s.q.Name, err)
	}
	bctx, cancel := context.WithCancel(context.Background())
	ch, err := sub.Subscribe(bctx, s.q.Name)
	if err != nil {
		cancel()
		_ = sub.Close()
		s.t.untrack(s)
		return fmt.Errorf("subscribe %s: %w", s.q.Name, err)
	}
	s.mu.Lock()
	s.sub, s.cancel = sub, cancel
	s.mu.Unlock()
	s.ch = ch
	s.timer = time.NewTimer(time.Hour)
	s.timer.Stop()
	return nil
}

// ErrSubscriptionEnded is returned by Claim once the broker closed the
// subscription's channel by itself.
var ErrSubscriptionEnded = errors.New("broker subscription ended")

// notBefore reads a message's due time (zero: due now).
func notBefore(m *message.Message) time.Time {
	v := m.Metadata.Get(transport.MetaNotBefore)
	if v == "" {
		return time.Time{}
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}

// take sorts a message from the broker: due now (true), or held until due.
func (s *source) take(bm *message.Message, now time.Time) bool {
	if due := notBefore(bm); due.After(now) {
		heap.Push(&s.held, heldMsg{due: due, m: bm})
		return false
	}
	return true
}

// deliver turns a broker message into the core's delivery.
func (s *source) deliver(bm *message.Message) *message.Message {
	cm := message.NewMessage(bm.UUID, bm.Payload)
	cm.Metadata = requestMetadata(bm.Metadata)
	id := strconv.FormatUint(s.t.seq.Add(1), 36)
	cm.Metadata.Set(metaDelivery, id)
	s.t.deliveries.Store(id, bm)
	s.mu.Lock()
	s.inflight[cm] = bm
	s.mu.Unlock()
	return cm
}

// Claim takes up to n due messages: held ones that fell due, the stash,
// then what the broker has pushed, without waiting.
func (s *source) Claim(_ context.Context, n int) ([]*message.Message, error) {
	now := time.Now()
	out := make([]*message.Message, 0, min(n, 64))
	for len(out) < n && len(s.held) > 0 && !s.held[0].due.After(now) {
		out = append(out, s.deliver(heap.Pop(&s.held).(heldMsg).m))
	}
	if bm := s.stash; bm != nil && len(out) < n {
		s.stash = nil
		out = append(out, s.deliver(bm))
	}
	for len(out) < n {
		select {
		case bm, ok := <-s.ch:
			if !ok {
				if len(out) > 0 {
					return out, nil
				}
				return nil, fmt.Errorf("claim %s: %w", s.q.Name, ErrSubscriptionEnded)
			}
			if s.take(bm, now) {
				out = append(out, s.deliver(bm))
			}
		default:
			return out, nil
		}
	}
	return out, nil
}

// Wait waits until the broker pushes a message that is due (kept for the
// next Claim), a held one falls due, or ctx ends.
func (s *source) Wait(ctx context.Context) {
	for s.stash == nil {
		var tick <-chan time.Time
		if len(s.held) > 0 {
			d := time.Until(s.held[0].due)
			if d <= 0 {
				return
			}
			s.timer.Reset(d)
			tick = s.timer.C
		}
		select {
		case <-ctx.Done():
			s.timer.Stop()
			return
		case <-tick:
			return
		case bm, ok := <-s.ch:
			s.timer.Stop()
			if !ok {
				return // the next Claim reports it
			}
			if s.take(bm, time.Now()) {
				s.stash = bm
			}
		}
	}
}

// Settle acks or nacks the broker message behind a delivery. It may run
// after Close: the subscription lives until the last delivery is settled.
func (s *source) Settle(m *message.Message, acked bool) {
	s.mu.Lock()
	bm := s.inflight[m]
	delete(s.inflight, m)
	drained := s.closing && len(s.inflight) == 0
	s.mu.Unlock()
	s.t.deliveries.Delete(m.Metadata.Get(metaDelivery))
	if bm != nil {
		if acked {
			bm.Ack()
		} else {
			bm.Nack()
		}
	}
	if drained {
		s.signalIdle()
		_ = s.stop()
	}
}

// HandBack nacks deliveries that were claimed and never delivered.
func (s *source) HandBack(ms []*message.Message) {
	for _, m := range ms {
		s.Settle(m, false)
	}
}

// Close hands back the stash and the held messages and ends the broker
// subscription once no delivery is in flight (else the last Settle or
// Transport.Close ends it).
func (s *source) Close() error {
	if bm := s.stash; bm != nil {
		s.stash = nil
		bm.Nack()
	}
	for len(s.held) > 0 {
		heap.Pop(&s.held).(heldMsg).m.Nack()
	}
	s.mu.Lock()
	s.closing = true
	drained := len(s.inflight) == 0
	s.mu.Unlock()
	if drained {
		s.signalIdle()
		return s.stop()
	}
	return nil
}

func (s *source) signalIdle() {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.idle:
	default:
		close(s.idle)
	}
}

// drainInflight waits up to d for the deliveries in flight to be settled,
// then nacks what is left (Transport.Close).
func (s *source) drainInflight(d time.Duration) {
	s.mu.Lock()
	s.closing = true
	empty := len(s.inflight) == 0
	s.mu.Unlock()
	if !empty && d > 0 {
		t := time.NewTimer(d)
		select {
		case <-s.idle:
		case <-t.C:
		}
		t.Stop()
	}
	s.mu.Lock()
	left := s.inflight
	s.inflight = map[*message.Message]*message.Message{}
	s.mu.Unlock()
	for cm, bm := range left {
		s.t.deliveries.Delete(cm.Metadata.Get(metaDelivery))
		bm.Nack()
	}
	if len(left) > 0 {
		s.t.log.Warn("deliveries still in flight at close; handed back", "queue", s.q.Name, "count", len(left))
	}
}

// stop ends the broker subscription and closes its subscriber, once.
func (s *source) stop() error {
	s.mu.Lock()
	if s.stopped || s.sub == nil {
		s.stopped = true
		s.mu.Unlock()
		s.t.untrack(s)
		return nil
	}
	s.stopped = true
	sub, cancel := s.sub, s.cancel
	s.mu.Unlock()
	cancel()
	// What the broker pushed after the loop stopped goes back to it.
	go func() {
		for bm := range s.ch {
			bm.Nack()
		}
	}()
	err := sub.Close()
	s.t.untrack(s)
	if err != nil {
		return fmt.Errorf("close broker subscriber of %s: %w", s.q.Name, err)
	}
	return nil
}

// heldMsg is a message held until due.
type heldMsg struct {
	due time.Time
	m   *message.Message
}

// heldHeap orders held messages by due time.
type heldHeap []heldMsg

func (h heldHeap) Len() int           { return len(h) }
func (h heldHeap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h heldHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *heldHeap) Push(x any)        { *h = append(*h, x.(heldMsg)) }
func (h *heldHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
