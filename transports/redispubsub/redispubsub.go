// Package redispubsub is sluice's Redis PUBLISH/SUBSCRIBE transport, the
// "redis-pubsub" of upstream: ephemeral, fan-out delivery with one global
// gate.
//
// What Redis pub/sub promises, and what it does not:
//
//   - A request PUBLISHed while no sluice is subscribed to its channel is
//     lost: Redis keeps nothing. Every subscriber gets every request (fan-out),
//     so two replicas on one channel both run each request. Run one replica
//     per channel, or use redis-sortedset or redis-stream for a durable queue.
//   - What can be observed is counted (Stats): requests and results this
//     transport published that no one heard (PUBLISH answered 0), and
//     interruptions of the subscription (a reconnect may have missed some).
//
// Within those limits sluice keeps what it holds: the subscriber reads the
// channel into a bounded buffer and hands requests to the core only while
// credits allow (a full buffer stops reading, so Redis applies its own
// client-output-buffer limit instead of sluice dropping anything). A request
// handed back (nack, shutdown) goes to the retry sorted set, due at once, and
// is PUBLISHed again from there; so do retries, due after their backoff.
// The retry set (upstream's retry-sortedset, option retry_queue_name) is
// durable: a retry survives a crash of sluice. Its mover PUBLISHes an entry
// only when at least one subscriber hears it and otherwise keeps it, so a
// retry is never published into the void.
//
// Results are PUBLISHed to a channel (result_mode "channel", upstream's
// behaviour; a result nobody hears is lost, counted and logged) or LPUSHed to
// a list (result_mode "list", durable; consumers BRPOP).
package redispubsub

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

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/internal/redisclient"
	"github.com/sluice-io/sluice/transports/internal/upstream"
)

// Name is the transport's registry name.
const Name = "redis-pubsub"

// Result modes.
const (
	// ResultChannel PUBLISHes results to a channel (upstream's behaviour).
	ResultChannel = "channel"
	// ResultList LPUSHes results to a list.
	ResultList = "list"
)

// Server is the url key of the options, shared by the Redis transports.
type Server = redisclient.Server

// TopologyOptions are the mode, addrs and master_name keys of the options,
// shared by the Redis transports.
type TopologyOptions = redisclient.TopologyOptions

// Options are the transport's options (the transport config object minus
// queues and result_queue_name).
type Options struct {
	// Server is the url key (redisclient.Server): default the deployment's
	// REDIS_URL, then redisclient.DefaultURL, redis://localhost:6379/0.
	Server
	// TopologyOptions are the mode, addrs and master_name keys
	// (redisclient.TopologyOptions): single or sentinel; cluster is refused
	// (see Factory).
	TopologyOptions
	// RetryQueueName is the sorted set holding retries and handed-back
	// requests, scored by due time in Unix ms (default "retry-sortedset").
	RetryQueueName string `json:"retry_queue_name,omitempty"`
	// ResultMode is "channel" (default) or "list".
	ResultMode string `json:"result_mode,omitempty"`
	// BufferSize is how many received requests may wait for a credit before
	// the subscriber stops reading (default 10000).
	BufferSize int `json:"buffer_size,omitempty"`
	// RetryPollIntervalMS is how often the retry set is checked for due entries (default 100).
	RetryPollIntervalMS int `json:"retry_poll_interval_ms,omitempty"`
	// RetryBatchSize is the most retries moved per round trip (default 100).
	RetryBatchSize int `json:"retry_batch_size,omitempty"`
}

func (o *Options) setDefaults(env transport.Env) {
	o.URL = redisclient.URL(o.URL, env.RedisURL)
	if o.RetryQueueName == "" {
		o.RetryQueueName = "retry-sortedset"
	}
	if o.ResultMode == "" {
		o.ResultMode = ResultChannel
	}
	if o.BufferSize == 0 {
		o.BufferSize = 10000
	}
	if o.RetryPollIntervalMS == 0 {
		o.RetryPollIntervalMS = 100
	}
	if o.RetryBatchSize == 0 {
		o.RetryBatchSize = 100
	}
}

