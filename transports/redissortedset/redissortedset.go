// Package redissortedset is sluice's Redis sorted-set transport, compatible
// with the llm-d Async Processor's "redis-sortedset" queues and safe where
// upstream is not: requests are claimed into leases instead of being popped,
// so a crashed replica loses nothing.
//
// Requests wait in a sorted set scored by deadline (Unix seconds, millisecond
// precision); among equal deadlines the producer library's requests come out
// in enqueue order. A claim (one Lua script, one round trip) moves up to
// "free credits" requests into leases; heartbeats renew the leases of
// requests in flight; a reclaimer returns expired leases to the queue; a
// request whose lease expired max_deliveries times is dead-lettered with an
// INFERENCE_ERROR result. A result is written by one Lua script fenced by the
// lease token: it writes the result and drops the lease, or, when the lease
// was lost meanwhile, discards the result and counts it as late. Retries park
// in a delay set scored by due time and return to the queue with their
// original deadline as score. Taking over from upstream llm-d-async, the
// transport honours the state it left (its retry set and its per-request
// cancellation keys, see takeover.go), and Migrator moves queue state
// between the two layouts. See docs/redis-sortedset.md for the key layout
// and the reasoning behind the defaults.
package redissortedset

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/cenkalti/backoff/v5"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/internal/mutant"
	"github.com/sluice-io/sluice/internal/redisclient"
	"github.com/sluice-io/sluice/internal/retry"
	"github.com/sluice-io/sluice/transports/internal/cancelset"
	"github.com/sluice-io/sluice/transports/internal/upstream"
	"github.com/sluice-io/sluice/transports/redissortedset/internal/keys"
)

// Name is the transport's registry name.
const Name = "redis-sortedset"

// DefaultPrefix is the default key prefix.
const DefaultPrefix = keys.DefaultPrefix

// DefaultTenant is the tenant of ResultQueueName when none is given.
const DefaultTenant = keys.DefaultTenant

// Metadata keys of a delivered message. The core copies a delivery's
// metadata onto its result message, which is how the result publisher finds
// the lease to fence the write with.
const (
	MetaLease      = "sluice_lease"
	MetaScore      = "sluice_score"
	MetaDeliveries = "sluice_deliveries"
	MetaQueue      = "sluice_queue"
	// MetaClaim is the claim id of the delivery in upstream's claim keys
	// (data.id + "\x00" + request token for an envelope); MetaLease is its
	// owner token.
	MetaClaim = "sluice_claim"
)

// RequestQueueName is the request queue of pool under the default prefix:
// llm-d-async:requests:<pool>.
func RequestQueueName(pool string) string { return keys.Names{}.RequestQueue(pool) }

// ResultQueueName is the result list of pool and tenant under the default
// prefix: llm-d-async:results:<pool>:<tenant>; tenant defaults to "$batch".
func ResultQueueName(pool, tenant string) string { return keys.Names{}.ResultQueue(pool, tenant) }

// ErrClosed is returned by operations on a closed transport.
var ErrClosed = errors.New("redis-sortedset transport closed")

// Factory builds the transport from its options; it does no I/O.
func Factory(options json.RawMessage, env transport.Env) (transport.Transport, error) {
	var o Options
	if err := transport.DecodeOptions(options, &o); err != nil {
		return nil, err
	}
	t, err := New(o.withEnv(env), env.Logger)
	if err != nil {
		return nil, err
	}
	return t, nil
}

// withEnv is o with what it leaves to the deployment taken from env: the
// url (REDIS_URL), the topology as a whole (redis_mode, redis_addrs,
// redis_master_name) and redis_tls (used when o has no tls_* option).
func (o Options) withEnv(env transport.Env) Options {
	if o.URL == "" {
		o.URL = env.RedisURL
	}
	o.TopologyOptions = o.Or(TopologyOptions{Mode: env.RedisMode, Addrs: env.RedisAddrs, MasterName: env.RedisMasterName})
	o.deploymentTLS = env.RedisTLS
	return o
}

// NewClient returns the client the transport of options o in env (as
// Factory gets them) runs on — url, topology, tls_* and pool_size, else
// the deployment's — for a producer beside the dispatcher, and o with
// env's settings and the defaults applied.
func NewClient(o Options, env transport.Env) (redis.UniversalClient, Options, error) {
	o = o.withEnv(env)
	o.SetDefaults()
	if err := o.Validate(); err != nil {
		return nil, o, err
	}
	ro, err := RedisOptions(o.URL, o)
	if err != nil {
		return nil, o, err
	}
	return ro.New(), o, nil
}

