// Package wmtransport is sluice's generic Watermill transport ("watermill"):
// any Watermill Publisher/Subscriber pair, wrapped as a Broker, becomes a
// sluice transport. The config names the broker (`broker`) and passes it its
// own options (`broker_options`); brokers are registered explicitly in a
// Brokers registry (cmd/sluice registers the ones it links, an embedder its
// own).
//
// How a queue runs over a broker:
//
//   - credits first: the broker's subscriber pushes messages into a channel;
//     the source takes from it only when the claim loop asks with credits
//     (transport.NewSubscriber), so a gate's budget bounds the requests in
//     flight. What the broker leases ahead is bounded by the window the
//     source subscribes with (the queue's max concurrency, or the window
//     option): the broker sets its prefetch, ack window or parallel reads
//     from it. An idle source holds at most one message it took while
//     waiting, without a credit, until the next claim.
//   - ack after the result: a delivery is acked at the broker only when the
//     core acks it, that is after its result (or retry, or dead letter) was
//     published through the broker's publisher; a nack hands it back.
//   - retries are delayed re-publishes: the new bytes (with the attempt
//     count) are published to the request topic with the metadata
//     sluice_not_before (Unix ms); once that publish returned the old
//     delivery is acked. A broker with a native delay translates that key in
//     its publisher (the message stays invisible until due); on any other
//     the source holds a message not yet due, without a credit, until due.
//   - results are published to the queue's result topic (result_queue_name);
//     dead letters to <queue><dead_letter_suffix> with the metadata
//     sluice_dead_letter_reason.
//   - hand-back: what the source took and never delivered, and what is
//     still un-acked when the transport closes, is nacked (the broker makes
//     it available again).
//
// Delivery is at least once: a result written just before a crash, whose
// ack did not reach the broker, is written again when the request is
// redelivered (a broker with deduplication may drop the second copy).
package wmtransport

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-io/sluice/core/transport"
)

// Name is the transport's registry name.
const Name = "watermill"

// metaDelivery links a delivery (and the result message that carries its
// metadata) to the broker message behind it; never published. The broker
// metadata the transport writes are transport.MetaNotBefore and
// transport.MetaDeadLetterReason.
const metaDelivery = "sluice_wm_delivery"

// Options are the transport's options.
type Options struct {
	// Broker names the broker (a key of the Brokers registry). Required.
	Broker string `json:"broker"`
	// BrokerOptions are the broker's own options (see its package).
	BrokerOptions json.RawMessage `json:"broker_options,omitempty"`
	// Window is how many messages a queue's subscription may hold un-acked
	// at the broker (default: the queue's max_concurrency).
	Window int `json:"window,omitempty"`
	// DeadLetterSuffix names the dead-letter topic <queue><suffix> (default "_dead").
	DeadLetterSuffix string `json:"dead_letter_suffix,omitempty"`
	// CloseTimeoutMS bounds how long Close waits for deliveries in flight
	// to be settled before it nacks them (default 5000).
	CloseTimeoutMS int `json:"close_timeout_ms,omitempty"`
}

func (o *Options) setDefaults() {
	if o.DeadLetterSuffix == "" {
		o.DeadLetterSuffix = "_dead"
	}
	if o.CloseTimeoutMS == 0 {
		o.CloseTimeoutMS = 5000
	}
}

// Validate reports options the transport cannot run with.
func (o *Options) Validate() error {
	var errs []error
	if o.Broker == "" {
		errs = append(errs, errors.New("broker: required (the name of a registered Watermill broker)"))
	}
	if o.Window < 0 {
		errs = append(errs, fmt.Errorf("window %d: must not be negative", o.Window))
	}
	if o.CloseTimeoutMS < 0 {
		errs = append(errs, fmt.Errorf("close_timeout_ms %d: must not be negative", o.CloseTimeoutMS))
	}
	return errors.Join(errs...)
}

// Factory returns the transport factory over the brokers of reg.
func Factory(reg *Brokers) transport.Factory {
	return func(options json.RawMessage, env transport.Env) (transport.Transport, error) {
		return transport.Build(options, env, func(o Options, env transport.Env) (*Transport, error) {
			return New(reg, o, env)
		})
	}
}

