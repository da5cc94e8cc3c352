// Package transport is the contract between sluice's core and the queues it
// reads requests from and writes results to, and the one claim loop every
// transport runs through.
//
// A Transport supplies only its broker calls: per request queue a Source
// (claim up to n, wait, settle, hand back), and a Watermill Publisher for
// results. NewSubscriber turns a Source into the Watermill Subscriber the
// core's router reads: it takes a credit (core/credit) before every message
// it claims, so a gate's budget bounds the requests in flight, and frees it
// when the core settles the delivery through Ack or Nack (a hook, not a
// goroutine per message). Beyond those, the core uses a few capabilities,
// each an optional interface found by type assertion:
//
//   - Requeuer: delayed re-queue for retries and deferrals (without it the
//     core holds the message in its own timer heap, DelayQueue, which holds no
//     worker but does not survive a crash);
//
//   - CancelChecker and CancelWatcher: cancellation before and during dispatch;
//
//   - DepthReporter: queue depths for metrics and `sluice queues`;
//
//   - DeadLetterer: a place for messages that cannot even be answered;
//
//   - EventCounter: transport-specific counts for metrics;
//
//   - HealthChecker: the broker probe behind /readyz.
//
//   - HoldLimiter: how long a delivery may be held (a lease the broker stops
//     extending), which bounds how long the core retries writing a result.
//
// Ack means "done with this delivery": the result (if any) was published, or
// the message was re-queued through Requeue or dead-lettered. Nack means
// "hand it back": the transport must make it available again (at once)
// without losing it. The core nacks on shutdown, and when a result could
// neither be written (retried with a backoff for as long as the delivery may
// be held) nor handed back through Requeue with the result kept in the
// message (wire.WithKeptResult), so that a result that cannot be written
// never makes the core call the gateway again in a hot loop.
// transporttest is the conformance suite every transport passes.
//
// Implementations live in transports/; cmd/sluice chooses them.
package transport

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-io/sluice/core/registry"
	"github.com/sluice-io/sluice/core/wire"
)

// Queue names one request queue and where its results go. It is the one
// queue type: the configuration's queue object (core/config.Queue) and the
// pipeline's (core/pipeline.Queue) extend it; its JSON names are upstream's.
type Queue struct {
	// ID identifies the queue in metrics and logs (defaults to Name).
	ID string `json:"id,omitempty"`
	// Name is the request queue (sorted set key, channel, subscription...).
	Name string `json:"queue_name"`
	// ResultName is the result destination (list, channel, topic...).
	ResultName string `json:"result_queue_name,omitempty"`
	// MaxConcurrency is the most requests of the queue in flight at once
	// (its credits at budget 1; NewSubscriber sets it from the credits it
	// is given). A source may size what it buffers or leases ahead by it.
	MaxConcurrency int `json:"max_concurrency,omitempty"`
	// ResultFromMessage says that ResultName is the deployment's default
	// result destination, not the queue's own: a request that names its
	// own result destination (wire.Request.ResultQueueName, upstream's
	// internal.result_queue_name) has its result written there instead when
	// the transport is a ResultRouter — upstream's order: the queue's, the
	// message's, the transport's.
	ResultFromMessage bool `json:"-"`
	// ResultTTLSeconds, when above 0, is the expiry the result list is
	// given on every result written to it (upstream's per-queue
	// result_ttl_seconds, for per-request result keys); transports with
	// result lists honour it (redis-sortedset), the others ignore it.
	ResultTTLSeconds int64 `json:"result_ttl_seconds,omitempty"`
}

// Transport is one configured transport of a deployment.
type Transport interface {
	// Source returns the broker side of request queue q (q.Name); the core
	// runs it through NewSubscriber, which closes it.
	Source(q Queue) (Source, error)
	// Publisher returns the result publisher for q; the core publishes to
	// q.ResultName. The router closes it, so a transport sharing a client
	// between queues returns a wrapper whose Close leaves the client open.
	Publisher(q Queue) (message.Publisher, error)
	// Close releases what the transport holds, after every subscriber and
	// publisher was closed. Messages still un-acked are handed back.
	Close() error
}

// Requeuer re-queues a message after a delay, natively and durably.
type Requeuer interface {
	// Requeue makes payload (the message's new bytes, carrying the attempt
	// count) due again at due, replacing delivery m. After it returns nil the
	// core acks m; the transport must not deliver m's old bytes again.
	Requeue(ctx context.Context, q Queue, m *message.Message, payload []byte, due time.Time) error
}