// Stats are the transport's counters since it started.
type Stats struct {
	// Claimed counts requests claimed.
	Claimed int64
	// LateResults counts results discarded because their lease was lost
	// (the request had been reclaimed and handed to another claim).
	LateResults int64
	// LateRequeues counts retries dropped for the same reason.
	LateRequeues int64
	// Reclaimed counts expired leases this replica returned to the queue.
	Reclaimed int64
	// LostLeases counts leases a heartbeat found gone.
	LostLeases int64
	// GaveUp counts requests dead-lettered after max_deliveries.
	GaveUp int64
	// AdoptedRetries counts due retries this replica moved from upstream's
	// retry set back into their queue (see UpstreamRetrySet).
	AdoptedRetries int64
}

// Transport is the Redis sorted-set transport. It is safe for concurrent use.
type Transport struct {
	opts   Options
	log    *slog.Logger
	client redis.UniversalClient
	// upCancel reads upstream's per-request cancel keys, batched.
	upCancel *upstream.CancelReader
	// cluster is set for a Redis Cluster: names are hash-tagged, upstream's
	// takeover (its keys span slots) is off, and the cancel epoch is read
	// apart from the claim.
	cluster bool
	db      int
	names   keys.Names
	id      string
	seq     atomic.Uint64

	closing chan struct{}
	// closingCtx is cancelled with ErrClosed when closing is closed: the
	// context of the retries that end with the transport.
	closingCtx    context.Context
	cancelClosing context.CancelCauseFunc
	closeOnce     sync.Once
	wg            sync.WaitGroup // loops, batchers and settle waiters

	mu       sync.Mutex
	queues   map[string]*queueState
	batchers map[[2]string]*settler
	warned   map[[2]string]bool // (queue, result list) pairs said to take the cross-slot settle
	closed   bool
	adopting bool // the loop adopting upstream's retry set runs

	// cancels is this replica's copy of the cancellations (P:cancelled),
	// refreshed whenever a claim sees the cancel epoch move, so a request
	// claimed after a cancellation was recorded is always checked against
	// it, without a round trip per request. Its watcher is told of every
	// announcement on P:cancel, also of an entry it holds.
	cancels cancelset.Set

	// faultHook, when set (by tests), is called before each step of a
	// cross-slot settle; an error it returns fails the step (see fault).
	faultHook func(point int) error
	// settleHook, when a test sets it before the first settle, runs after
	// each script call of a settle; an error it returns fails the settle
	// there, as a crash of the replica between two calls would.
	settleHook func() error

	claimed, lateResults, lateRequeues, reclaimed, lostLeases, gaveUp atomic.Int64
	adopted, adoptSkipped                                             atomic.Int64
	replicaShortfalls                                                 atomic.Int64
	xslotFinished                                                     atomic.Int64
}

var (
	_ transport.Transport        = (*Transport)(nil)
	_ transport.Requeuer         = (*Transport)(nil)
	_ transport.RequestPublisher = (*Transport)(nil)
	_ transport.CancelChecker    = (*Transport)(nil)
	_ transport.CancelWatcher    = (*Transport)(nil)
	_ transport.DepthReporter    = (*Transport)(nil)
	_ transport.DeadLetterer     = (*Transport)(nil)
)

// replicaIDBytes is the size of a replica's random id, which opens every
// owner token it writes ("<id in hex>:<claim call>:<i>"). 32 bytes make
// each token longer than 64 bytes, Redis' default hash-max-listpack-value,
// so Q:claim-owners becomes a hash table at the first claim. Kept as a
// listpack (a hash of short values stays one up to 512 entries by
// default), it was scanned from the start by every write and lookup: the
// claim's HSET, the settle's HMGET and HDEL, the renewal's HMGET. At the
// bench's 64 in flight that scan was a tenth of the scripts' instructions
// per request (docs/benchmarks-log.md, ninth pass).
const replicaIDBytes = 32

