// Package natsjetstream is the NATS JetStream broker of sluice's generic
// Watermill transport (transport "watermill", broker "nats-jetstream").
//
// It implements Watermill's Publisher and Subscriber on the NATS Go client
// (github.com/nats-io/nats.go, its jetstream package) rather than using
// watermill-nats/v2's JetStream subscriber, which the module proxy serves
// (v2.1.3) but which does not fit a dispatcher of long requests: it hands
// out one message per subscription at a time (its consume callback blocks
// until the ack, so a subscription runs at 1/latency), silently drops a
// message not acked within its AckWaitTimeout (30 s by default; the server
// redelivers it later, so a long LLM call runs twice), and closes its output
// channel while handlers may still send on it. Here:
//
//   - one durable pull consumer per request stream, shared by every sluice
//     replica (each message to one replica); the subscriber fetches only
//     while fewer than window messages are un-acked, so it never leases more
//     than the queue can run;
//   - an un-acked message is kept leased with InProgress every ack_wait/3
//     however long its request runs; a replica that dies stops doing so and
//     its messages are redelivered after ack_wait;
//   - acks wait for the server's confirmation (DoubleAck), nacks redeliver
//     at once, and what is un-acked when a subscription ends is nacked;
//   - publishes wait for the stream's acknowledgement (stored on a quorum of
//     a replicated stream) and carry Nats-Msg-Id = the message UUID, so a
//     publish retried after a lost acknowledgement, or a result written again
//     for a redelivered request, is dropped by the stream's duplicate window;
//   - streams are created on first use (one per topic, subject = topic,
//     replicas, storage and retention from the options).
//
// Message form is watermill-nats's: data is the payload, the header
// _watermill_message_uuid the UUID, other headers the metadata, so Watermill
// producers and consumers interoperate. NATS JetStream has no delayed
// publish (before server 2.12), so re-queued retries are held by the
// transport's source until due (kept leased with InProgress).
package natsjetstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/cenkalti/backoff/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/internal/retry"
	"github.com/sluice-io/sluice/transports/wmtransport"
)

// Name is the broker's registry name.
const Name = "nats-jetstream"

// UUIDHeader carries a message's Watermill UUID (watermill-nats's header).
const UUIDHeader = "_watermill_message_uuid"

// Options are the broker's options (broker_options).
type Options struct {
	// URL is one or more server URLs, comma-separated (default nats://127.0.0.1:4222).
	URL string `json:"url,omitempty"`
	// Consumer is the durable consumer every replica shares (default "sluice").
	Consumer string `json:"consumer,omitempty"`
	// Replicas is the replication factor of streams this broker creates (default 1; 3 on a 3-node cluster).
	Replicas int `json:"replicas,omitempty"`
	// Storage of created streams: "file" (default) or "memory".
	Storage string `json:"storage,omitempty"`
	// Retention of created streams: "workqueue" (default: a message is
	// deleted once acked) or "limits".
	Retention string `json:"retention,omitempty"`
	// NoCreateStreams uses existing streams only (named after the topic, see StreamName).
	NoCreateStreams bool `json:"no_create_streams,omitempty"`
	// AckWaitMS: a delivery not acked nor touched for this long is
	// redelivered (default 30000; in-flight ones are touched every ack_wait/3).
	AckWaitMS int `json:"ack_wait_ms,omitempty"`
	// MaxAckPending bounds the un-acked messages of the shared consumer,
	// all replicas together (default 0: the server's, 1000).
	MaxAckPending int `json:"max_ack_pending,omitempty"`
	// FetchWaitMS is how long one idle fetch waits for messages (default 1000).
	FetchWaitMS int `json:"fetch_wait_ms,omitempty"`
	// PublishTimeoutMS bounds one publish, retries included (default 10000).
	PublishTimeoutMS int `json:"publish_timeout_ms,omitempty"`
	// DuplicateWindowSeconds is the deduplication window of created
	// streams (default 120).
	DuplicateWindowSeconds int `json:"duplicate_window_seconds,omitempty"`
}