// Validate reports options the transport cannot run with.
func (o *Options) Validate() error {
	var errs []error
	if o.ResultMode != ResultChannel && o.ResultMode != ResultList {
		errs = append(errs, fmt.Errorf("result_mode %q: want %q or %q", o.ResultMode, ResultChannel, ResultList))
	}
	if o.BufferSize < 1 {
		errs = append(errs, fmt.Errorf("buffer_size %d: must be at least 1", o.BufferSize))
	}
	if o.RetryPollIntervalMS < 1 {
		errs = append(errs, fmt.Errorf("retry_poll_interval_ms %d: must be at least 1", o.RetryPollIntervalMS))
	}
	if o.RetryBatchSize < 1 {
		errs = append(errs, fmt.Errorf("retry_batch_size %d: must be at least 1", o.RetryBatchSize))
	}
	return errors.Join(errs...)
}

// Factory builds the transport from its options. It does no I/O.
func Factory(options json.RawMessage, env transport.Env) (transport.Transport, error) {
	return transport.Build(options, env, New)
}

// errCluster refuses a Redis Cluster.
var errCluster = errors.New("redis-pubsub does not run on a Redis Cluster (on a cluster PUBLISH counts only the subscribers of the node it runs on, and that count decides whether a request or retry was heard): use redis-sortedset with redis_mode cluster, or redis_mode single or sentinel")

// ErrNoSubscriber is returned by PublishRequest when no subscriber heard the
// request: Redis pub/sub keeps nothing, so the request is lost.
var ErrNoSubscriber = errors.New("no subscriber heard the request; Redis pub/sub does not keep it")

// ErrClosed is returned by operations on a closed transport.
var ErrClosed = errors.New("redis-pubsub transport closed")

// Stats counts what the transport can observe.
type Stats struct {
	// Received is how many requests the subscribers read from Redis.
	Received int64
	// Delivered is how many deliveries went to the core (redeliveries included).
	Delivered int64
	// HandedBack is how many requests went to the retry set un-answered (nack, shutdown).
	HandedBack int64
	// Interruptions counts subscription read errors; requests published
	// during one may have been missed.
	Interruptions int64
	// RequestsUnheard counts requests published by PublishRequest that no subscriber heard (lost).
	RequestsUnheard int64
	// ResultsUnheard counts results published to a channel nobody listened to (lost).
	ResultsUnheard int64
	// RetriesHeld counts times a due retry was kept because no subscriber listened.
	RetriesHeld int64
}

type counters struct {
	received, delivered, handedBack, interruptions, requestsUnheard, resultsUnheard, retriesHeld atomic.Int64
}

// Transport is the Redis pub/sub transport. It is safe for concurrent use.
type Transport struct {
	opts   Options
	client *redis.Client
	// upCancel reads upstream's per-request cancel keys, batched.
	upCancel *upstream.CancelReader
	log      *slog.Logger
	stats    counters
	seq      atomic.Uint64

	ctx    context.Context // ends at Close
	cancel context.CancelFunc

	mu        sync.Mutex
	closed    bool
	subs      map[*source]struct{}
	moverOnce sync.Once
	bg        sync.WaitGroup
}

var (
	_ transport.Transport        = (*Transport)(nil)
	_ transport.Requeuer         = (*Transport)(nil)
	_ transport.RequestPublisher = (*Transport)(nil)
	_ transport.DepthReporter    = (*Transport)(nil)
)

// New builds the transport; it connects lazily.
func New(o Options, env transport.Env) (*Transport, error) {
	o.setDefaults(env)
	if err := o.Validate(); err != nil {
		return nil, err
	}
	top, err := o.Or(TopologyOptions{Mode: env.RedisMode, Addrs: env.RedisAddrs, MasterName: env.RedisMasterName}).Parse()
	if err != nil {
		return nil, err
	}
	if top.Mode == redisclient.Cluster {
		return nil, errCluster
	}
	ro, err := top.Parse(o.URL)
	if err != nil {
		return nil, fmt.Errorf("url: %w", err)
	}
	ro.Tune(func(c *redisclient.Common) { c.TLSConfig = env.RedisTLSFor(c.TLSConfig) })
	client, err := ro.NewClient()
	if err != nil {
		return nil, err
	}
	log := env.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Transport{opts: o, client: client, upCancel: upstream.NewCancelReader(client), log: log.With("transport", Name),
		ctx: ctx, cancel: cancel, subs: map[*source]struct{}{}}, nil
}

// Options returns the defaulted options.
func (t *Transport) Options() Options { return t.opts }