// New builds the transport; it does no I/O until a subscriber runs.
func New(o Options, log *slog.Logger) (*Transport, error) {
	o.SetDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	ro, err := RedisOptions(o.URL, o)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var id [replicaIDBytes]byte
	_, _ = rand.Read(id[:])
	cluster := ro.Mode() == redisclient.Cluster
	client := ro.New()
	closingCtx, cancelClosing := context.WithCancelCause(context.Background())
	return &Transport{
		opts:          o,
		log:           log,
		client:        client,
		upCancel:      upstream.NewCancelReader(client),
		cluster:       cluster,
		db:            ro.DB(),
		names:         keys.Names{Prefix: o.Prefix, DelayedTemplate: o.RetryQueueName, Cluster: cluster},
		id:            hex.EncodeToString(id[:]),
		closing:       make(chan struct{}),
		closingCtx:    closingCtx,
		cancelClosing: cancelClosing,
		queues:        map[string]*queueState{},
		batchers:      map[[2]string]*settler{},
		warned:        map[[2]string]bool{},
		cancels:       cancelset.Set{ReportRepeats: true},
	}, nil
}

// Client returns the transport's Redis client (for tests and tools).
func (t *Transport) Client() redis.UniversalClient { return t.client }

// Stats returns the transport's counters.
func (t *Transport) Stats() Stats {
	return Stats{Claimed: t.claimed.Load(), LateResults: t.lateResults.Load(), LateRequeues: t.lateRequeues.Load(),
		Reclaimed: t.reclaimed.Load(), LostLeases: t.lostLeases.Load(), GaveUp: t.gaveUp.Load(), AdoptedRetries: t.adopted.Load()}
}

// queueState is what the transport holds for one request queue.
type queueState struct {
	k       keys.Queue
	started bool
	served  bool   // a source was made for it (guarded by Transport.mu)
	id      string // its queue id, when served

	mu   sync.Mutex
	held map[string]hold // owner tokens of claims this replica holds, not yet settled
	// lastCall is the record of the last claim call (see keys.Claim),
	// deleted by the next one.
	lastCall string
}

// hold is one claim this replica holds: its claim id, the score it had in
// the queue (a hand-back restores it) and the cap of its lease (Unix ms:
// deadline + 5 min; 0 for none).
type hold struct {
	claim, score string
	capMS        int64
}

// queue returns the state of request queue name, creating it.
func (t *Transport) queue(name string) *queueState {
	t.mu.Lock()
	defer t.mu.Unlock()
	qs, ok := t.queues[name]
	if !ok {
		qs = &queueState{k: t.names.Queue(name), held: map[string]hold{}}
		t.queues[name] = qs
	}
	return qs
}

// hold records the claims of items as held by this replica.
func (qs *queueState) hold(items []claimed) {
	qs.mu.Lock()
	for _, c := range items {
		qs.held[c.token] = hold{claim: c.claim, score: c.score, capMS: c.capMS}
	}
	qs.mu.Unlock()
}

// settle forgets token and reports whether it was still held, and how.
func (qs *queueState) settle(token string) (hold, bool) {
	qs.mu.Lock()
	h, ok := qs.held[token]
	delete(qs.held, token)
	qs.mu.Unlock()
	return h, ok
}

// heldClaim is one held claim with its owner token.
type heldClaim struct {
	token string
	hold
}

func (qs *queueState) holds() []heldClaim {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	out := make([]heldClaim, 0, len(qs.held))
	for tok, h := range qs.held {
		out = append(out, heldClaim{token: tok, hold: h})
	}
	return out
}

// startLoops starts the heartbeat and reclaim loops of qs once, and the
// transport's loop adopting upstream's retry set with the first queue.
func (t *Transport) startLoops(qs *queueState) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return ErrClosed
	}
	if qs.started {
		return nil
	}
	qs.started = true
	t.wg.Add(2)
	go t.heartbeatLoop(qs)
	go t.reclaimLoop(qs)
	if !t.adopting && !t.cluster {
		t.adopting = true
		t.wg.Add(1)
		go t.adoptLoop()
	}
	return nil
}

// every runs fn every d until the transport closes.
func (t *Transport) every(d time.Duration, fn func(ctx context.Context)) {
	defer t.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-t.closing
		cancel()
	}()
	tick := time.NewTicker(d)
	defer tick.Stop()
	for {
		select {
		case <-t.closing:
			return
		case <-tick.C:
			fn(ctx)
		}
	}
}

