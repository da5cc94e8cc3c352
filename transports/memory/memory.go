// Package memory is sluice's in-process transport and its embedded default:
// request queues ordered by deadline (earliest first, first in first out
// among equal deadlines), a native delay set for retries, in-memory result
// lists and dead-letter lists.
//
// Nothing survives the process: use it for demos, tests, benchmarks and for
// embedding sluice in a program that produces and consumes in-process.
package memory

import (
	"container/heap"
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
)

// Name is the transport's registry name.
const Name = "memory"

// Options are the memory transport's options.
type Options struct {
	// BatchSize is the most messages claimed at once (default 256).
	BatchSize int `json:"batch_size"`
}

func (o *Options) setDefaults() {
	if o.BatchSize <= 0 {
		o.BatchSize = 256
	}
}

// Factory builds the memory transport from its options.
func Factory(options json.RawMessage, _ transport.Env) (transport.Transport, error) {
	var o Options
	if err := transport.DecodeOptions(options, &o); err != nil {
		return nil, err
	}
	return New(o), nil
}

// ErrClosed is returned by operations on a closed transport.
var ErrClosed = errors.New("memory transport closed")

// Transport is the in-memory transport. It is safe for concurrent use.
type Transport struct {
	opts Options
	seq  atomic.Uint64

	mu      sync.Mutex
	queues  map[string]*queue
	results map[string]*resultList
	cancels cancels
	closed  bool
	notify  chan struct{} // closed and replaced whenever a result is published
}

var (
	_ transport.Transport        = (*Transport)(nil)
	_ transport.Requeuer         = (*Transport)(nil)
	_ transport.RequestPublisher = (*Transport)(nil)
	_ transport.DepthReporter    = (*Transport)(nil)
	_ transport.DeadLetterer     = (*Transport)(nil)
	_ transport.ResultRouter     = (*Transport)(nil)
	_ transport.CancelChecker    = (*Transport)(nil)
	_ transport.CancelWatcher    = (*Transport)(nil)
)

// New returns an empty memory transport.
func New(o Options) *Transport {
	o.setDefaults()
	return &Transport{opts: o, queues: map[string]*queue{}, results: map[string]*resultList{}, notify: make(chan struct{})}
}

type item struct {
	deadline int64  // Unix ns; ordering key
	due      int64  // Unix ns; delay-set key
	seq      uint64 // identity: the message's UUID while it is claimed
	order    uint64 // place among equal deadlines: its first enqueue's seq, kept across re-queues
	payload  []byte
	id, job  string // the request's id and metadata.job_id, for Cancel
}

// readyHeap orders by deadline, then first arrival (a re-queued request
// keeps its place, as the sorted set's enqueue sequence does).
type readyHeap []*item

func (h readyHeap) Len() int { return len(h) }
func (h readyHeap) Less(i, j int) bool {
	if h[i].deadline != h[j].deadline {
		return h[i].deadline < h[j].deadline
	}
	return h[i].order < h[j].order
}
func (h readyHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *readyHeap) Push(x any)   { *h = append(*h, x.(*item)) }
func (h *readyHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return it
}

// delayHeap orders by due time, then arrival.
type delayHeap []*item

func (h delayHeap) Len() int { return len(h) }
func (h delayHeap) Less(i, j int) bool {
	if h[i].due != h[j].due {
		return h[i].due < h[j].due
	}
	return h[i].seq < h[j].seq
}
func (h delayHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *delayHeap) Push(x any)   { *h = append(*h, x.(*item)) }
func (h *delayHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return it
}

type queue struct {
	ready       readyHeap
	delayed     delayHeap
	inflight    map[uint64]*item
	deadLetters [][]byte
	wake        chan struct{} // one token: "look again"
}

// q returns the named queue, creating it. Caller holds t.mu.
func (t *Transport) q(name string) *queue {
	qu, ok := t.queues[name]
	if !ok {
		qu = &queue{inflight: map[uint64]*item{}, wake: make(chan struct{}, 1)}
		t.queues[name] = qu
	}
	return qu
}

func (qu *queue) signal() {
	select {
	case qu.wake <- struct{}{}:
	default:
	}
}