func (o *Options) setDefaults() {
	if o.URL == "" {
		o.URL = nats.DefaultURL
	}
	if o.Consumer == "" {
		o.Consumer = "sluice"
	}
	if o.Replicas == 0 {
		o.Replicas = 1
	}
	if o.Storage == "" {
		o.Storage = "file"
	}
	if o.Retention == "" {
		o.Retention = "workqueue"
	}
	if o.AckWaitMS == 0 {
		o.AckWaitMS = 30000
	}
	if o.FetchWaitMS == 0 {
		o.FetchWaitMS = 1000
	}
	if o.PublishTimeoutMS == 0 {
		o.PublishTimeoutMS = 10000
	}
	if o.DuplicateWindowSeconds == 0 {
		o.DuplicateWindowSeconds = 120
	}
}

var consumerName = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// Validate reports options the broker cannot run with.
func (o *Options) Validate() error {
	var errs []error
	if !consumerName.MatchString(o.Consumer) {
		errs = append(errs, fmt.Errorf("consumer %q: letters, digits, _ and - only", o.Consumer))
	}
	if o.Replicas < 1 || o.Replicas > 5 {
		errs = append(errs, fmt.Errorf("replicas %d: must be 1 to 5", o.Replicas))
	}
	if o.Storage != "file" && o.Storage != "memory" {
		errs = append(errs, fmt.Errorf("storage %q: want \"file\" or \"memory\"", o.Storage))
	}
	if o.Retention != "workqueue" && o.Retention != "limits" {
		errs = append(errs, fmt.Errorf("retention %q: want \"workqueue\" or \"limits\"", o.Retention))
	}
	if o.AckWaitMS < 1000 {
		errs = append(errs, fmt.Errorf("ack_wait_ms %d: must be at least 1000", o.AckWaitMS))
	}
	if o.MaxAckPending < -1 {
		errs = append(errs, fmt.Errorf("max_ack_pending %d: must be -1 (unlimited), 0 (server default) or positive", o.MaxAckPending))
	}
	if o.FetchWaitMS < 10 || o.FetchWaitMS >= o.AckWaitMS {
		errs = append(errs, fmt.Errorf("fetch_wait_ms %d: must be at least 10 and below ack_wait_ms", o.FetchWaitMS))
	}
	if o.PublishTimeoutMS < 1 {
		errs = append(errs, fmt.Errorf("publish_timeout_ms %d: must be positive", o.PublishTimeoutMS))
	}
	if o.DuplicateWindowSeconds < 1 {
		errs = append(errs, fmt.Errorf("duplicate_window_seconds %d: must be positive", o.DuplicateWindowSeconds))
	}
	return errors.Join(errs...)
}

// Factory is the broker's wmtransport.BrokerFactory. It connects lazily.
func Factory(options json.RawMessage, env transport.Env) (wmtransport.Broker, error) {
	return wmtransport.BuildBroker(options, env, New)
}

// Broker is the NATS JetStream broker. It is safe for concurrent use.
type Broker struct {
	opts Options
	log  *slog.Logger

	mu      sync.Mutex
	nc      *nats.Conn
	js      jetstream.JetStream
	streams map[string]bool // topics whose stream exists
	closed  bool

	ackErrors atomic.Int64
}

var (
	_ wmtransport.Broker        = (*Broker)(nil)
	_ wmtransport.HealthChecker = (*Broker)(nil)
)

// New builds the broker; it connects on first use.
func New(o Options, env transport.Env) (*Broker, error) {
	o.setDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	log := env.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Broker{opts: o, log: log.With("broker", Name), streams: map[string]bool{}}, nil
}

// Options returns the defaulted options.
func (b *Broker) Options() Options { return b.opts }

// AckErrors counts acks the server did not confirm (the message is redelivered after ack_wait).
func (b *Broker) AckErrors() int64 { return b.ackErrors.Load() }

var _ transport.EventCounter = (*Broker)(nil)

// Events implements transport.EventCounter (sluice_transport_events_total):
// ack_unconfirmed counts acks the server did not confirm.
func (b *Broker) Events() map[string]int64 {
	return map[string]int64{"ack_unconfirmed": b.ackErrors.Load()}
}

