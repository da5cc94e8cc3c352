// Package gcppubsub is sluice's Google Cloud Pub/Sub transport ("gcp-pubsub"):
// one subscription per queue, each with its own gate; results published to
// a topic.
//
// Requests are read by a subscriber written on cloud.google.com/go/pubsub/v2
// directly rather than watermill-googlecloud's, because sluice needs three
// things that one does not give:
//
//   - credits: a message is handed to the core only once it holds a credit of
//     its queue's gate, and the client's flow control
//     (max_outstanding_messages) bounds what is leased meanwhile;
//   - the ack deadline is extended by the client library for as long as a
//     request is in flight (up to max_extension), however long the gateway
//     call runs;
//   - the ack is sent only after the core acks, that is after the result was
//     published and the publish confirmed by the server (upstream acks on
//     receipt, a defect: a crash loses the request). Results are published
//     through watermill-googlecloud/v2's publisher, which waits for the
//     server's confirmation.
//
// Message form: the Pub/Sub message's data is the request (flat form, or
// upstream's envelope); its attributes are merged into the request's
// metadata (a key the body already has wins).
//
// Retries re-publish, they do not nack: the new bytes (with the attempt
// count) are published to the subscription's topic with the attribute
// sluice_not_before; once that publish is confirmed the old message is
// acked. A subscriber that receives a message not yet due holds it (without
// a credit, its lease extended) until due. A nack cannot carry the attempt
// count, is redelivered at once (or after the subscription's one backoff for
// every message), and cannot honour a gateway's Retry-After; a re-publish is
// durable from the moment it is confirmed. The topic is read from the
// subscription (one admin call, cached) unless request_topics names it.
//
// Dead letters: a message without a readable id is published, with its
// attributes and a sluice_dead_letter_reason attribute, to dead_letter_topic
// when set; a subscription's own dead-letter policy also applies to nacked
// messages. Credentials: Application Default Credentials (or
// credentials_file); PUBSUB_EMULATOR_HOST or emulator_host for the emulator.
package gcppubsub

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-googlecloud/v2/pkg/googlecloud"
	"github.com/ThreeDotsLabs/watermill/message"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-io/sluice/core/transport"
)

// Name is the transport's registry name.
const Name = "gcp-pubsub"

// Options are the transport's options.
type Options struct {
	// ProjectID is the GCP project (required; legacy flag --pubsub.project-id).
	ProjectID string `json:"project_id"`
	// EmulatorHost connects to a Pub/Sub emulator at host:port, without
	// credentials (PUBSUB_EMULATOR_HOST does the same).
	EmulatorHost string `json:"emulator_host,omitempty"`
	// CredentialsFile is a service account key file (default: Application Default Credentials).
	CredentialsFile string `json:"credentials_file,omitempty"`
	// DeadLetterTopic receives messages that cannot be answered (no readable id).
	DeadLetterTopic string `json:"dead_letter_topic,omitempty"`
	// RequestTopics maps a subscription to the topic retries are published
	// to (default: the subscription's own topic, looked up once).
	RequestTopics map[string]string `json:"request_topics,omitempty"`
	// MaxOutstandingMessages bounds the messages leased per subscription,
	// in flight, waiting for a credit or held until a retry is due
	// (default: 2 × the queue's max concurrency + 16).
	MaxOutstandingMessages int `json:"max_outstanding_messages,omitempty"`
	// NumStreams is the number of streaming pulls each subscription keeps
	// open (pubsub ReceiveSettings.NumGoroutines). Default: one per 8 of
	// the queue's max concurrency, at least 1 and at most 16, so that the
	// rate messages arrive at follows the credits (one stream delivers a
	// bounded rate: ~1,900 messages/s on the emulator).
	NumStreams int `json:"num_streams,omitempty"`
	// MaxExtensionSeconds is how long a lease is extended at most (default 3600).
	MaxExtensionSeconds int `json:"max_extension_seconds,omitempty"`
	// PublishTimeoutMS bounds one publish and its confirmation (default 10000).
	PublishTimeoutMS int `json:"publish_timeout_ms,omitempty"`
	// CreateResultTopics creates a missing result topic (default false: an error).
	CreateResultTopics bool `json:"create_result_topics,omitempty"`
	// BatchSize is upstream's "batch_size" (--pubsub.batch-size): the most
	// messages one subscription has in flight at budget 1. It is accepted
	// and changes no lease setting here: that bound is sluice's per-queue
	// max_concurrency (credits × budget), and core/config sets each queue's
	// max_concurrency to batch_size when the queue names none (in upstream's
	// "topics" form and in the "queues" form alike).
	BatchSize int `json:"batch_size,omitempty"`
}

