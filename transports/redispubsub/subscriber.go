package redispubsub

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/transport"
)

// source reads one channel into a bounded buffer; the claim loop
// (transport.NewSubscriber) takes from it within the queue's credits.
type source struct {
	t *Transport

	mu       sync.Mutex
	space    *sync.Cond // broadcast when the buffer shrinks or the subscriber closes
	buf      [][]byte   // received, not delivered; FIFO
	inflight map[*message.Message][]byte
	topic    string
	started  bool
	closed   bool
	ps       *redis.PubSub

	avail chan struct{} // one token: "the buffer may hold something"
	done  chan struct{}
	loops sync.WaitGroup
}

var _ transport.Source = (*source)(nil)

// Open SUBSCRIBEs to the channel and returns once Redis confirmed it, so a
// request published after Subscribe returns is heard. Reading stops when ctx
// ends or the transport closes.
func (s *source) Open(ctx context.Context) error {
	topic := s.topic
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	s.started = true
	s.avail = make(chan struct{}, 1)
	s.mu.Unlock()

	ps := s.t.client.Subscribe(ctx, topic)
	reply, err := ps.Receive(ctx)
	if err != nil {
		_ = ps.Close()
		return fmt.Errorf("subscribe %s: %w", topic, err)
	}
	if _, ok := reply.(*redis.Subscription); !ok {
		_ = ps.Close()
		return fmt.Errorf("subscribe %s: unexpected reply %T", topic, reply)
	}
	s.mu.Lock()
	s.ps = ps
	closed := s.closed
	s.mu.Unlock()
	if closed {
		_ = ps.Close()
		return ErrClosed
	}

	ctx, cancel := context.WithCancel(ctx)
	// The reader has a context of its own: on the way out it keeps reading
	// until Redis confirms the UNSUBSCRIBE, so what Redis sent before that is
	// buffered (or handed to the retry set), not dropped with the connection.
	readCtx, stopRead := context.WithCancel(context.Background())
	readDone := make(chan struct{})
	s.loops.Add(2)
	go func() {
		defer s.loops.Done()
		select {
		case <-ctx.Done():
		case <-s.done:
		}
		uctx, ucancel := context.WithTimeout(context.Background(), unsubscribeDrain)
		if err := ps.Unsubscribe(uctx, topic); err == nil {
			select {
			case <-readDone:
			case <-uctx.Done():
			}
		}
		ucancel()
		stopRead()
		cancel()
		_ = ps.Close() // unblocks the reader if it still waits
		s.mu.Lock()
		s.space.Broadcast()
		s.mu.Unlock()
	}()
	go func() {
		defer s.loops.Done()
		defer close(readDone)
		s.read(readCtx, ps)
	}()
	s.t.startMover()
	return nil
}

func (s *source) signal() {
	select {
	case s.avail <- struct{}{}:
	default:
	}
}

// unsubscribeDrain bounds the wait for Redis to confirm an UNSUBSCRIBE.
const unsubscribeDrain = 2 * time.Second

// read moves messages from the subscription into the buffer; a full buffer
// stops it (backpressure to Redis). It returns when Redis confirms the
// UNSUBSCRIBE sent on the way out, or when ctx ends.
func (s *source) read(ctx context.Context, ps *redis.PubSub) {
	for {
		reply, err := ps.Receive(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return
			}
			s.t.stats.interruptions.Add(1)
			s.t.log.Warn("subscription interrupted; requests published meanwhile may be lost", "channel", s.topic, "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		var m *redis.Message
		switch r := reply.(type) {
		case *redis.Message:
			m = r
		case *redis.Subscription:
			if r.Kind == "unsubscribe" {
				return
			}
			continue
		default:
			continue
		}
		s.t.stats.received.Add(1)
		payload := []byte(m.Payload)
		s.mu.Lock()
		for len(s.buf) >= s.t.opts.BufferSize && !s.closed && ctx.Err() == nil {
			s.space.Wait()
		}
		if s.closed || ctx.Err() != nil {
			s.mu.Unlock()
			s.park([][]byte{payload}, "subscriber closing")
			continue
		}
		s.buf = append(s.buf, payload)
		s.mu.Unlock()
		s.signal()
	}
}

// take pops up to n buffered payloads.
func (s *source) take(n int) [][]byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n > len(s.buf) {
		n = len(s.buf)
	}
	out := make([][]byte, n)
	copy(out, s.buf[:n])
	clear(s.buf[:n])
	s.buf = s.buf[n:]
	if len(s.buf) > 0 {
		s.signal()
	}
	if n > 0 {
		s.space.Broadcast()
	}
	return out
}

