// Package redisstream is sluice's Redis Streams transport: a durable queue
// read through a consumer group, in the entry format of
// watermill-redisstream (fields _watermill_message_uuid, payload and
// msgpack metadata), so Watermill producers and consumers interoperate.
//
// Why its own subscriber: watermill-redisstream's reads one entry at a time
// and waits for its ack before the next (throughput capped at 1/latency),
// and re-claims any entry idle longer than MaxIdleTime, so an LLM call that
// runs longer than that is claimed and run a second time while it is still
// running. Here:
//
//   - reads are windowed: one XREADGROUP asks for as many entries as free
//     credits (COUNT n), so a slow gateway does not cap throughput;
//   - a heartbeat re-claims this consumer's own entries in flight (XCLAIM
//     JUSTID, only if the entry is still its own, in one Lua script) every
//     heartbeat_ms, so they never look idle to other consumers while they
//     run, however long the call takes;
//   - entries idle longer than claim_idle_ms (their consumer died) are taken
//     over with XAUTOCLAIM;
//   - every write that ends a delivery (the result, a retry, a dead letter,
//     a hand-back) runs in one Lua script with XACK, fenced by ownership: a
//     consumer that lost its entry to another cannot write a second result.
//
// Retries wait in a sorted set per stream (<stream>:delayed, scored by due
// time) and are XADDed back to the stream when due; results go to a list
// (LPUSH, default) or a stream (XADD). Acked entries are deleted (XDEL)
// unless keep_acked is set. Keys of one queue must live on one node (use a
// hash tag on Redis Cluster).
package redisstream

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/internal/mutant"
	"github.com/sluice-io/sluice/internal/redisclient"
	"github.com/sluice-io/sluice/transports/internal/cancelset"
	"github.com/sluice-io/sluice/transports/internal/upstream"
)

// Name is the transport's registry name.
const Name = "redis-stream"

// Result modes.
const (
	// ResultList LPUSHes results to a list (consumers BRPOP).
	ResultList = "list"
	// ResultStream XADDs results to a stream, in watermill-redisstream's format.
	ResultStream = "stream"
)

// Metadata keys the subscriber sets on each delivery; the result publisher
// fences its write with them.
const (
	MetaStream = "sluice_stream"
	MetaEntry  = "sluice_entry"
)

// Server is the url key of the options, shared by the Redis transports.
type Server = redisclient.Server

// Options are the transport's options.
type Options struct {
	// Server is the url key (redisclient.Server): default the deployment's
	// REDIS_URL, then redisclient.DefaultURL, redis://localhost:6379/0. The
	// topology is the deployment's (redis_mode, redis_addrs,
	// redis_master_name); a Redis Cluster is refused.
	Server
	// ConsumerGroup is the consumer group (default "sluice"); created at the
	// start of the stream (id 0) when missing.
	ConsumerGroup string `json:"consumer_group,omitempty"`
	// Consumer is this process's consumer name (default host-pid-random).
	Consumer string `json:"consumer,omitempty"`
	// ClaimIdleMS: an entry pending this long with no heartbeat is taken
	// over from its (dead) consumer (default 60000).
	ClaimIdleMS int `json:"claim_idle_ms,omitempty"`
	// HeartbeatMS is how often entries in flight are touched (default claim_idle_ms/4).
	HeartbeatMS int `json:"heartbeat_ms,omitempty"`
	// BatchSize is the most entries read per round trip (default 256).
	BatchSize int `json:"batch_size,omitempty"`
	// BlockMS is how long one read waits for new entries (default 500).
	BlockMS int `json:"block_ms,omitempty"`
	// ResultMode is "list" (default) or "stream".
	ResultMode string `json:"result_mode,omitempty"`
	// DelayedSuffix names the retry set: <stream><suffix> (default ":delayed").
	DelayedSuffix string `json:"delayed_suffix,omitempty"`
	// DeadLetterSuffix names the dead-letter stream: <stream><suffix> (default ":dead").
	DeadLetterSuffix string `json:"dead_letter_suffix,omitempty"`
	// KeepAcked keeps acked entries in the stream (default false: XDEL).
	KeepAcked bool `json:"keep_acked,omitempty"`
	// RetryPollIntervalMS is how often due retries are moved back (default 100).
	RetryPollIntervalMS int `json:"retry_poll_interval_ms,omitempty"`
	// CancelKey names the keys of cancellations made through sluice
	// (Cancel; default DefaultCancelKey): a producer and the dispatchers
	// must agree on it.
	CancelKey string `json:"cancel_key,omitempty"`
}