// conn returns the shared connection, connecting on first use. It
// reconnects forever (to any server of the cluster) once connected.
func (b *Broker) conn() (jetstream.JetStream, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, wmtransport.ErrClosed
	}
	if b.js != nil {
		return b.js, nil
	}
	nc, err := nats.Connect(b.opts.URL, nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond),
		nats.RetryOnFailedConnect(false), nats.Name("sluice"))
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", b.opts.URL, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	b.nc, b.js = nc, js
	return js, nil
}

var streamChars = regexp.MustCompile(`[^A-Za-z0-9_-]`)

// StreamName is the name of the stream holding topic's messages: the
// topic with every character other than letters, digits, _ and - replaced
// by _.
func StreamName(topic string) string { return streamChars.ReplaceAllString(topic, "_") }

// ensureStream makes sure topic's stream exists (creating it unless
// no_create_streams) and returns its name.
func (b *Broker) ensureStream(ctx context.Context, js jetstream.JetStream, topic string) (string, error) {
	name := StreamName(topic)
	b.mu.Lock()
	ok := b.streams[topic]
	b.mu.Unlock()
	if ok {
		return name, nil
	}
	_, err := js.Stream(ctx, name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound) && !b.opts.NoCreateStreams:
		cfg := jetstream.StreamConfig{Name: name, Subjects: []string{topic}, Replicas: b.opts.Replicas,
			Storage: jetstream.FileStorage, Retention: jetstream.WorkQueuePolicy,
			Duplicates: time.Duration(b.opts.DuplicateWindowSeconds) * time.Second}
		if b.opts.Storage == "memory" {
			cfg.Storage = jetstream.MemoryStorage
		}
		if b.opts.Retention == "limits" {
			cfg.Retention = jetstream.LimitsPolicy
		}
		if _, err = js.CreateStream(ctx, cfg); err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return "", fmt.Errorf("create stream %s for %s: %w", name, topic, err)
		}
	case err != nil:
		return "", fmt.Errorf("stream %s for %s: %w", name, topic, err)
	}
	b.mu.Lock()
	b.streams[topic] = true
	b.mu.Unlock()
	return name, nil
}

// Publisher implements wmtransport.Broker.
func (b *Broker) Publisher() message.Publisher { return publisher{b} }

type publisher struct{ b *Broker }

// Publish publishes each message to topic and waits for the stream's
// acknowledgement (retrying while the stream has no leader, within
// publish_timeout_ms).
func (p publisher) Publish(topic string, ms ...*message.Message) error {
	b := p.b
	js, err := b.conn()
	if err != nil {
		return err
	}
	for _, m := range ms {
		ctx, cancel := context.WithTimeout(m.Context(), time.Duration(b.opts.PublishTimeoutMS)*time.Millisecond)
		err := b.publishOne(ctx, js, topic, m)
		cancel()
		if err != nil {
			return fmt.Errorf("publish to %s: %w", topic, err)
		}
	}
	return nil
}

func (b *Broker) publishOne(ctx context.Context, js jetstream.JetStream, topic string, m *message.Message) error {
	nm := nats.NewMsg(topic)
	nm.Data = m.Payload
	nm.Header.Set(UUIDHeader, m.UUID)
	for k, v := range m.Metadata {
		nm.Header.Set(k, v)
	}
	var last error // what the last try failed with, rather than ctx's end
	publish := func() (struct{}, error) {
		_, err := b.ensureStream(ctx, js, topic)
		if err == nil {
			_, err = js.PublishMsg(ctx, nm, jetstream.WithMsgID(m.UUID))
		}
		if err != nil {
			last = err
		}
		return struct{}{}, err
	}
	_, err := publish() // the common case: no backoff state at all
	if err == nil {
		return nil
	}
	// A stream electing a leader, a server going away: try again until the
	// publish timeout (the Msg-Id drops a duplicate).
	if _, err = backoff.Retry(ctx, retry.After(err, publish),
		backoff.WithBackOff(retry.Doubling(publishRetryFirst, publishRetryMax)),
		backoff.WithMaxElapsedTime(0)); err != nil {
		return last
	}
	return nil
}