// putBack returns payloads to the front of the buffer.
func (s *source) putBack(ps [][]byte) {
	s.mu.Lock()
	s.buf = append(append(make([][]byte, 0, len(ps)+len(s.buf)), ps...), s.buf...)
	s.mu.Unlock()
	s.signal()
}

func (s *source) buffered() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.buf) > 0
}

// Claim takes up to n buffered requests.
func (s *source) Claim(_ context.Context, n int) ([]*message.Message, error) {
	items := s.take(n)
	out := make([]*message.Message, len(items))
	s.mu.Lock()
	for i, p := range items {
		m := message.NewMessage(strconv.FormatUint(s.t.seq.Add(1), 10), p)
		s.inflight[m] = p
		out[i] = m
	}
	s.mu.Unlock()
	s.t.stats.delivered.Add(int64(len(out)))
	return out, nil
}

// Wait waits until the buffer may hold something, or ctx ends.
func (s *source) Wait(ctx context.Context) {
	if s.buffered() {
		return
	}
	select {
	case <-ctx.Done():
	case <-s.avail:
	}
}

// Settle forgets an acked delivery and hands a nacked one back: to the
// buffer, or to the retry set once the subscription is closed.
func (s *source) Settle(m *message.Message, acked bool) {
	s.mu.Lock()
	p, mine := s.inflight[m]
	delete(s.inflight, m)
	closed := s.closed
	s.mu.Unlock()
	if acked || !mine {
		return // acked, or already handed back by Transport.Close
	}
	if closed {
		s.park([][]byte{p}, "nacked after close")
		return
	}
	s.putBack([][]byte{p})
}

// HandBack returns claimed but undelivered requests to the front of the
// buffer (Close parks the buffer in the retry set).
func (s *source) HandBack(ms []*message.Message) {
	ps := make([][]byte, 0, len(ms))
	s.mu.Lock()
	for _, m := range ms {
		if p, ok := s.inflight[m]; ok {
			delete(s.inflight, m)
			ps = append(ps, p)
		}
	}
	s.mu.Unlock()
	s.putBack(ps)
}

// park hands payloads to the retry set, due now; a failure is logged with
// the payloads, so nothing is lost silently.
func (s *source) park(ps [][]byte, why string) {
	if len(ps) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, p := range ps {
		if err := s.t.park(ctx, s.topic, p, time.Now()); err != nil {
			s.t.log.Error("could not hand a request back to the retry set: lost", "channel", s.topic, "why", why, "payload", string(p), "err", err)
			continue
		}
		s.t.stats.handedBack.Add(1)
	}
}

// handBackInflight parks every un-acked delivery (transport closing).
func (s *source) handBackInflight() {
	s.mu.Lock()
	ps := make([][]byte, 0, len(s.inflight))
	for m, p := range s.inflight {
		ps = append(ps, p)
		delete(s.inflight, m)
	}
	s.mu.Unlock()
	s.park(ps, "transport closing")
}

func (s *source) depth(topic string) (waiting, inflight int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.topic != topic {
		return 0, 0
	}
	return int64(len(s.buf)), int64(len(s.inflight))
}

// Close stops reading and hands the buffered requests to the retry set.
// Deliveries in flight are still settled when acked or nacked.
func (s *source) Close() error {
	s.stop()
	return nil
}

// stop is Close; Transport.Close calls it too.
func (s *source) stop() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	close(s.done)
	s.space.Broadcast()
	started := s.started
	s.mu.Unlock()
	if started {
		s.loops.Wait()
	}
	s.mu.Lock()
	rest := s.buf
	s.buf = nil
	s.mu.Unlock()
	s.park(rest, "subscriber closing")
	// It stays in t.subs: Transport.Close hands back what is still in flight.
}