func (o *Options) setDefaults(env transport.Env) {
	o.URL = redisclient.URL(o.URL, env.RedisURL)
	if o.ConsumerGroup == "" {
		o.ConsumerGroup = "sluice"
	}
	if o.Consumer == "" {
		host, _ := os.Hostname()
		var b [4]byte
		_, _ = rand.Read(b[:])
		o.Consumer = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
	}
	if o.ClaimIdleMS == 0 {
		o.ClaimIdleMS = 60000
	}
	if o.HeartbeatMS == 0 {
		o.HeartbeatMS = max(o.ClaimIdleMS/4, 1)
	}
	if o.BatchSize == 0 {
		o.BatchSize = 256
	}
	if o.BlockMS == 0 {
		o.BlockMS = 500
	}
	if o.ResultMode == "" {
		o.ResultMode = ResultList
	}
	if o.DelayedSuffix == "" {
		o.DelayedSuffix = ":delayed"
	}
	if o.DeadLetterSuffix == "" {
		o.DeadLetterSuffix = ":dead"
	}
	if o.RetryPollIntervalMS == 0 {
		o.RetryPollIntervalMS = 100
	}
	if o.CancelKey == "" {
		o.CancelKey = DefaultCancelKey
	}
}

// Validate reports options the transport cannot run with.
func (o *Options) Validate() error {
	var errs []error
	if o.ResultMode != ResultList && o.ResultMode != ResultStream {
		errs = append(errs, fmt.Errorf("result_mode %q: want %q or %q", o.ResultMode, ResultList, ResultStream))
	}
	if o.ClaimIdleMS < 1 {
		errs = append(errs, fmt.Errorf("claim_idle_ms %d: must be positive", o.ClaimIdleMS))
	}
	if o.HeartbeatMS < 1 || o.HeartbeatMS >= o.ClaimIdleMS {
		errs = append(errs, fmt.Errorf("heartbeat_ms %d: must be positive and below claim_idle_ms (%d), or entries in flight get claimed twice", o.HeartbeatMS, o.ClaimIdleMS))
	}
	if o.BatchSize < 1 {
		errs = append(errs, fmt.Errorf("batch_size %d: must be at least 1", o.BatchSize))
	}
	if o.BlockMS < 1 {
		errs = append(errs, fmt.Errorf("block_ms %d: must be at least 1", o.BlockMS))
	}
	if o.RetryPollIntervalMS < 1 {
		errs = append(errs, fmt.Errorf("retry_poll_interval_ms %d: must be at least 1", o.RetryPollIntervalMS))
	}
	return errors.Join(errs...)
}

// Factory builds the transport from its options. It does no I/O.
func Factory(options json.RawMessage, env transport.Env) (transport.Transport, error) {
	return transport.Build(options, env, New)
}

// errCluster refuses a Redis Cluster.
var errCluster = errors.New("redis-stream does not run on a Redis Cluster (its scripts write a stream and its result list, retry set or dead-letter stream in one step, which a cluster allows only within one hash slot): use redis-sortedset with redis_mode cluster, or redis_mode single or sentinel")

// ErrClosed is returned by operations on a closed transport.
var ErrClosed = errors.New("redis-stream transport closed")

// Stats counts what the transport observed.
type Stats struct {
	// Delivered is how many deliveries went to the core.
	Delivered int64
	// Reclaimed is how many entries were taken over from idle consumers.
	Reclaimed int64
	// Stale counts writes refused because the entry was no longer this consumer's.
	Stale int64
	// HandedBack counts entries re-appended un-answered (nack, shutdown).
	HandedBack int64
}