func (t *Transport) heartbeatLoop(qs *queueState) {
	t.every(ms(t.opts.HeartbeatMS), func(ctx context.Context) { t.heartbeat(ctx, qs) })
}

// heartbeat renews the claims this replica holds on qs.
func (t *Transport) heartbeat(ctx context.Context, qs *queueState) {
	hs := qs.holds()
	for len(hs) > 0 {
		n := min(len(hs), 1000)
		args := make([]any, 0, 3*n+1)
		args = append(args, t.opts.LeaseMS)
		for _, h := range hs[:n] {
			args = append(args, h.token, h.claim, h.capMS)
		}
		hs = hs[n:]
		cctx, cancel := context.WithTimeout(ctx, ms(t.opts.HeartbeatMS))
		script := keys.Extend
		if mutant.On(mutant.HeartbeatNoRenew) {
			// Planted bug: the heartbeat checks ownership but renews nothing.
			script = keys.Mutated(mutant.HeartbeatNoRenew)
		}
		lost, err := script.Run(cctx, t.client, []string{qs.k.Owners, qs.k.ClaimsIdx}, args...).StringSlice()
		cancel()
		if err != nil {
			t.log.Warn("lease heartbeat failed", "queue", qs.k.Name, "err", err)
			return
		}
		if len(lost) > 0 {
			t.lostLeases.Add(int64(len(lost)))
			t.log.Warn("claims lost (expired and reclaimed, or taken over by a later claim of the same request); their results will be discarded", "queue", qs.k.Name, "count", len(lost))
		}
	}
}

func (t *Transport) reclaimLoop(qs *queueState) {
	t.every(ms(t.opts.ReclaimIntervalMS), func(ctx context.Context) {
		t.reclaim(ctx, qs)
		t.refreshCancels(ctx, "")
	})
}

// reclaim returns the expired claims of qs, whoever made them (this or
// another sluice replica, or an upstream replica), to the queue, and the
// expired leases of earlier sluice versions.
//
// The expired claims are selected by Redis' clock (the node's that holds
// the queue), never this replica's: the index is scored by Redis' clock,
// and a replica whose clock is behind it would otherwise leave claims
// expired by Redis' clock unreclaimed for as long as the skew.
func (t *Transport) reclaim(ctx context.Context, qs *queueState) {
	now, err := redisNow(ctx, t.client, qs.k)
	if mutant.On(mutant.ReclaimReplicaClock) {
		now = time.Now() // planted bug: the replica's clock bounds the expired claims
	}
	var n, finished int
	if err == nil {
		n, finished, err = reclaimExpired(ctx, t.client, qs.k, now, t.runScript)
	}
	if err == nil {
		var legacy int
		legacy, err = reclaimLegacy(ctx, t.client, qs.k)
		n += legacy
	}
	if err != nil && ctx.Err() == nil {
		t.log.Warn("reclaiming expired claims failed", "queue", qs.k.Name, "err", err)
	}
	if finished > 0 {
		t.xslotFinished.Add(int64(finished))
		t.log.Info("finished writing results of expired claims across hash slots (their owner stopped between the steps)", "queue", qs.k.Name, "count", finished)
	}
	if n > 0 {
		t.reclaimed.Add(int64(n))
		t.log.Info("returned requests with expired claims to the queue", "queue", qs.k.Name, "count", n)
		t.notify(ctx, qs)
	}
}

// redisNow reads the clock of the Redis node that holds queue k.
func redisNow(ctx context.Context, c redis.Cmdable, k keys.Queue) (time.Time, error) {
	ms, err := keys.Now.Run(ctx, c, []string{k.ClaimsIdx}).Int64()
	if err != nil {
		return time.Time{}, fmt.Errorf("read the Redis clock for %s: %w", k.Name, err)
	}
	return time.UnixMilli(ms), nil
}

// reclaimPage is how many expired claims one reclaim round examines
// (upstream's reclaimBatchSize).
const reclaimPage = 100

// ReclaimExpired returns every claim of queue k whose lease expired before
// now (by the index, scored by Redis' clock: now must be Redis' time too,
// or claims expired by it stay claimed for the skew; the script checks
// again by Redis' clock) to the queue
// with its stored member, scored by QueueScore, as upstream's reclaimer
// does; it returns how many it returned.
//
// A claim whose owner died while writing its result to a list in another
// hash slot is not returned to the queue: its write is finished instead
// (see xslot.go), and it counts among those returned.
func ReclaimExpired(ctx context.Context, c redis.Cmdable, k keys.Queue, now time.Time) (int, error) {
	n, finished, err := reclaimExpired(ctx, c, k, now, func(ctx context.Context, s *redis.Script, ks []string, args ...any) *redis.Cmd {
		return s.Run(ctx, c, ks, args...)
	})
	return n + finished, err
}