// ErrClosed is returned by operations on a closed transport.
var ErrClosed = errors.New("watermill transport closed")

// Transport is the generic Watermill transport. It is safe for concurrent use.
type Transport struct {
	opts   Options
	broker Broker
	log    *slog.Logger

	seq        atomic.Uint64
	deliveries sync.Map // metaDelivery value → broker message, while in flight

	mu      sync.Mutex
	closed  bool
	sources map[*source]struct{}
}

var (
	_ transport.Transport        = (*Transport)(nil)
	_ transport.Requeuer         = (*Transport)(nil)
	_ transport.RequestPublisher = (*Transport)(nil)
	_ transport.DeadLetterer     = (*Transport)(nil)
	_ transport.HealthChecker    = (*Transport)(nil)
	_ transport.EventCounter     = (*Transport)(nil)
)

// Events implements transport.EventCounter with the broker's counts, when
// the broker is a transport.EventCounter itself (none otherwise).
func (t *Transport) Events() map[string]int64 {
	if ec, ok := t.broker.(transport.EventCounter); ok {
		return ec.Events()
	}
	return map[string]int64{}
}

// New builds the transport and its broker (from reg, by o.Broker).
func New(reg *Brokers, o Options, env transport.Env) (*Transport, error) {
	o.setDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	f, err := reg.Lookup(o.Broker)
	if err != nil {
		return nil, err
	}
	b, err := f(o.BrokerOptions, env)
	if err != nil {
		return nil, fmt.Errorf("broker %s: %w", o.Broker, err)
	}
	return NewWithBroker(b, o, env)
}

// NewWithBroker builds the transport over a broker built by the caller
// (o.Broker is then only a name for logs and may be empty).
func NewWithBroker(b Broker, o Options, env transport.Env) (*Transport, error) {
	if o.Broker == "" {
		o.Broker = "custom"
	}
	o.setDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	log := env.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Transport{opts: o, broker: b, log: log.With("transport", Name, "broker", o.Broker), sources: map[*source]struct{}{}}, nil
}

// Options returns the defaulted options.
func (t *Transport) Options() Options { return t.opts }

// Broker returns the transport's broker.
func (t *Transport) Broker() Broker { return t.broker }

// publish publishes m to topic; delivery is the metadata of the delivery
// the write ends (nil for none): its broker message's context values go
// along (see Broker.Publisher).
func (t *Transport) publish(ctx context.Context, topic string, m *message.Message, delivery message.Metadata) error {
	t.mu.Lock()
	closed := t.closed
	t.mu.Unlock()
	if closed {
		return ErrClosed
	}
	m.SetContext(t.deliveryContext(ctx, delivery))
	return t.broker.Publisher().Publish(topic, m)
}

// deliveryContext is ctx, whose values fall back to those of the broker
// message behind the delivery with metadata md.
func (t *Transport) deliveryContext(ctx context.Context, md message.Metadata) context.Context {
	if id := md.Get(metaDelivery); id != "" {
		if bm, ok := t.deliveries.Load(id); ok {
			return withValues{Context: ctx, values: bm.(*message.Message).Context()}
		}
	}
	return ctx
}

// withValues is a context whose values fall back to another context's.
type withValues struct {
	context.Context
	values context.Context
}

func (c withValues) Value(key any) any {
	if v := c.Context.Value(key); v != nil {
		return v
	}
	return c.values.Value(key)
}

// requestMetadata copies a delivery's metadata without the transport's own keys.
func requestMetadata(md message.Metadata) message.Metadata {
	out := make(message.Metadata, len(md))
	for k, v := range md {
		if k != transport.MetaNotBefore && k != transport.MetaDeadLetterReason && k != metaDelivery {
			out[k] = v
		}
	}
	return out
}

// PublishRequest implements transport.RequestPublisher.
func (t *Transport) PublishRequest(ctx context.Context, q transport.Queue, payload []byte) error {
	if err := t.publish(ctx, q.Name, message.NewMessage(watermill.NewUUID(), payload), nil); err != nil {
		return fmt.Errorf("publish request to %s: %w", q.Name, err)
	}
	return nil
}