// Transport is the Redis Streams transport. It is safe for concurrent use.
type Transport struct {
	opts   Options
	client *redis.Client
	// upCancel reads upstream's per-request cancel keys, batched.
	upCancel *upstream.CancelReader
	pub      *redisstream.Publisher
	log      *slog.Logger
	seq      atomic.Uint64

	delivered, reclaimed, stale, handedBack atomic.Int64

	ctx    context.Context // ends at Close; heartbeats outlive their subscriber's reads
	cancel context.CancelFunc
	bg     sync.WaitGroup

	mu       sync.Mutex
	closed   bool
	inflight map[string]*delivery // key: stream + "\x00" + entry id
	subs     []*source
	groups   map[string]bool

	cancels cancelset.Set // this replica's copy of the cancel set
}

// delivery is one entry handed to the core and not yet settled.
type delivery struct {
	stream  string
	id      string
	msg     *message.Message
	settled atomic.Bool // a fenced write already acked it
}

var (
	_ transport.Transport        = (*Transport)(nil)
	_ transport.Requeuer         = (*Transport)(nil)
	_ transport.RequestPublisher = (*Transport)(nil)
	_ transport.DepthReporter    = (*Transport)(nil)
	_ transport.DeadLetterer     = (*Transport)(nil)
)

// NewClient returns o with its defaults and a client of the Redis it
// names, reached as env says (redis_mode, redis_addrs, redis_master_name,
// TLS): the client New runs on, for a producer beside the dispatcher
// (DialProducer). It connects lazily.
func NewClient(o Options, env transport.Env) (*redis.Client, Options, error) {
	o.setDefaults(env)
	if err := o.Validate(); err != nil {
		return nil, o, err
	}
	// The deployment's topology (redis_mode, redis_addrs,
	// redis_master_name): one server, or one found through sentinels.
	top, err := redisclient.ParseTopology(env.RedisMode, env.RedisAddrs, env.RedisMasterName)
	if err != nil {
		return nil, o, fmt.Errorf("redis_mode, redis_addrs, redis_master_name: %w", err)
	}
	if top.Mode == redisclient.Cluster {
		return nil, o, errCluster
	}
	ro, err := top.Parse(o.URL)
	if err != nil {
		return nil, o, fmt.Errorf("url: %w", err)
	}
	ro.Tune(func(c *redisclient.Common) { c.TLSConfig = env.RedisTLSFor(c.TLSConfig) })
	client, err := ro.NewClient()
	if err != nil {
		return nil, o, err
	}
	return client, o, nil
}