// newItem reads the deadline used for ordering, and the id and job
// Cancel matches; an undecodable payload sorts first, so that its
// INVALID_REQUEST answer is not delayed.
func (t *Transport) newItem(payload []byte) *item {
	seq := t.seq.Add(1)
	it := &item{seq: seq, order: seq, payload: payload}
	if r, err := wire.Decode(payload); err == nil {
		it.deadline, it.id, it.job = r.Deadline.UnixNano(), r.ID, r.JobID()
	}
	return it
}

// Enqueue adds a request to queue name. The payload is kept as given.
func (t *Transport) Enqueue(name string, payload []byte) error {
	it := t.newItem(payload)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return ErrClosed
	}
	qu := t.q(name)
	heap.Push(&qu.ready, it)
	qu.signal()
	return nil
}

// EnqueueMany adds requests to queue name in order, in one step.
func (t *Transport) EnqueueMany(name string, payloads [][]byte) error {
	its := make([]*item, len(payloads))
	for i, p := range payloads {
		its[i] = t.newItem(p)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return ErrClosed
	}
	qu := t.q(name)
	for _, it := range its {
		heap.Push(&qu.ready, it)
	}
	qu.signal()
	return nil
}

// PublishRequest implements transport.RequestPublisher.
func (t *Transport) PublishRequest(_ context.Context, q transport.Queue, payload []byte) error {
	return t.Enqueue(q.Name, payload)
}

// Requeue implements transport.Requeuer: payload becomes due at due, ordered
// by its own (original) deadline once due and, among equal deadlines, at
// the place of its first enqueue (a retried or evicted request does not go
// behind the requests enqueued after it). It gets a new identity, so that
// a late settle of the delivery it replaces cannot touch it.
func (t *Transport) Requeue(_ context.Context, q transport.Queue, m *message.Message, payload []byte, due time.Time) error {
	it := t.newItem(payload)
	it.due = due.UnixNano()
	t.mu.Lock()
	defer t.mu.Unlock()
	qu := t.q(q.Name)
	if id, err := strconv.ParseUint(m.UUID, 10, 64); err == nil {
		if old, ok := qu.inflight[id]; ok {
			it.order = old.order
		}
		delete(qu.inflight, id)
	}
	heap.Push(&qu.delayed, it)
	qu.signal()
	return nil
}

// DeadLetter implements transport.DeadLetterer.
func (t *Transport) DeadLetter(_ context.Context, q transport.Queue, m *message.Message, _ string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	qu := t.q(q.Name)
	qu.deadLetters = append(qu.deadLetters, append([]byte(nil), m.Payload...))
	if id, err := strconv.ParseUint(m.UUID, 10, 64); err == nil {
		delete(qu.inflight, id)
	}
	return nil
}

// Depth implements transport.DepthReporter.
func (t *Transport) Depth(_ context.Context, q transport.Queue) (transport.Depth, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	qu := t.q(q.Name)
	return transport.Depth{
		Waiting:      int64(len(qu.ready)),
		InFlight:     int64(len(qu.inflight)),
		Delayed:      int64(len(qu.delayed)),
		DeadLettered: int64(len(qu.deadLetters)),
	}, nil
}

// DeadLetters returns a copy of the dead-lettered payloads of queue name.
func (t *Transport) DeadLetters(name string) [][]byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([][]byte(nil), t.q(name).deadLetters...)
}

// Results returns a copy of the result payloads topic holds (all but
// those acked through AckResults), oldest first.
func (t *Transport) Results(topic string) [][]byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.results[topic].all()
}

// ResultCount returns how many results topic holds (see Results), and a
// channel closed at the next publish (to wait for more without polling).
func (t *Transport) ResultCount(topic string) (int, <-chan struct{}) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.results[topic].len(), t.notify
}

// Publisher implements transport.Transport: results are appended to an
// in-memory list per topic.
func (t *Transport) Publisher(transport.Queue) (message.Publisher, error) {
	return resultPublisher{t}, nil
}

type resultPublisher struct{ t *Transport }