// Stats returns the counters.
func (t *Transport) Stats() Stats {
	s := &t.stats
	return Stats{Received: s.received.Load(), Delivered: s.delivered.Load(), HandedBack: s.handedBack.Load(),
		Interruptions: s.interruptions.Load(), RequestsUnheard: s.requestsUnheard.Load(),
		ResultsUnheard: s.resultsUnheard.Load(), RetriesHeld: s.retriesHeld.Load()}
}

// PublishRequest implements transport.RequestPublisher: PUBLISH to q's
// channel. It returns ErrNoSubscriber (and counts it) when nobody heard it.
func (t *Transport) PublishRequest(ctx context.Context, q transport.Queue, payload []byte) error {
	n, err := t.client.Publish(ctx, q.Name, payload).Result()
	if err != nil {
		return fmt.Errorf("publish request to %s: %w", q.Name, err)
	}
	if n == 0 {
		t.stats.requestsUnheard.Add(1)
		return fmt.Errorf("publish request to %s: %w", q.Name, ErrNoSubscriber)
	}
	return nil
}

// retryEntry is one member of the retry set. The id keeps equal payloads apart.
type retryEntry struct {
	Channel string `json:"c"`
	ID      string `json:"u"`
	Payload string `json:"p"`
}

func (t *Transport) park(ctx context.Context, channel string, payload []byte, due time.Time) error {
	member, err := json.Marshal(retryEntry{Channel: channel, ID: strconv.FormatInt(time.Now().UnixNano(), 36) + "-" + strconv.FormatUint(t.seq.Add(1), 36), Payload: string(payload)})
	if err != nil {
		return fmt.Errorf("retry entry: %w", err)
	}
	if err := t.client.ZAdd(ctx, t.opts.RetryQueueName, redis.Z{Score: float64(due.UnixMilli()), Member: member}).Err(); err != nil {
		return fmt.Errorf("park in %s: %w", t.opts.RetryQueueName, err)
	}
	return nil
}

// Requeue implements transport.Requeuer: payload waits in the retry set
// until due, then is PUBLISHed to q's channel.
func (t *Transport) Requeue(ctx context.Context, q transport.Queue, _ *message.Message, payload []byte, due time.Time) error {
	if err := t.park(ctx, q.Name, payload, due); err != nil {
		return fmt.Errorf("requeue on %s: %w", q.Name, err)
	}
	t.startMover()
	return nil
}

// moveScript PUBLISHes the due entries of the retry set (KEYS[1]) that
// someone hears and removes them; an entry nobody hears is kept and tried
// again ARGV[3] ms later. ARGV: now (ms), limit, retry-later (ms).
// Returns {moved, held}.
var moveScript = redis.NewScript(`
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
local moved, held = 0, 0
for _, m in ipairs(due) do
  local e = cjson.decode(m)
  if redis.call('PUBLISH', e.c, e.p) > 0 then
    redis.call('ZREM', KEYS[1], m)
    moved = moved + 1
  else
    redis.call('ZADD', KEYS[1], tonumber(ARGV[1]) + tonumber(ARGV[3]), m)
    held = held + 1
  end
end
return {moved, held}
`)

// startMover starts the retry-set mover once.
func (t *Transport) startMover() {
	t.moverOnce.Do(func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		if t.closed {
			return
		}
		t.bg.Add(1)
		go t.mover()
	})
}