// New builds the transport; it connects lazily.
func New(o Options, env transport.Env) (*Transport, error) {
	client, o, err := NewClient(o, env)
	if err != nil {
		return nil, err
	}
	log := env.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	pub, err := redisstream.NewPublisher(redisstream.PublisherConfig{Client: client}, nil)
	if err != nil {
		_ = client.Close()
		return nil, fmt.Errorf("stream publisher: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Transport{opts: o, client: client, upCancel: upstream.NewCancelReader(client), pub: pub, log: log.With("transport", Name), ctx: ctx, cancel: cancel,
		inflight: map[string]*delivery{}, groups: map[string]bool{}}, nil
}

// Options returns the defaulted options.
func (t *Transport) Options() Options { return t.opts }

// Stats returns the counters.
func (t *Transport) Stats() Stats {
	return Stats{Delivered: t.delivered.Load(), Reclaimed: t.reclaimed.Load(), Stale: t.stale.Load(), HandedBack: t.handedBack.Load()}
}

func key(stream, id string) string { return stream + "\x00" + id }

// lookup finds the delivery behind m (or the result message that carries m's metadata).
func (t *Transport) lookup(m *message.Message) *delivery {
	stream, id := m.Metadata.Get(MetaStream), m.Metadata.Get(MetaEntry)
	if stream == "" || id == "" {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.inflight[key(stream, id)]
}

// forget removes d from the in-flight index; it reports whether d was still there.
func (t *Transport) forget(d *delivery) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := key(d.stream, d.id)
	if t.inflight[k] != d {
		return false
	}
	delete(t.inflight, k)
	return true
}

// PublishRequest implements transport.RequestPublisher: XADD to q's stream
// through watermill-redisstream's publisher.
func (t *Transport) PublishRequest(ctx context.Context, q transport.Queue, payload []byte) error {
	m := message.NewMessage(t.newUUID(), payload)
	m.SetContext(ctx)
	if err := t.pub.Publish(q.Name, m); err != nil {
		return fmt.Errorf("publish request to %s: %w", q.Name, err)
	}
	return nil
}

func (t *Transport) newUUID() string {
	return strconv.FormatInt(time.Now().UnixNano(), 36) + "-" + strconv.FormatUint(t.seq.Add(1), 36)
}

// fenced runs a script that ends delivery d (KEYS[1] is d's stream, ARGV[1..3]
// group, consumer, entry id). It reports whether d was still this consumer's.
func (t *Transport) fenced(ctx context.Context, s *redis.Script, d *delivery, keys []string, args ...any) (bool, error) {
	all := append([]any{t.opts.ConsumerGroup, t.opts.Consumer, d.id, boolArg(!t.opts.KeepAcked)}, args...)
	n, err := s.Run(ctx, t.client, append([]string{d.stream}, keys...), all...).Int()
	if err != nil {
		return false, err
	}
	if n == 0 {
		t.stale.Add(1)
		t.log.Warn("entry no longer ours (taken over by another consumer); write skipped", "stream", d.stream, "entry", d.id)
		return false, nil
	}
	d.settled.Store(true)
	return true, nil
}

func boolArg(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// ownedPrelude checks that entry ARGV[3] of stream KEYS[1] is pending for
// consumer ARGV[2] in group ARGV[1]; ackTail acks it and deletes it when ARGV[4] is "1".
const ownedPrelude = `
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if #p == 0 or p[1][2] ~= ARGV[2] then return 0 end
`
const ackTail = `
redis.call('XACK', KEYS[1], ARGV[1], ARGV[3])
if ARGV[4] == '1' then redis.call('XDEL', KEYS[1], ARGV[3]) end
return 1
`

// resultScript writes results to KEYS[2] (ARGV[5] "list" or "stream"; ARGV[6..]
// pairs of uuid, payload) and acks the entry, if still owned.
var resultScript = redis.NewScript(ownedPrelude + resultBody + ackTail)

const resultBody = `
for i = 6, #ARGV, 2 do
  if ARGV[5] == 'list' then
    redis.call('LPUSH', KEYS[2], ARGV[i+1])
  else
    redis.call('XADD', KEYS[2], '*', '_watermill_message_uuid', ARGV[i], 'payload', ARGV[i+1])
  end
end
`

// requeueScript parks ARGV[6] in the retry set KEYS[2] at score ARGV[5] and acks the entry, if still owned.
var requeueScript = redis.NewScript(ownedPrelude + `
redis.call('ZADD', KEYS[2], ARGV[5], ARGV[6])
` + ackTail)

// deadScript appends the entry's payload to the dead-letter stream KEYS[2] and acks it, if still owned.
var deadScript = redis.NewScript(ownedPrelude + `
redis.call('XADD', KEYS[2], '*', '_watermill_message_uuid', ARGV[5], 'payload', ARGV[6], 'reason', ARGV[7])
` + ackTail)

// handBackScript re-appends the entry (fields ARGV[5], ARGV[6]) at the tail and acks the old one, if still owned.
var handBackScript = redis.NewScript(ownedPrelude + `
redis.call('XADD', KEYS[1], '*', '_watermill_message_uuid', ARGV[5], 'payload', ARGV[6])
` + ackTail)

// moveScript XADDs the due members (JSON {"u","p"}) of retry set KEYS[2]
// back to stream KEYS[1]. ARGV: now (ms), limit. Returns how many moved.
var moveScript = redis.NewScript(`
local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, m in ipairs(due) do
  local e = cjson.decode(m)
  redis.call('XADD', KEYS[1], '*', '_watermill_message_uuid', e.u, 'payload', e.p)
  redis.call('ZREM', KEYS[2], m)
end
return #due
`)

// touchScript re-claims (JUSTID, idle reset) the entries ARGV[3..] of stream
// KEYS[1] that are still pending for consumer ARGV[2] of group ARGV[1].
var touchScript = redis.NewScript(`
local n = 0
for i = 3, #ARGV do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if #p > 0 and p[1][2] == ARGV[2] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
    n = n + 1
  end
end
return n
`)

type retryEntry struct {
	UUID    string `json:"u"`
	Payload string `json:"p"`
}

// Requeue implements transport.Requeuer: the new bytes wait in the
// stream's retry set until due; the entry is acked in the same step.
func (t *Transport) Requeue(ctx context.Context, q transport.Queue, m *message.Message, payload []byte, due time.Time) error {
	member, err := json.Marshal(retryEntry{UUID: t.newUUID(), Payload: string(payload)})
	if err != nil {
		return fmt.Errorf("requeue on %s: %w", q.Name, err)
	}
	d := t.lookup(m)
	if d == nil {
		// Not a delivery of ours (or already handed back): park the new bytes only.
		if err := t.client.ZAdd(ctx, q.Name+t.opts.DelayedSuffix, redis.Z{Score: float64(due.UnixMilli()), Member: member}).Err(); err != nil {
			return fmt.Errorf("requeue on %s: %w", q.Name, err)
		}
		return nil
	}
	if _, err := t.fenced(ctx, requeueScript, d, []string{d.stream + t.opts.DelayedSuffix}, due.UnixMilli(), member); err != nil {
		return fmt.Errorf("requeue on %s: %w", q.Name, err)
	}
	return nil
}

// DeadLetter implements transport.DeadLetterer: the entry moves to the
// stream's dead-letter stream (<stream>:dead) with the reason.
func (t *Transport) DeadLetter(ctx context.Context, q transport.Queue, m *message.Message, reason string) error {
	d := t.lookup(m)
	if d == nil {
		return fmt.Errorf("dead-letter on %s: message %s is not an entry in flight", q.Name, m.UUID)
	}
	if _, err := t.fenced(ctx, deadScript, d, []string{d.stream + t.opts.DeadLetterSuffix}, m.UUID, []byte(m.Payload), reason); err != nil {
		return fmt.Errorf("dead-letter on %s: %w", q.Name, err)
	}
	return nil
}

// Depth implements transport.DepthReporter: the group's lag, its pending
// entries, the retry set and the dead-letter stream.
func (t *Transport) Depth(ctx context.Context, q transport.Queue) (transport.Depth, error) {
	d := transport.Depth{Waiting: -1, InFlight: -1}
	groups, err := t.client.XInfoGroups(ctx, q.Name).Result()
	if err != nil && !isNoKey(err) {
		return d, fmt.Errorf("depth of %s: %w", q.Name, err)
	}
	for _, g := range groups {
		if g.Name == t.opts.ConsumerGroup {
			d.Waiting, d.InFlight = g.Lag, g.Pending
		}
	}
	pipe := t.client.Pipeline()
	delayed := pipe.ZCard(ctx, q.Name+t.opts.DelayedSuffix)
	dead := pipe.XLen(ctx, q.Name+t.opts.DeadLetterSuffix)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return d, fmt.Errorf("depth of %s: %w", q.Name, err)
	}
	d.Delayed, d.DeadLettered = delayed.Val(), dead.Val()
	return d, nil
}

func isNoKey(err error) bool {
	return err != nil && (errors.Is(err, redis.Nil) || err.Error() == "ERR no such key")
}

// Publisher implements transport.Transport: results are written in one
// fenced step with the ack of their request. Its Close leaves the client open.
func (t *Transport) Publisher(transport.Queue) (message.Publisher, error) {
	return resultPublisher{t}, nil
}

type resultPublisher struct{ t *Transport }

// Publish writes the results to topic. A result whose request entry is
// known (its metadata) is written only if the entry is still this
// consumer's, and acks it in the same step; others are written plainly.
func (p resultPublisher) Publish(topic string, ms ...*message.Message) error {
	t := p.t
	for _, m := range ms {
		ctx := context.WithoutCancel(m.Context())
		if d := t.lookup(m); d != nil {
			script := resultScript
			if mutant.On(mutant.StreamAckUnowned) {
				// Planted bug: the result is written and the entry acked
				// whoever owns it now.
				script = mutatedScript(mutant.StreamAckUnowned)
			}
			if _, err := t.fenced(ctx, script, d, []string{topic}, t.opts.ResultMode, m.UUID, []byte(m.Payload)); err != nil {
				return fmt.Errorf("write result to %s: %w", topic, err)
			}
			continue
		}
		var err error
		if t.opts.ResultMode == ResultList {
			err = t.client.LPush(ctx, topic, []byte(m.Payload)).Err()
		} else {
			err = t.client.XAdd(ctx, &redis.XAddArgs{Stream: topic, Values: []any{redisstream.UUIDHeaderKey, m.UUID, "payload", []byte(m.Payload)}}).Err()
		}
		if err != nil {
			return fmt.Errorf("write result to %s: %w", topic, err)
		}
	}
	return nil
}

// Close does nothing: the transport owns the client.
func (resultPublisher) Close() error { return nil }

// RoutesResults implements transport.ResultRouter: a result list (or
// stream) is any key, so a request may name its own
// (wire.Request.ResultQueueName) and its caller reads only its own
// (Producer).
func (*Transport) RoutesResults() {}

var _ transport.ResultRouter = (*Transport)(nil)

// Source implements transport.Transport.
func (t *Transport) Source(q transport.Queue) (transport.Source, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, ErrClosed
	}
	s := &source{t: t, stream: q.Name, mine: map[string]*delivery{}}
	t.subs = append(t.subs, s)
	return s, nil
}