// Publish appends each message's payload to topic's result list.
func (p resultPublisher) Publish(topic string, ms ...*message.Message) error {
	t := p.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return ErrClosed
	}
	l := t.results[topic]
	if l == nil {
		l = &resultList{}
		t.results[topic] = l
	}
	for _, m := range ms {
		l.ready = append(l.ready, resultEntry{seq: t.seq.Add(1), payload: m.Payload})
	}
	close(t.notify)
	t.notify = make(chan struct{})
	return nil
}

// Close does nothing: the transport owns the lists.
func (resultPublisher) Close() error { return nil }

// Source implements transport.Transport.
func (t *Transport) Source(q transport.Queue) (transport.Source, error) {
	return &source{t: t, topic: q.Name}, nil
}

// Close hands back every un-acked message and rejects further use.
func (t *Transport) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil
	}
	t.closed = true
	for _, qu := range t.queues {
		for id, it := range qu.inflight {
			delete(qu.inflight, id)
			heap.Push(&qu.ready, it)
		}
	}
	return nil
}

// source is the broker side of one queue for the claim loop.
type source struct {
	t     *Transport
	topic string
	wake  chan struct{}
	due   time.Duration // after the last claim: the wait until the next delayed item (0: none)
	timer *time.Timer
}

var (
	_ transport.Source     = (*source)(nil)
	_ transport.BatchSizer = (*source)(nil)
)

// BatchSize implements transport.BatchSizer.
func (s *source) BatchSize() int { return s.t.opts.BatchSize }

// Open implements transport.Source.
func (s *source) Open(context.Context) error {
	s.t.mu.Lock()
	defer s.t.mu.Unlock()
	if s.t.closed {
		return ErrClosed
	}
	s.wake = s.t.q(s.topic).wake
	s.timer = time.NewTimer(time.Hour)
	s.timer.Stop()
	return nil
}

// Claim pops up to n due messages, earliest deadline first, promoting
// delayed ones whose time has come.
func (s *source) Claim(_ context.Context, n int) ([]*message.Message, error) {
	t := s.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, ErrClosed
	}
	qu := t.q(s.topic)
	now := time.Now().UnixNano()
	for len(qu.delayed) > 0 && qu.delayed[0].due <= now {
		heap.Push(&qu.ready, heap.Pop(&qu.delayed))
	}
	s.due = 0
	if len(qu.delayed) > 0 {
		s.due = time.Duration(qu.delayed[0].due - now)
	}
	var out []*message.Message
	for len(out) < n && len(qu.ready) > 0 {
		it := heap.Pop(&qu.ready).(*item)
		qu.inflight[it.seq] = it
		out = append(out, message.NewMessage(strconv.FormatUint(it.seq, 10), it.payload))
	}
	return out, nil
}

// Wait waits for an enqueue, the next delayed message's due time, or ctx.
func (s *source) Wait(ctx context.Context) {
	var tick <-chan time.Time
	if s.due > 0 {
		s.timer.Reset(s.due)
		defer s.timer.Stop()
		tick = s.timer.C
	}
	select {
	case <-ctx.Done():
	case <-s.wake:
	case <-tick:
	}
}

// Settle forgets an acked message and hands a nacked one back. It may run
// after the subscription ended: a message in flight at shutdown is settled
// by the core later.
func (s *source) Settle(m *message.Message, acked bool) {
	seq, err := strconv.ParseUint(m.UUID, 10, 64)
	if err != nil {
		return
	}
	t := s.t
	t.mu.Lock()
	defer t.mu.Unlock()
	qu := t.q(s.topic)
	it, ok := qu.inflight[seq]
	if !ok {
		return // re-queued, dead-lettered, or handed back by Transport.Close
	}
	delete(qu.inflight, seq)
	if !acked {
		heap.Push(&qu.ready, it)
		qu.signal()
	}
}

// HandBack returns claimed messages to the ready heap at their old places.
func (s *source) HandBack(ms []*message.Message) {
	for _, m := range ms {
		s.Settle(m, false)
	}
}

// Close does nothing: Transport.Close hands back what is still in flight.
func (s *source) Close() error { return nil }