// Streaming pulls per subscription: by default one per streamCredits of the
// queue's max concurrency, at most maxStreams.
const (
	streamCredits = 8
	maxStreams    = 64
	maxAutoStream = 16
)

// streams returns the number of streaming pulls for a subscription whose
// queue has maxConcurrency credits at most.
func (o *Options) streams(maxConcurrency int) int {
	if o.NumStreams > 0 {
		return o.NumStreams
	}
	return min(max((maxConcurrency+streamCredits-1)/streamCredits, 1), maxAutoStream)
}

func (o *Options) setDefaults() {
	if o.MaxExtensionSeconds == 0 {
		o.MaxExtensionSeconds = 3600
	}
	if o.PublishTimeoutMS == 0 {
		o.PublishTimeoutMS = 10000
	}
}

// Validate reports options the transport cannot run with.
func (o *Options) Validate() error {
	var errs []error
	if o.ProjectID == "" {
		errs = append(errs, errors.New("project_id: required (--pubsub.project-id)"))
	}
	if o.BatchSize < 0 {
		errs = append(errs, fmt.Errorf("batch_size %d: must not be negative", o.BatchSize))
	}
	if o.MaxOutstandingMessages < 0 {
		errs = append(errs, fmt.Errorf("max_outstanding_messages %d: must not be negative", o.MaxOutstandingMessages))
	}
	if o.NumStreams < 0 || o.NumStreams > maxStreams {
		errs = append(errs, fmt.Errorf("num_streams %d: must be between 0 (the default: from max concurrency) and %d", o.NumStreams, maxStreams))
	}
	if o.MaxExtensionSeconds < 10 {
		errs = append(errs, fmt.Errorf("max_extension_seconds %d: must be at least 10", o.MaxExtensionSeconds))
	}
	if o.PublishTimeoutMS < 1 {
		errs = append(errs, fmt.Errorf("publish_timeout_ms %d: must be positive", o.PublishTimeoutMS))
	}
	return errors.Join(errs...)
}

// Factory builds the transport from its options. It does no I/O.
func Factory(options json.RawMessage, env transport.Env) (transport.Transport, error) {
	return transport.Build(options, env, New)
}

// ErrClosed is returned by operations on a closed transport.
var ErrClosed = errors.New("gcp-pubsub transport closed")

// Transport is the Pub/Sub transport. It is safe for concurrent use.
type Transport struct {
	opts Options
	log  *slog.Logger

	closing chan struct{} // closed by Close: deliveries still un-acked are nacked
	now     func() time.Time

	mu         sync.Mutex
	closed     bool
	client     *pubsub.Client
	results    *googlecloud.Publisher
	publishers map[string]*pubsub.Publisher
	topics     map[string]string // subscription → request topic
	receives   sync.WaitGroup

	receiveErrors atomic.Int64 // Receive calls that ended with an error
	loops         sync.Map     // subscription → *loopHistory, for the health check
}

var (
	_ transport.Transport    = (*Transport)(nil)
	_ transport.Requeuer     = (*Transport)(nil)
	_ transport.DeadLetterer = (*Transport)(nil)
	_ transport.EventCounter = (*Transport)(nil)
)