// scriptRunner runs a result-writing script (Transport.runScript, or the
// plain client).
type scriptRunner func(ctx context.Context, s *redis.Script, ks []string, args ...any) *redis.Cmd

// reclaimExpired is ReclaimExpired, counting apart the cross-slot settles
// it finished (finished) from the claims it returned to the queue (n).
func reclaimExpired(ctx context.Context, c redis.Cmdable, k keys.Queue, now time.Time, run scriptRunner) (n, finished int, err error) {
	upTo := strconv.FormatFloat(float64(now.UnixMilli())/1000, 'f', -1, 64)
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		rn, rf, more, err := reclaimRound(cctx, c, k, upTo, run)
		cancel()
		n, finished = n+rn, finished+rf
		if err != nil {
			return n, finished, fmt.Errorf("reclaim expired claims of %s: %w", k.Name, err)
		}
		if !more {
			return n, finished, nil
		}
	}
}

// reclaimRound reclaims one page of expired claims, returning n to the
// queue and finishing the cross-slot settles of finished; more reports a
// full page.
func reclaimRound(ctx context.Context, c redis.Cmdable, k keys.Queue, upTo string, run scriptRunner) (n, finished int, more bool, err error) {
	cks, err := c.ZRangeArgs(ctx, redis.ZRangeArgs{Key: k.ClaimsIdx, ByScore: true, Start: "-inf", Stop: upTo, Count: reclaimPage}).Result()
	if err != nil || len(cks) == 0 {
		return 0, 0, false, err
	}
	members, err := c.HMGet(ctx, k.Claimed, cks...).Result()
	if err != nil {
		return 0, 0, false, err
	}
	args := make([]any, 0, 2*len(cks))
	for i, ck := range cks {
		m, _ := members[i].(string)
		args = append(args, ck, QueueScore([]byte(m))) // a ghost (no member) is dropped by the script
	}
	script := keys.Reclaim
	if mutant.On(mutant.TakeoverIgnoresLive) {
		// Planted bug: every claim counts as expired, live owner or not.
		script = keys.Mutated(mutant.TakeoverIgnoresLive)
		if cks, err = c.ZRange(ctx, k.ClaimsIdx, 0, reclaimPage-1).Result(); err != nil || len(cks) == 0 {
			return 0, 0, false, err
		}
		if members, err = c.HMGet(ctx, k.Claimed, cks...).Result(); err != nil {
			return 0, 0, false, err
		}
		args = args[:0]
		for i, ck := range cks {
			m, _ := members[i].(string)
			args = append(args, ck, QueueScore([]byte(m)))
		}
	}
	rkeys := []string{k.Name, k.Claimed, k.Owners, k.ClaimsIdx, k.Redeliveries, k.Stats, k.Settling}
	if mutant.On(mutant.ReclaimIgnoresSettling) {
		rkeys = rkeys[:6] // planted bug: no settling records looked at
	}
	raw, err := script.Run(ctx, c, rkeys, args...).Slice()
	if err != nil {
		return 0, 0, false, err
	}
	if len(raw) == 0 || len(raw)%2 != 1 {
		return 0, 0, false, fmt.Errorf("reclaim: unexpected reply of %d elements", len(raw))
	}
	r, _ := raw[0].(int64)
	n = int(r)
	if len(raw) > 1 {
		finished, err = finishSettles(ctx, c, k, raw[1:], run)
	}
	return n, finished, len(cks) == reclaimPage && n+finished > 0, err
}

// reclaimLegacy returns the expired leases of earlier sluice versions.
func reclaimLegacy(ctx context.Context, c redis.Cmdable, k keys.Queue) (int, error) {
	const limit = 500
	total := 0
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		n, err := keys.LegacyRelease.Run(cctx, c, []string{k.Leases, k.Leased, k.Name, k.Redeliveries, k.Stats}, limit).Int()
		cancel()
		total += n
		if err != nil {
			return total, fmt.Errorf("reclaim expired leases of an earlier version on %s: %w", k.Name, err)
		}
		if n < limit {
			return total, nil
		}
	}
}