// A publish that failed is tried again after publishRetryFirst, then
// twice as long each time up to publishRetryMax, until its timeout.
const (
	publishRetryFirst = 50 * time.Millisecond
	publishRetryMax   = time.Second
)

// Close does nothing: Broker.Close closes the connection.
func (publisher) Close() error { return nil }

// Subscriber implements wmtransport.Broker: a subscriber of topic through
// the shared durable consumer, holding at most window messages un-acked.
func (b *Broker) Subscriber(topic string, window int) (message.Subscriber, error) {
	return &subscriber{b: b, topic: topic, window: max(window, 1), closing: make(chan struct{}), freed: make(chan struct{}, 1)}, nil
}

// CheckHealth implements wmtransport.HealthChecker: the connection is up
// and JetStream answers (one account-info request).
func (b *Broker) CheckHealth(ctx context.Context) error {
	js, err := b.conn()
	if err != nil {
		return err
	}
	if _, err := js.AccountInfo(ctx); err != nil {
		return fmt.Errorf("jetstream account info: %w", err)
	}
	return nil
}

// Close closes the connection.
func (b *Broker) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	if b.nc != nil {
		b.nc.Close()
	}
	return nil
}

type subscriber struct {
	b      *Broker
	topic  string
	window int

	outstanding atomic.Int64  // fetched and not yet acked or nacked
	freed       chan struct{} // a token when outstanding falls
	closing     chan struct{}
	closeOnce   sync.Once
	wg          sync.WaitGroup
}