// Events implements transport.EventCounter.
func (t *Transport) Events() map[string]int64 {
	return map[string]int64{"receive_errors": t.receiveErrors.Load()}
}

// New builds the transport; it connects when first used.
func New(o Options, env transport.Env) (*Transport, error) {
	o.setDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	log := env.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Transport{opts: o, log: log.With("transport", Name), closing: make(chan struct{}),
		publishers: map[string]*pubsub.Publisher{}, topics: map[string]string{}, now: time.Now}, nil
}

// Options returns the defaulted options.
func (t *Transport) Options() Options { return t.opts }

func (t *Transport) clientOptions() []option.ClientOption {
	var opts []option.ClientOption
	if t.opts.EmulatorHost != "" {
		opts = append(opts, option.WithEndpoint(t.opts.EmulatorHost), option.WithoutAuthentication(),
			option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())))
	} else if t.opts.CredentialsFile != "" {
		opts = append(opts, option.WithAuthCredentialsFile(option.ServiceAccount, t.opts.CredentialsFile))
	}
	return opts
}

// conn returns the shared client, creating it on first use.
func (t *Transport) conn(ctx context.Context) (*pubsub.Client, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, ErrClosed
	}
	if t.client != nil {
		return t.client, nil
	}
	c, err := pubsub.NewClient(ctx, t.opts.ProjectID, t.clientOptions()...)
	if err != nil {
		return nil, fmt.Errorf("pubsub client for project %s: %w", t.opts.ProjectID, err)
	}
	t.client = c
	return c, nil
}

func (t *Transport) fullName(kind, id string) string {
	if strings.HasPrefix(id, "projects/") {
		return id
	}
	return "projects/" + t.opts.ProjectID + "/" + kind + "/" + id
}

// publisher returns the cached publisher of topic.
func (t *Transport) publisher(ctx context.Context, topic string) (*pubsub.Publisher, error) {
	c, err := t.conn(ctx)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	p, ok := t.publishers[topic]
	if !ok {
		p = c.Publisher(topic)
		t.publishers[topic] = p
	}
	return p, nil
}

// publish publishes one message and waits for the server's confirmation.
func (t *Transport) publish(ctx context.Context, topic string, data []byte, attrs map[string]string) error {
	p, err := t.publisher(ctx, topic)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Duration(t.opts.PublishTimeoutMS)*time.Millisecond)
	defer cancel()
	if _, err := p.Publish(ctx, &pubsub.Message{Data: data, Attributes: attrs}).Get(ctx); err != nil {
		return fmt.Errorf("publish to %s: %w", topic, err)
	}
	return nil
}

// requestTopic returns the topic a subscription reads.
func (t *Transport) requestTopic(ctx context.Context, subscription string) (string, error) {
	if topic, ok := t.opts.RequestTopics[subscription]; ok {
		return t.fullName("topics", topic), nil
	}
	t.mu.Lock()
	topic, ok := t.topics[subscription]
	t.mu.Unlock()
	if ok {
		return topic, nil
	}
	c, err := t.conn(ctx)
	if err != nil {
		return "", err
	}
	s, err := c.SubscriptionAdminClient.GetSubscription(ctx, &pubsubpb.GetSubscriptionRequest{Subscription: t.fullName("subscriptions", subscription)})
	if err != nil {
		return "", fmt.Errorf("look up the topic of subscription %s (or set request_topics): %w", subscription, err)
	}
	t.mu.Lock()
	t.topics[subscription] = s.Topic
	t.mu.Unlock()
	return s.Topic, nil
}