func (t *Transport) notify(ctx context.Context, qs *queueState) {
	_ = t.client.Publish(ctx, qs.k.Notify, "1").Err()
}

// release hands held claims back to their queue at once (a nack), each at
// the score it had there.
func (t *Transport) release(ctx context.Context, qs *queueState, hs ...heldClaim) error {
	if len(hs) == 0 {
		return nil
	}
	args := make([]any, 0, 3*len(hs))
	for _, h := range hs {
		score := h.score
		if mutant.On(mutant.RequeueLosesOrder) {
			// Planted bug: re-added at the time of the hand-back, not at
			// the score it had (its deadline and enqueue order).
			score = Score(time.Now())
		}
		args = append(args, h.token, h.claim, score)
	}
	err := keys.Release.Run(ctx, t.client, []string{qs.k.Claimed, qs.k.Owners, qs.k.ClaimsIdx, qs.k.Name, qs.k.Settling}, args...).Err()
	if err != nil {
		return fmt.Errorf("hand back %d request(s) to %s: %w", len(hs), qs.k.Name, err)
	}
	t.notify(ctx, qs)
	return nil
}

// releaseRetrying hands claims back, trying releaseTries times in all,
// releaseRetryFirst apart and then twice as long each time; on failure the
// leases expire and the reclaimer returns the requests instead.
func (t *Transport) releaseRetrying(qs *queueState, hs ...heldClaim) {
	if len(hs) == 0 {
		return
	}
	release := func() (struct{}, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return struct{}{}, t.release(ctx, qs, hs...)
	}
	_, err := release() // the common case: no backoff state at all
	if err == nil {
		return
	}
	_, err = backoff.Retry(context.Background(), retry.After(err, release),
		backoff.WithBackOff(retry.Doubling(releaseRetryFirst, time.Second)),
		backoff.WithMaxTries(releaseTries), backoff.WithMaxElapsedTime(0))
	if err != nil {
		t.log.Warn("hand-back failed; the lease will expire and the request return to the queue", "queue", qs.k.Name, "err", err)
	}
}

// A hand-back is tried releaseTries times in all, releaseRetryFirst apart
// and then twice as long each time (50, 100, 200, 400 ms).
const (
	releaseTries      = 5
	releaseRetryFirst = 50 * time.Millisecond
)

// Close stops the loops, hands back every request still leased by this
// replica and closes the Redis client.
func (t *Transport) Close() error {
	var err error
	t.closeOnce.Do(func() {
		t.mu.Lock()
		t.closed = true
		qss := make([]*queueState, 0, len(t.queues))
		for _, qs := range t.queues {
			qss = append(qss, qs)
		}
		t.mu.Unlock()
		close(t.closing)
		t.cancelClosing(ErrClosed)
		t.wg.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for _, qs := range qss {
			hs := qs.holds()
			for len(hs) > 0 {
				n := min(len(hs), 1000)
				if rerr := t.release(ctx, qs, hs[:n]...); rerr != nil {
					err = errors.Join(err, rerr)
					break
				}
				hs = hs[n:]
			}
		}
		err = errors.Join(err, t.client.Close())
	})
	return err
}

// PublishRequest implements transport.RequestPublisher: payload is added to
// queue q.Name scored by QueueScore (its deadline, plus an envelope's
// enqueue sequence; 0 when it does not decode, so its INVALID_REQUEST
// answer comes at once).
func (t *Transport) PublishRequest(ctx context.Context, q transport.Queue, payload []byte) error {
	score := QueueScore(payload)
	qs := t.queue(q.Name)
	if _, err := t.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Do(ctx, "ZADD", q.Name, score, payload)
		p.Publish(ctx, qs.k.Notify, "1")
		return nil
	}); err != nil {
		return fmt.Errorf("publish request to %s: %w", q.Name, err)
	}
	return nil
}

// Score is the sorted-set score of a deadline: Unix seconds with millisecond
// precision, written exactly ("1700000000.25").
func Score(deadline time.Time) string {
	msec := deadline.UnixMilli()
	s := strconv.FormatInt(msec/1000, 10)
	if r := msec % 1000; r != 0 {
		frac := strconv.FormatInt(1000+r, 10)[1:]
		for frac[len(frac)-1] == '0' {
			frac = frac[:len(frac)-1]
		}
		s += "." + frac
	}
	return s
}