// Close stops the subscribers and hands every entry still in flight back
// (re-appended to its stream, at once visible to other consumers).
func (t *Transport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	subs := t.subs
	t.mu.Unlock()
	for _, s := range subs {
		_ = s.Close()
	}
	t.mu.Lock()
	var rest []*delivery
	for k, d := range t.inflight {
		rest = append(rest, d)
		delete(t.inflight, k)
	}
	t.mu.Unlock()
	var errs []error
	for _, d := range rest {
		if err := t.handBack(d); err != nil {
			errs = append(errs, err)
		}
	}
	t.cancel()
	t.bg.Wait()
	if err := t.client.Close(); err != nil {
		errs = append(errs, fmt.Errorf("close redis client: %w", err))
	}
	return errors.Join(errs...)
}

// handBack re-appends d's entry and acks the old one.
func (t *Transport) handBack(d *delivery) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ok, err := t.fenced(ctx, handBackScript, d, nil, d.msg.UUID, []byte(d.msg.Payload))
	if err != nil {
		t.log.Error("could not hand an entry back; it stays pending and is taken over after claim_idle_ms", "stream", d.stream, "entry", d.id, "err", err)
		return fmt.Errorf("hand back %s %s: %w", d.stream, d.id, err)
	}
	if ok {
		t.handedBack.Add(1)
	}
	return nil
}

// Events implements transport.EventCounter.
func (t *Transport) Events() map[string]int64 {
	s := t.Stats()
	return map[string]int64{"delivered": s.Delivered, "reclaimed": s.Reclaimed, "stale": s.Stale, "handed_back": s.HandedBack}
}

var _ transport.EventCounter = (*Transport)(nil)

// CheckHealth implements transport.HealthChecker as upstream does: one Redis
// PING on the transport's client, whatever the queues.
func (t *Transport) CheckHealth(ctx context.Context, _ []transport.Queue) error {
	return upstream.Ping(ctx, t.client)
}

var _ transport.HealthChecker = (*Transport)(nil)