// Subscribe creates the stream and the durable consumer if needed and
// starts fetching. The channel closes when ctx ends or the subscriber
// closes, after every delivery was acked or nacked (un-settled ones are
// nacked then).
func (s *subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if topic != s.topic {
		return nil, fmt.Errorf("subscriber of %s cannot subscribe to %s", s.topic, topic)
	}
	js, err := s.b.conn()
	if err != nil {
		return nil, err
	}
	stream, err := s.b.ensureStream(ctx, js, topic)
	if err != nil {
		return nil, err
	}
	cfg := jetstream.ConsumerConfig{Durable: s.b.opts.Consumer, AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: time.Duration(s.b.opts.AckWaitMS) * time.Millisecond, MaxDeliver: -1, MaxAckPending: s.b.opts.MaxAckPending}
	cons, err := js.CreateOrUpdateConsumer(ctx, stream, cfg)
	if err != nil {
		return nil, fmt.Errorf("consumer %s on stream %s: %w", cfg.Durable, stream, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	out := make(chan *message.Message)
	s.wg.Add(1)
	go func() {
		select {
		case <-ctx.Done():
		case <-s.closing:
		}
		cancel()
	}()
	go func() {
		defer s.wg.Done()
		s.fetch(ctx, cons, out)
	}()
	go func() {
		s.wg.Wait()
		close(out)
	}()
	return out, nil
}

// fetch pulls while fewer than window messages are outstanding.
func (s *subscriber) fetch(ctx context.Context, cons jetstream.Consumer, out chan<- *message.Message) {
	wait := time.Duration(s.b.opts.FetchWaitMS) * time.Millisecond
	pause := retry.Doubling(fetchRetryFirst, fetchRetryMax) // after a failed fetch
	var lastLog time.Time
	for ctx.Err() == nil {
		free := s.window - int(s.outstanding.Load())
		if free <= 0 {
			select {
			case <-s.freed:
			case <-ctx.Done():
			}
			continue
		}
		// The fetch's own context, so that closing the subscription or a
		// server that never answers (it died) cannot hold it.
		fctx, fcancel := context.WithTimeout(ctx, wait)
		batch, err := cons.Fetch(free, jetstream.FetchContext(fctx))
		if err == nil {
			for msg := range batch.Messages() {
				s.outstanding.Add(1)
				wm := s.toWatermill(msg)
				select {
				case out <- wm:
					s.wg.Add(1)
					go s.watch(ctx, wm, msg)
				case <-ctx.Done():
					_ = msg.Nak()
					s.release()
				}
			}
			err = batch.Error()
		}
		fcancel()
		if err == nil || errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) {
			pause.Reset()
			continue
		}
		if ctx.Err() != nil {
			return
		}
		if time.Since(lastLog) > 10*time.Second {
			s.b.log.Warn("fetch failed; retrying", "topic", s.topic, "err", err)
			lastLog = time.Now()
		}
		select {
		case <-ctx.Done():
		case <-time.After(pause.NextBackOff()):
		}
	}
}

// A failed fetch is followed by a pause of fetchRetryFirst, twice as long
// after each further failure up to fetchRetryMax, and none once a fetch
// succeeds again.
const (
	fetchRetryFirst = 10 * time.Millisecond
	fetchRetryMax   = time.Second
)

func (s *subscriber) release() {
	s.outstanding.Add(-1)
	select {
	case s.freed <- struct{}{}:
	default:
	}
}

// toWatermill converts a JetStream message (watermill-nats's form).
func (s *subscriber) toWatermill(msg jetstream.Msg) *message.Message {
	h := msg.Headers()
	uuid := h.Get(UUIDHeader)
	if uuid == "" {
		// Stable across redeliveries, so a result written twice is deduplicated.
		if md, err := msg.Metadata(); err == nil {
			uuid = md.Stream + "-" + strconv.FormatUint(md.Sequence.Stream, 10)
		} else {
			uuid = watermill.NewUUID()
		}
	}
	wm := message.NewMessage(uuid, msg.Data())
	for k, v := range h {
		if k == UUIDHeader || strings.HasPrefix(k, "Nats-") || len(v) == 0 {
			continue
		}
		wm.Metadata.Set(k, v[0])
	}
	return wm
}

// watch settles one delivery at the server as the consumer settles it,
// keeping it leased (InProgress) meanwhile; it nacks it when the
// subscription ends first.
func (s *subscriber) watch(ctx context.Context, wm *message.Message, msg jetstream.Msg) {
	defer s.wg.Done()
	defer s.release()
	touch := time.NewTicker(time.Duration(s.b.opts.AckWaitMS) * time.Millisecond / 3)
	defer touch.Stop()
	for {
		select {
		case <-wm.Acked():
			s.ack(msg)
			return
		case <-wm.Nacked():
			_ = msg.Nak()
			return
		case <-touch.C:
			_ = msg.InProgress()
		case <-ctx.Done():
			_ = msg.Nak()
			return
		}
	}
}

// ack acks and waits for the server's confirmation, retrying for a while
// (a server failing over); an ack that never got through is redelivered
// after ack_wait.
func (s *subscriber) ack(msg jetstream.Msg) {
	give := time.Now().Add(time.Duration(s.b.opts.PublishTimeoutMS) * time.Millisecond)
	ack := func() (struct{}, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return struct{}{}, msg.DoubleAck(ctx)
	}
	_, err := ack() // the common case: no backoff state at all
	if err == nil {
		return
	}
	if left := time.Until(give); left > 0 {
		_, err = backoff.Retry(context.Background(), retry.After(err, ack),
			backoff.WithBackOff(backoff.NewConstantBackOff(ackRetryEvery)),
			// the last try may start up to ackRetryEvery after the timeout, as it always did
			backoff.WithMaxElapsedTime(left+ackRetryEvery))
	}
	if err != nil {
		s.b.ackErrors.Add(1)
		s.b.log.Warn("ack not confirmed; the message will be redelivered", "topic", s.topic, "err", err)
	}
}

// An ack the server did not confirm is sent again every ackRetryEvery, for
// up to publish_timeout_ms.
const ackRetryEvery = 100 * time.Millisecond

// Close ends the subscription and waits for the deliveries to be nacked.
func (s *subscriber) Close() error {
	s.closeOnce.Do(func() { close(s.closing) })
	s.wg.Wait()
	return nil
}