// Requeue implements transport.Requeuer: the delivery's lease is swapped for
// an entry in the queue's delay set, due at due and scored, once back in the
// queue, by the original deadline. A lost lease drops the retry (the
// request was handed to another claim).
func (t *Transport) Requeue(ctx context.Context, q transport.Queue, m *message.Message, payload []byte, due time.Time) error {
	token := m.Metadata.Get(MetaLease)
	if token == "" {
		return fmt.Errorf("requeue %s: delivery has no lease", m.UUID)
	}
	qs := t.queue(q.Name)
	score := m.Metadata.Get(MetaScore)
	if score == "" {
		score = "0"
	}
	if m.Metadata.Get(metaPayloadKey) != "" {
		// The payload stays in its key: the retry carries the envelope
		// without it, as upstream's does.
		if stripped, err := wire.WithPayload(payload, []byte("null")); err == nil {
			payload = stripped
		}
	}
	payload = stampPayload(q, payload)
	if !mutant.On(mutant.RetryLosesOrder) { // planted bug: the retry as the core rewrote it
		payload = keepMemberTag(m.Payload, payload)
	}
	delay := max((time.Until(due) + time.Millisecond - 1).Milliseconds(), 0) // rounded up: never due early
	n, err := keys.Requeue.Run(ctx, t.client, []string{qs.k.Claimed, qs.k.Owners, qs.k.ClaimsIdx, qs.k.Delayed, qs.k.Stats, qs.k.Redeliveries, qs.k.Settling},
		token, m.Metadata.Get(MetaClaim), delay, score, payload).Int()
	if err != nil {
		return fmt.Errorf("requeue to %s: %w", qs.k.Delayed, err)
	}
	qs.settle(token)
	switch n {
	case 2:
		t.log.Warn("retry dropped: a result of this request is being written to a result list in another hash slot; the reclaimer finishes that write", "queue", q.Name)
	case 0:
		t.lateRequeues.Add(1)
		t.log.Warn("retry dropped: the lease was lost and the request handed to another claim", "queue", q.Name)
	}
	return nil
}

// keepMemberTag returns payload, the retry of member, opened by member's
// producer tag (keys.MemberTag<seq>/<job>",) when member has one and
// payload lost it: the core rewrites a flat request's retry as an envelope
// ({"request_kind":"plain",...,"data":<member>}), and since requests of
// one deadline have one score and sort by member, the retry would then
// sort behind every request of its deadline rather than at its place in
// enqueue order.
func keepMemberTag(member, payload []byte) []byte {
	if !bytes.HasPrefix(member, []byte(keys.MemberTag)) || bytes.HasPrefix(payload, []byte(keys.MemberTag)) ||
		len(payload) < 2 || payload[0] != '{' || payload[1] == '}' {
		return payload
	}
	end := bytes.Index(member[len(keys.MemberTag):], []byte(`",`))
	if end < 0 {
		return payload
	}
	tag := member[:len(keys.MemberTag)+end+2]
	out := make([]byte, 0, len(tag)+len(payload)-1)
	out = append(out, tag...)
	return append(out, payload[1:]...)
}

// DeadLetter implements transport.DeadLetterer: the message goes to the
// queue's dead-letter list, fenced by its lease.
func (t *Transport) DeadLetter(_ context.Context, q transport.Queue, m *message.Message, reason string) error {
	token := m.Metadata.Get(MetaLease)
	if token == "" {
		return fmt.Errorf("dead-letter %s: delivery has no lease", m.UUID)
	}
	qs := t.queue(q.Name)
	t.log.Warn("dead-lettering a message", "queue", q.Name, "reason", reason)
	return t.settleRetrying(qs, q.ResultName, settleItem{mode: 'd', token: token, claim: m.Metadata.Get(MetaClaim), dead: stampPayload(q, m.Payload)})
}

// Depth implements transport.DepthReporter.
func (t *Transport) Depth(ctx context.Context, q transport.Queue) (transport.Depth, error) {
	return QueueDepth(ctx, t.client, t.names, q.Name)
}

