// Package transport is the contract between sluice's core and the queues it
// reads requests from and writes results to.
//
// A Transport hands the core a Watermill Subscriber per request queue and a
// Watermill Publisher for results. Beyond those two, the core needs a few
// capabilities, each an optional interface found by type assertion:
//
//   - Requeuer: delayed re-queue for retries and deferrals (without it the
//     core holds the message in its own timer heap, DelayQueue, which holds no
//     worker but does not survive a crash);
//   - CancelChecker and CancelWatcher: cancellation before and during dispatch;
//   - DepthReporter: queue depths for metrics and `sluice queues`;
//   - DeadLetterer: a place for messages that cannot even be answered.
//
// Credits: a Subscriber returned by Subscriber(q, credits) must hand out a
// message only while it holds a credit for it (Credits.Acquire before it
// claims, at most as many messages as granted), and must call
// credits.Release(1) once the message is acked or nacked. The core settles
// every delivery through transport.Ack / transport.Nack, so a transport can
// learn the outcome from a hook (OnSettle) instead of a goroutine per message
// waiting on the Acked and Nacked channels. This is how a gate's
// budget bounds the requests in flight: Watermill's router starts a goroutine
// per delivered message and has no limit of its own.
//
// Ack means "done with this delivery": the result (if any) was published, or
// the message was re-queued through Requeue. Nack means "hand it back": the
// transport must make it available again (at once) without losing it; the
// core nacks on shutdown and when publishing a result failed.
//
// Implementations live in transports/; cmd/sluice registers them.
package transport

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-io/sluice/core/credit"
	"github.com/sluice-io/sluice/core/wire"
)

// Queue names one request queue and where its results go.
type Queue struct {
	// ID identifies the queue in metrics and logs (defaults to Name).
	ID string
	// Name is the request queue (sorted set key, channel, subscription...).
	Name string
	// ResultName is the result destination (list, channel, topic...).
	ResultName string
	// Pool is the inference pool's name, when known (metrics label).
	Pool string
}

// Transport is one configured transport of a deployment.
type Transport interface {
	// Subscriber returns the request subscriber of q, honouring credits (see
	// the package doc). The core subscribes to q.Name. The router closes it.
	Subscriber(q Queue, credits *credit.Pool) (message.Subscriber, error)
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

// DeadLetterer keeps a message that cannot be answered (no readable id).
// After it returns nil the core acks the message.
type DeadLetterer interface {
	DeadLetter(ctx context.Context, q Queue, m *message.Message, reason string) error
}

// Env is what a transport factory gets besides its own options.
type Env struct {
	Logger *slog.Logger
	// RedisURL is the deployment's Redis URL (REDIS_URL or --redis.url / --redis.url-file).
	RedisURL string
}

// Factory builds a transport from its options (the transport config object
// minus the fields the core reads: queues and result_queue_name). It must
// reject unknown options.
type Factory func(options json.RawMessage, env Env) (Transport, error)

// Registry maps transport names to factories.
type Registry struct {
	mu        sync.RWMutex
	factories map[string]Factory
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{factories: map[string]Factory{}} }

// Register adds a transport; a duplicate name is an error.
func (r *Registry) Register(name string, f Factory) error {
	if name == "" || f == nil {
		return fmt.Errorf("register transport: empty name or nil factory")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.factories[name]; dup {
		return fmt.Errorf("register transport %q: already registered", name)
	}
	r.factories[name] = f
	return nil
}

// Names lists the registered transports, sorted.
func (r *Registry) Names() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]string, 0, len(r.factories))
	for n := range r.factories {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Has reports whether name is registered.
func (r *Registry) Has(name string) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	_, ok := r.factories[name]
	return ok
}

// New builds transport name.
func (r *Registry) New(name string, options json.RawMessage, env Env) (Transport, error) {
	r.mu.RLock()
	f, ok := r.factories[name]
	r.mu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("unknown transport %q (known: %s)", name, strings.Join(r.Names(), ", "))
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
	var o O
	if err := DecodeOptions(options, &o); err != nil {
		return nil, err
	}
	t, err := build(o, env)
	if err != nil {
		return nil, err // not t: a typed nil would not compare equal to nil
	}
	return t, nil
}