// Broker metadata keys: what sluice itself writes on the messages it
// publishes back to a broker (Watermill metadata, Pub/Sub attributes), one
// vocabulary on every broker.
const (
	// MetaNotBefore holds a re-queued request's due time, Unix ms.
	MetaNotBefore = "sluice_not_before"
	// MetaDeadLetterReason says why a message was dead-lettered.
	MetaDeadLetterReason = "sluice_dead_letter_reason"
)

// ErrDeliveryLost marks an error (errors.Is) of a result publisher or a
// Requeue meaning that the delivery itself is gone (the broker transaction
// it lived in was cut, its lease or ack id is void): nothing more done with
// it can succeed, so the core neither retries the write nor re-queues the
// request with its result, and hands the delivery back at once (the
// request is answered again from its redelivery).
var ErrDeliveryLost = errors.New("the delivery is lost")

// HoldLimiter is implemented by transports that can hold a delivery only
// for a bounded time after it was claimed: a lease the broker extends up to
// a limit (Pub/Sub's max extension). The core retries writing a result for
// at most that long (less a margin) before it hands the delivery back.
// Transports without it hold a delivery for as long as the process runs
// (their leases are renewed by a heartbeat, or live in memory).
type HoldLimiter interface {
	// MaxHold returns how long a delivery of q may be held after its
	// claim; 0 means no limit.
	MaxHold(q Queue) time.Duration
}

// ResultRouter is implemented by transports whose result publisher writes
// to whatever destination it is given (a Redis list), so that a request may
// name its own (see Queue.ResultFromMessage). Transports whose destinations
// must exist beforehand (topics) do not implement it.
type ResultRouter interface {
	RoutesResults()
}

// RequestPublisher publishes new requests to a request queue. Producers and
// the generic DelayQueue use it.
type RequestPublisher interface {
	PublishRequest(ctx context.Context, q Queue, payload []byte) error
}

// CancelChecker tells whether a request was cancelled before it is dispatched.
type CancelChecker interface {
	Cancelled(ctx context.Context, q Queue, req *wire.Request) (bool, error)
}

// Cancellation names requests to abort: every request of JobID, or the one
// request RequestID.
type Cancellation struct {
	JobID     string
	RequestID string
}

// CancelWatcher reports cancellations while requests are in flight, so the
// core can abort their HTTP calls. Watch runs until ctx ends.
type CancelWatcher interface {
	WatchCancellations(ctx context.Context, fn func(Cancellation)) error
}

// Depth is how many requests a queue holds, per state. -1 means unknown.
type Depth struct {
	Waiting      int64
	InFlight     int64
	Delayed      int64
	DeadLettered int64
}

// DepthReporter reports queue depths.
type DepthReporter interface {
	Depth(ctx context.Context, q Queue) (Depth, error)
}

// DeadlineProximityReporter reports how close the requests waiting in a
// queue are to their deadlines (upstream's async_deadline_proximity_millis,
// sorted sets only): cumulative[i] counts those with less than bounds[i]
// left (a bound of 0: already expired), total all of them, read in one
// consistent step.
type DeadlineProximityReporter interface {
	DeadlineProximity(ctx context.Context, q Queue, bounds []time.Duration) (cumulative []uint64, total uint64, err error)
}

// DeadLetterer keeps a message that cannot be answered (no readable id).
// After it returns nil the core acks the message.
type DeadLetterer interface {
	DeadLetter(ctx context.Context, q Queue, m *message.Message, reason string) error
}

// QueueChecker is implemented by a transport that can tell, without I/O,
// that a queue cannot work with it (for example names a Redis Cluster
// cannot serve in one hash slot). `sluice validate` calls it for every
// queue; Source and Publisher must still refuse such a queue.
type QueueChecker interface {
	CheckQueue(q Queue) error
}

// QueueWarner is implemented by a transport that can tell, without I/O,
// that a queue works but differently from what its user may expect (for
// example a Redis Cluster queue whose result list is in another hash slot,
// written in more than one step). `sluice validate` prints each line as a
// warning; the transport logs them itself when it serves the queue.
type QueueWarner interface {
	QueueWarnings(q Queue) []string
}