// QueueDepth reports the depths of request queue name (shared with the CLI).
func QueueDepth(ctx context.Context, c redis.Cmdable, names keys.Names, name string) (transport.Depth, error) {
	k := names.Queue(name)
	var w, f, fl, d *redis.IntCmd
	var dl *redis.IntCmd
	_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		w = p.ZCard(ctx, k.Name)
		f = p.ZCard(ctx, k.ClaimsIdx)
		fl = p.ZCard(ctx, k.Leases)
		d = p.ZCard(ctx, k.Delayed)
		dl = p.LLen(ctx, k.Dead)
		return nil
	})
	if err != nil {
		return transport.Depth{Waiting: -1, InFlight: -1, Delayed: -1, DeadLettered: -1}, fmt.Errorf("depth of %s: %w", name, err)
	}
	return transport.Depth{Waiting: w.Val(), InFlight: f.Val() + fl.Val(), Delayed: d.Val(), DeadLettered: dl.Val()}, nil
}

// Names returns the transport's key layout.
func (t *Transport) Names() keys.Names { return t.names }

// Source implements transport.Transport. The queue becomes one this
// replica serves: due entries of upstream's retry set naming it are moved
// back into it.
func (t *Transport) Source(q transport.Queue) (transport.Source, error) {
	if err := t.CheckQueue(q); err != nil {
		return nil, err
	}
	qs := t.queue(q.Name)
	t.mu.Lock()
	qs.served, qs.id = true, q.ID
	if t.names.CrossSlot(q.Name, q.ResultName) {
		t.warnCrossSlotLocked(q.Name, q.ResultName)
	}
	t.mu.Unlock()
	return &source{t: t, q: q, qs: qs}, nil
}

// warnCrossSlotLocked logs, once per pair, that queue's results to list
// take the cross-slot settle. t.mu is held.
func (t *Transport) warnCrossSlotLocked(queue, list string) {
	if k := [2]string{queue, list}; !t.warned[k] {
		t.warned[k] = true
		t.log.Warn(crossSlotWarning(t.names, queue, list))
	}
}

// CheckQueue implements transport.QueueChecker: result_ttl_seconds must not
// be negative, and on a Redis Cluster the queue's own keys must share its
// hash slot (a result list in another slot is settled in three steps, see
// xslot.go, and said by QueueWarnings).
func (t *Transport) CheckQueue(q transport.Queue) error {
	if q.ResultTTLSeconds < 0 {
		return fmt.Errorf("queue %s: result_ttl_seconds %d must not be negative (0: the result list does not expire)", q.Name, q.ResultTTLSeconds)
	}
	return t.names.CheckSlots(q.Name)
}

// QueueWarnings implements transport.QueueWarner: on a Redis Cluster, a
// result list in another hash slot than its queue takes the cross-slot
// settle.
func (t *Transport) QueueWarnings(q transport.Queue) []string {
	if !t.names.CrossSlot(q.Name, q.ResultName) {
		return nil
	}
	return []string{crossSlotWarning(t.names, q.Name, q.ResultName)}
}

var (
	_ transport.QueueChecker = (*Transport)(nil)
	_ transport.QueueWarner  = (*Transport)(nil)
)

// Publisher implements transport.Transport: results are written by the
// fenced settle script (result + lease removal in one step).
func (t *Transport) Publisher(q transport.Queue) (message.Publisher, error) {
	if err := t.CheckQueue(q); err != nil {
		return nil, err
	}
	return &publisher{t: t, q: q, qs: t.queue(q.Name)}, nil
}

// Events implements transport.EventCounter.
func (t *Transport) Events() map[string]int64 {
	s := t.Stats()
	return map[string]int64{"claimed": s.Claimed, "late_results": s.LateResults, "late_requeues": s.LateRequeues,
		"reclaimed": s.Reclaimed, "lost_leases": s.LostLeases, "gave_up": s.GaveUp, "adopted_retries": s.AdoptedRetries,
		"replica_shortfalls": t.replicaShortfalls.Load(), "cross_slot_finished": t.xslotFinished.Load()}
}

var _ transport.EventCounter = (*Transport)(nil)

// CheckHealth implements transport.HealthChecker as upstream does: one Redis
// PING on the transport's client, whatever the queues.
func (t *Transport) CheckHealth(ctx context.Context, _ []transport.Queue) error {
	return upstream.Ping(ctx, t.client)
}

var _ transport.HealthChecker = (*Transport)(nil)