func (t *Transport) mover() {
	defer t.bg.Done()
	interval := time.Duration(t.opts.RetryPollIntervalMS) * time.Millisecond
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		for {
			res, err := moveScript.Run(t.ctx, t.client, []string{t.opts.RetryQueueName},
				time.Now().UnixMilli(), t.opts.RetryBatchSize, 1000).Int64Slice()
			if err != nil {
				if t.ctx.Err() == nil {
					t.log.Warn("moving due retries failed; will try again", "set", t.opts.RetryQueueName, "err", err)
				}
				break
			}
			if res[1] > 0 {
				t.stats.retriesHeld.Add(res[1])
			}
			if res[0]+res[1] < int64(t.opts.RetryBatchSize) {
				break
			}
		}
		select {
		case <-t.ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// Depth implements transport.DepthReporter: Waiting is what this process
// buffered for q, InFlight what it delivered un-acked, Delayed the whole
// retry set (shared by all channels).
func (t *Transport) Depth(ctx context.Context, q transport.Queue) (transport.Depth, error) {
	d := transport.Depth{DeadLettered: -1}
	t.mu.Lock()
	for s := range t.subs {
		w, f := s.depth(q.Name)
		d.Waiting += w
		d.InFlight += f
	}
	t.mu.Unlock()
	n, err := t.client.ZCard(ctx, t.opts.RetryQueueName).Result()
	if err != nil {
		return d, fmt.Errorf("depth of %s: %w", t.opts.RetryQueueName, err)
	}
	d.Delayed = n
	return d, nil
}

// Publisher implements transport.Transport. Its Close leaves the shared client open.
func (t *Transport) Publisher(transport.Queue) (message.Publisher, error) {
	return resultPublisher{t}, nil
}

type resultPublisher struct{ t *Transport }

// Publish writes each result to topic: PUBLISH (channel mode) or LPUSH (list mode).
func (p resultPublisher) Publish(topic string, ms ...*message.Message) error {
	t := p.t
	ctx := context.Background()
	if len(ms) > 0 {
		ctx = context.WithoutCancel(ms[0].Context())
	}
	if t.opts.ResultMode == ResultList {
		vals := make([]any, len(ms))
		for i, m := range ms {
			vals[i] = []byte(m.Payload)
		}
		if err := t.client.LPush(ctx, topic, vals...).Err(); err != nil {
			return fmt.Errorf("lpush results to %s: %w", topic, err)
		}
		return nil
	}
	for _, m := range ms {
		n, err := t.client.Publish(ctx, topic, []byte(m.Payload)).Result()
		if err != nil {
			return fmt.Errorf("publish result to %s: %w", topic, err)
		}
		if n == 0 {
			t.stats.resultsUnheard.Add(1)
			t.log.Warn("result published to a channel nobody listens to: lost (use result_mode \"list\" to keep results)", "channel", topic, "uuid", m.UUID)
		}
	}
	return nil
}

// Close does nothing: the transport owns the client.
func (resultPublisher) Close() error { return nil }

// Source implements transport.Transport.
func (t *Transport) Source(q transport.Queue) (transport.Source, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, ErrClosed
	}
	s := &source{t: t, topic: q.Name, done: make(chan struct{}), inflight: map[*message.Message][]byte{}}
	s.space = sync.NewCond(&s.mu)
	t.subs[s] = struct{}{}
	return s, nil
}

// Close hands every buffered or un-acked request to the retry set (due at
// once, so another replica or the next start publishes it again), stops the
// mover and closes the client.
func (t *Transport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	subs := make([]*source, 0, len(t.subs))
	for s := range t.subs {
		subs = append(subs, s)
	}
	t.mu.Unlock()
	var errs []error
	for _, s := range subs {
		s.stop()
		s.handBackInflight()
	}
	t.cancel()
	t.bg.Wait()
	if err := t.client.Close(); err != nil {
		errs = append(errs, fmt.Errorf("close redis client: %w", err))
	}
	return errors.Join(errs...)
}

// Events implements transport.EventCounter.
func (t *Transport) Events() map[string]int64 {
	s := t.Stats()
	return map[string]int64{"received": s.Received, "delivered": s.Delivered, "handed_back": s.HandedBack,
		"interruptions": s.Interruptions, "requests_unheard": s.RequestsUnheard, "results_unheard": s.ResultsUnheard,
		"retries_held": s.RetriesHeld}
}

var _ transport.EventCounter = (*Transport)(nil)

// Cancelled implements transport.CancelChecker with upstream's per-request
// cancel keys (request-cancel:<id> = the request's token), checked before
// dispatch; concurrent checks share round trips (upstream.CancelReader).
// Requests without a token cost no round trip.
func (t *Transport) Cancelled(ctx context.Context, _ transport.Queue, req *wire.Request) (bool, error) {
	return t.upCancel.Cancelled(ctx, req)
}

var _ transport.CancelChecker = (*Transport)(nil)

// CheckHealth implements transport.HealthChecker as upstream does: one Redis
// PING on the transport's client, whatever the queues.
func (t *Transport) CheckHealth(ctx context.Context, _ []transport.Queue) error {
	return upstream.Ping(ctx, t.client)
}

var _ transport.HealthChecker = (*Transport)(nil)

var _ transport.MetricLabeler = (*Transport)(nil)

// MetricLabels labels as upstream's pub/sub loop: queue_id "" unless the
// envelope names one, queue_name the channel.
func (t *Transport) MetricLabels(q transport.Queue) transport.MetricLabels {
	return transport.MetricLabels{QueueName: q.Name, QueueIDFromMessage: true}
}