// Requeue implements transport.Requeuer: payload is published to the
// request topic with sluice_not_before = due (brokers with a native delay
// hide it until then); the core then acks the old delivery.
func (t *Transport) Requeue(ctx context.Context, q transport.Queue, m *message.Message, payload []byte, due time.Time) error {
	nm := message.NewMessage(watermill.NewUUID(), payload)
	nm.Metadata = requestMetadata(m.Metadata)
	if time.Until(due) > 0 {
		nm.Metadata.Set(transport.MetaNotBefore, strconv.FormatInt(due.UnixMilli(), 10))
	}
	if err := t.publish(ctx, q.Name, nm, m.Metadata); err != nil {
		return fmt.Errorf("requeue on %s: %w", q.Name, err)
	}
	return nil
}

// DeadLetter implements transport.DeadLetterer: the message goes to
// <queue><dead_letter_suffix> with its metadata and the reason.
func (t *Transport) DeadLetter(ctx context.Context, q transport.Queue, m *message.Message, reason string) error {
	dm := message.NewMessage(watermill.NewUUID(), m.Payload)
	dm.Metadata = requestMetadata(m.Metadata)
	dm.Metadata.Set(transport.MetaDeadLetterReason, reason)
	topic := q.Name + t.opts.DeadLetterSuffix
	if err := t.publish(ctx, topic, dm, m.Metadata); err != nil {
		return fmt.Errorf("dead-letter from %s to %s: %w", q.Name, topic, err)
	}
	return nil
}

// Publisher implements transport.Transport: results go through the
// broker's publisher (shared; Close does nothing). A result carries its
// delivery's metadata: the broker message's context values go along with
// it, so a broker can write it in the delivery's own transaction.
func (t *Transport) Publisher(transport.Queue) (message.Publisher, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, ErrClosed
	}
	return resultPublisher{t}, nil
}

type resultPublisher struct{ t *Transport }

func (p resultPublisher) Publish(topic string, ms ...*message.Message) error {
	out := make([]*message.Message, len(ms))
	for i, m := range ms {
		nm := message.NewMessage(m.UUID, m.Payload)
		nm.Metadata = requestMetadata(m.Metadata)
		nm.SetContext(p.t.deliveryContext(m.Context(), m.Metadata))
		out[i] = nm
	}
	return p.t.broker.Publisher().Publish(topic, out...)
}

func (resultPublisher) Close() error { return nil }

// Source implements transport.Transport.
func (t *Transport) Source(q transport.Queue) (transport.Source, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, ErrClosed
	}
	window := t.opts.Window
	if window == 0 {
		window = max(q.MaxConcurrency, 1)
	}
	return newSource(t, q, window), nil
}

// CheckHealth implements transport.HealthChecker through the broker's
// HealthChecker; a broker without one is taken as healthy while the
// transport is open.
func (t *Transport) CheckHealth(ctx context.Context, _ []transport.Queue) error {
	t.mu.Lock()
	closed := t.closed
	t.mu.Unlock()
	if closed {
		return ErrClosed
	}
	if h, ok := t.broker.(HealthChecker); ok {
		if err := h.CheckHealth(ctx); err != nil {
			return fmt.Errorf("broker %s: %w", t.opts.Broker, err)
		}
	}
	return nil
}

// Close waits up to close_timeout_ms for deliveries in flight to be
// settled, nacks the rest (the broker makes them available again), ends
// every subscription and closes the broker.
func (t *Transport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	srcs := make([]*source, 0, len(t.sources))
	for s := range t.sources {
		srcs = append(srcs, s)
	}
	t.mu.Unlock()
	deadline := time.Now().Add(time.Duration(t.opts.CloseTimeoutMS) * time.Millisecond)
	var errs []error
	for _, s := range srcs {
		s.drainInflight(time.Until(deadline))
		if err := s.stop(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := t.broker.Close(); err != nil {
		errs = append(errs, fmt.Errorf("close broker %s: %w", t.opts.Broker, err))
	}
	return errors.Join(errs...)
}

func (t *Transport) track(s *source) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return ErrClosed
	}
	t.sources[s] = struct{}{}
	return nil
}

func (t *Transport) untrack(s *source) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.sources, s)
}