// Requeue implements transport.Requeuer: payload is published to the
// subscription's topic with sluice_not_before = due; after the publish is
// confirmed the core acks the old message.
func (t *Transport) Requeue(ctx context.Context, q transport.Queue, _ *message.Message, payload []byte, due time.Time) error {
	topic, err := t.requestTopic(ctx, q.Name)
	if err != nil {
		return fmt.Errorf("requeue on %s: %w", q.Name, err)
	}
	attrs := map[string]string{transport.MetaNotBefore: strconv.FormatInt(due.UnixMilli(), 10)}
	if err := t.publish(ctx, topic, payload, attrs); err != nil {
		return fmt.Errorf("requeue on %s: %w", q.Name, err)
	}
	return nil
}

// DeadLetter implements transport.DeadLetterer: the message goes to
// dead_letter_topic with its attributes and the reason. Without that
// option it is logged whole and acked.
func (t *Transport) DeadLetter(ctx context.Context, q transport.Queue, m *message.Message, reason string) error {
	if t.opts.DeadLetterTopic == "" {
		t.log.Error("message cannot be answered and no dead_letter_topic is set; dropping it after logging",
			"subscription", q.Name, "reason", reason, "payload", string(m.Payload))
		return nil
	}
	attrs := map[string]string{transport.MetaDeadLetterReason: reason, "sluice_subscription": q.Name}
	for k, v := range m.Metadata {
		attrs[k] = v
	}
	if err := t.publish(ctx, t.fullName("topics", t.opts.DeadLetterTopic), m.Payload, attrs); err != nil {
		return fmt.Errorf("dead-letter from %s: %w", q.Name, err)
	}
	return nil
}

// Publisher implements transport.Transport: results go through
// watermill-googlecloud/v2's publisher, which returns only once the server
// confirmed them. Its Close leaves the shared publisher open.
func (t *Transport) Publisher(transport.Queue) (message.Publisher, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, ErrClosed
	}
	if t.results == nil {
		p, err := googlecloud.NewPublisher(googlecloud.PublisherConfig{
			ProjectID:                 t.opts.ProjectID,
			DoNotCreateTopicIfMissing: !t.opts.CreateResultTopics,
			PublishTimeout:            time.Duration(t.opts.PublishTimeoutMS) * time.Millisecond,
			ClientOptions:             t.clientOptions(),
		}, watermill.NewSlogLogger(t.log))
		if err != nil {
			return nil, fmt.Errorf("result publisher: %w", err)
		}
		t.results = p
	}
	return transport.NopCloserPublisher{Publisher: t.results}, nil
}

// Source implements transport.Transport.
func (t *Transport) Source(q transport.Queue) (transport.Source, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, ErrClosed
	}
	return &source{t: t, subscription: q.Name, maxConcurrency: q.MaxConcurrency, incoming: make(chan *pending),
		inflight: map[*message.Message]*pending{}}, nil
}

// Close nacks every delivery still un-acked (Pub/Sub redelivers it), waits
// for the receivers to stop and closes the clients.
func (t *Transport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	close(t.closing)
	t.mu.Unlock()
	done := make(chan struct{})
	go func() { t.receives.Wait(); close(done) }()
	var errs []error
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		errs = append(errs, errors.New("receivers still running 30s after close"))
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, p := range t.publishers {
		p.Stop()
	}
	if t.results != nil {
		if err := t.results.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close result publisher: %w", err))
		}
	}
	if t.client != nil {
		if err := t.client.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close pubsub client: %w", err))
		}
	}
	return errors.Join(errs...)
}

var _ transport.MetricLabeler = (*Transport)(nil)

// MetricLabels labels as upstream's Pub/Sub loop: queue_id "", queue_name
// the subscription.
func (t *Transport) MetricLabels(q transport.Queue) transport.MetricLabels {
	return transport.MetricLabels{QueueName: q.Name}
}

var _ transport.HoldLimiter = (*Transport)(nil)

// MaxHold implements transport.HoldLimiter: the client library extends a
// lease for up to max_extension_seconds after receipt, then Pub/Sub
// redelivers the message.
func (t *Transport) MaxHold(transport.Queue) time.Duration {
	return time.Duration(t.opts.MaxExtensionSeconds) * time.Second
}