// Env is what a transport factory gets besides its own options.
type Env struct {
	Logger *slog.Logger
	// RedisURL is the deployment's Redis URL (REDIS_URL or --redis.url / --redis.url-file).
	RedisURL string
	// RedisMode is the deployment's redis_mode ("single", "cluster" or
	// "sentinel"; "" is single): how RedisURL is reached.
	RedisMode string
	// RedisAddrs are the deployment's redis_addrs: more cluster nodes or
	// sentinels beside RedisURL's host.
	RedisAddrs []string
	// RedisMasterName is the deployment's redis_master_name: the master the
	// sentinels monitor (sentinel mode).
	RedisMasterName string
	// RedisTLS, when set, is the TLS configuration of rediss:// connections
	// (the deployment's redis_tls: CAs to trust, a client certificate); a
	// Redis transport uses it, with the URL's host as server name, for a
	// rediss:// URL. nil: go-redis's default (the system's CAs, no client
	// certificate).
	RedisTLS *tls.Config
}

// Factory builds a transport from its options (the transport config object
// minus the fields the core reads: queues and result_queue_name). It must
// reject unknown options.
type Factory func(options json.RawMessage, env Env) (Transport, error)

// Registry maps transport names to factories: the "transport" namespace of
// the generic registry (Register, Lookup, Has, Names: a duplicate name is an
// error, an unknown one an error naming the known ones), plus New.
type Registry struct {
	*registry.Registry[Factory]
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{registry.New[Factory]("transport")} }

// New builds transport name (a nil env.Logger discards the logs).
func (r *Registry) New(name string, options json.RawMessage, env Env) (Transport, error) {
	f, err := r.Lookup(name)
	if err != nil {
		return nil, err
	}
	if env.Logger == nil {
		env.Logger = slog.New(slog.DiscardHandler)
	}
	t, err := f(options, env)
	if err != nil {
		return nil, fmt.Errorf("transport %s: %w", name, err)
	}
	return t, nil
}

// DecodeOptions strictly decodes a transport's options into dst: unknown
// fields are errors. Empty options leave dst as it is.
func DecodeOptions(options json.RawMessage, dst any) error {
	if len(strings.TrimSpace(string(options))) == 0 {
		return nil
	}
	dec := json.NewDecoder(strings.NewReader(string(options)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return fmt.Errorf("transport options: %w", err)
	}
	return nil
}

// RedisTLSFor returns the TLS configuration of a Redis connection given the
// one go-redis parsed from its URL (nil for redis://, else one naming the
// URL's host): env.RedisTLS with that server name when both are set, else
// parsed.
func (env Env) RedisTLSFor(parsed *tls.Config) *tls.Config {
	if parsed == nil || env.RedisTLS == nil {
		return parsed
	}
	c := env.RedisTLS.Clone()
	if c.ServerName == "" {
		c.ServerName = parsed.ServerName
	}
	return c
}

// NopCloserPublisher wraps a publisher so that Close leaves it open; use it
// when several router handlers share one publisher.
type NopCloserPublisher struct{ message.Publisher }

// Close does nothing.
func (NopCloserPublisher) Close() error { return nil }

// EventCounter is implemented by transports that count what they observe
// beyond the core's metrics (late results discarded, requests nobody heard,
// leases reclaimed, ...). The counts are cumulative; the names are
// snake_case. They are exported as sluice_transport_events_total{event}.
type EventCounter interface {
	Events() map[string]int64
}

// Build is the body of most factories: it decodes options strictly into a
// fresh O (see DecodeOptions) and calls build with them.
func Build[O any, T Transport](options json.RawMessage, env Env, build func(O, Env) (T, error)) (Transport, error) {
	t, err := Construct(options, env, build)
	if err != nil {
		return nil, err // not t: a typed nil would not compare equal to nil
	}
	return t, nil
}

// Construct decodes options strictly into a fresh O (see DecodeOptions)
// and returns what build makes of them, as build returns it. It is the one
// path from options to a component: Build wraps it for transports, and
// the factories of what a transport is built from (a Watermill broker,
// see wmtransport.BuildBroker) wrap it for their own interface. build
// sets O's defaults and validates it.
func Construct[O, T any](options json.RawMessage, env Env, build func(O, Env) (T, error)) (T, error) {
	var o O
	if err := DecodeOptions(options, &o); err != nil {
		var zero T
		return zero, err
	}
	return build(o, env)
}
