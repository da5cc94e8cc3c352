package redisquota

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/internal/mutant"
	"github.com/sluice-io/sluice/internal/redisclient"
)

// Timings of the connection's loop.
const (
	// execTimeout bounds one pipeline. Callers are bounded by their own
	// contexts; this only frees the loop from a Redis that stopped answering.
	execTimeout = 5 * time.Second
	// closeGrace is how long closing waits for queued releases to be written
	// before it abandons them (their leases then expire on their own).
	closeGrace = time.Second
	// idleTick is how often the loop looks at leases when none is held.
	idleTick = 10 * time.Second
)

// lanes is how many pipelines a connection keeps in flight at once per
// Redis server (per master in a cluster), each on a connection of its own.
// A tenant key goes through the lane of its server, so the scripts of one
// tenant run in the order they were asked for (a release before a later
// admission of the same tenant). One lane per server is the plain group
// commit; two (Redis busy with one while the other's answers are handed
// out) measured no faster with 64 admitters against a local redis-server,
// which the scripts' CPU bounds, and halve the batches.
//
// In a cluster each master has its own lane, so a master that stops
// answering holds up only its own tenants' scripts, not the pipelines of
// the others.
const lanes = 1

// conn is one Redis client and the loops that write every script of the
// gates sharing it, as a group commit: while a lane's pipeline is in flight
// the scripts of concurrent callers queue, and the lane sends them all in
// its next pipeline. So concurrent requests share round trips (one pipeline
// per round trip, however many requests it carries), and a lone request
// still costs one round trip, at once.
//
// The loops also renew the leases of requests holding a concurrency slot,
// in the same pipelines.
type conn struct {
	client  redis.UniversalClient
	cluster *redis.ClusterClient // client in cluster mode, else nil
	where   string               // the address without credentials, for messages
	log     *slog.Logger
	idBase  string // unique to this connection: lease ids and entry ids start with it
	seq     atomic.Uint64

	ctx    context.Context // cancelled when closing gives up on the loops
	cancel context.CancelFunc
	stop   chan struct{} // closed by shutdown
	done   chan struct{} // closed when every loop returned, after shutdown
	loops  sync.WaitGroup

	mu      sync.Mutex
	tick    time.Duration    // renewal interval: the shortest lease TTL / 3
	lanes   map[string]*lane // by master address in a cluster; "" on a single node, or a master not known yet
	closing bool             // no new lanes

	// guarded by the clients sharing the connection
	refs     int // gates using the connection
	shareKey string

	pipelines atomic.Int64 // pipelines sent (round trips), for the benchmark
	scripts   atomic.Int64 // scripts sent
}

// lane is one loop of a conn and what is queued for it.
type lane struct {
	c    *conn
	wake chan struct{} // cap 1: work is pending

	mu      sync.Mutex
	pending []*op
	closed  bool
	held    map[string]*lease // leases held through this lane, by id
}

// op is one script of one request (or a batch of renewals).
type op struct {
	script *script
	keys   []string
	args   []any
	w      *waiter // nil: nobody waits (release, renewal)
	lease  *lease  // an acquire's lease, held once admitted
}

// waiter is where the loop hands an answer to the caller waiting for it.
type waiter struct {
	state atomic.Int32 // waiting, answered or abandoned
	ch    chan reply   // cap 1
}

const (
	waiting int32 = iota
	answered
	abandoned
)

// reply is a script's answer: {admitted 0|1, count, wait ms}, or 1|0 for a
// release (given back or not) and a renewal (leases extended).
type reply struct {
	admitted bool
	wait     time.Duration
	err      error
}

// lease is a concurrency unit held by a request of this process.
type lease struct {
	id         string
	keys       []string // counter, lease set
	ttlSecs    int64    // the counter's TTL argument
	leaseTTL   time.Duration
	deadline   time.Time // zero: none
	renewAfter time.Time
	lane       *lane // the lane holding it, once admitted
}

// span is how long the lease should live from now: the lease TTL, or less
// when the request's deadline is nearer (a request never runs past it),
// at least 1 ms.
func (l *lease) span(now time.Time) time.Duration {
	d := l.leaseTTL
	if !l.deadline.IsZero() {
		d = min(d, l.deadline.Sub(now))
	}
	return max(d, time.Millisecond)
}

func newConn(o *redisclient.Options, where string, log *slog.Logger) *conn {
	var b [6]byte
	_, _ = rand.Read(b[:])
	ctx, cancel := context.WithCancel(context.Background())
	c := &conn{
		client: o.New(), where: where, log: log, idBase: hex.EncodeToString(b[:]) + "-",
		ctx: ctx, cancel: cancel, stop: make(chan struct{}), done: make(chan struct{}), tick: idleTick,
		lanes: map[string]*lane{},
	}
	c.cluster, _ = c.client.(*redis.ClusterClient)
	return c
}

// laneOf returns the lane of a tenant key, starting it on first use; nil
// once the connection is closing. In a cluster it is the lane of the
// key's master as the client's slot map has it (ctx bounds loading that
// map the first time).
func (c *conn) laneOf(ctx context.Context, key string) *lane {
	addr := ""
	if c.cluster != nil {
		if m, err := c.cluster.MasterForKey(ctx, key); err == nil {
			addr = m.Options().Addr
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if l := c.lanes[addr]; l != nil || c.closing {
		return l
	}
	l := &lane{c: c, wake: make(chan struct{}, 1), held: map[string]*lease{}}
	c.lanes[addr] = l
	c.loops.Go(l.run)
	return l
}

// allLanes returns the lanes started so far.
func (c *conn) allLanes() []*lane {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]*lane, 0, len(c.lanes))
	for _, l := range c.lanes {
		out = append(out, l)
	}
	return out
}

// newID returns an id unique among every process sharing the Redis.
func (c *conn) newID() string {
	return c.idBase + strconv.FormatUint(c.seq.Add(1), 36)
}

// useLeaseTTL makes the loops renew leases often enough for ttl.
func (c *conn) useLeaseTTL(ttl time.Duration) {
	c.mu.Lock()
	c.tick = min(c.tick, max(ttl/3, 10*time.Millisecond))
	c.mu.Unlock()
	for _, l := range c.allLanes() {
		l.signal()
	}
}

func (c *conn) tickInterval() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.tick
}

func (l *lane) signal() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// enqueue queues o for its lane's next pipeline; false when the connection
// is closed.
func (c *conn) enqueue(ctx context.Context, o *op) bool {
	l := c.laneOf(ctx, o.keys[0])
	if l == nil {
		return false
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return false
	}
	l.pending = append(l.pending, o)
	l.mu.Unlock()
	l.signal()
	return true
}

// do runs o in the next pipeline and waits for its answer or for ctx.
func (c *conn) do(ctx context.Context, o *op) (reply, error) {
	if err := ctx.Err(); err != nil {
		return reply{}, err
	}
	o.w = &waiter{ch: make(chan reply, 1)}
	if !c.enqueue(ctx, o) {
		return reply{}, gate.ErrGateClosed
	}
	select {
	case r := <-o.w.ch:
		return r, r.err
	case <-ctx.Done():
		if o.w.state.CompareAndSwap(waiting, abandoned) {
			return reply{}, ctx.Err() // the loop gives back what it may still reserve
		}
		r := <-o.w.ch // answered meanwhile
		return r, r.err
	}
}

// release queues the release of a held lease. It does not wait: the
// release goes out in its lane's next pipeline (before anything of the same
// tenant queued after it).
func (c *conn) release(ls *lease) {
	if l := ls.lane; l != nil {
		l.mu.Lock()
		delete(l.held, ls.id)
		l.mu.Unlock()
	}
	ctx, cancel := context.WithTimeout(c.ctx, time.Second) // the slot map is loaded: an acquire went through
	defer cancel()
	rel := releaseScript
	if mutant.On(mutant.QuotaReleaseTwice) {
		rel = mutatedScript(mutant.QuotaReleaseTwice) // planted: releases without the lease guard
	}
	if !c.enqueue(ctx, &op{script: rel, keys: ls.keys, args: []any{ls.ttlSecs, ls.id}}) {
		c.log.Warn("redis-quota: release after the gate closed; the unit comes back when its lease expires",
			"key", ls.keys[0], "lease", ls.id)
	}
}

func (l *lane) run() {
	every := l.c.tickInterval()
	timer := time.NewTimer(every)
	defer timer.Stop()
	for {
		renew := false
		select {
		case <-l.wake:
			if iv := l.c.tickInterval(); iv < every { // a gate with shorter leases came
				every = iv
				timer.Reset(every)
			}
		case <-timer.C:
			renew = true
			timer.Reset(every)
		case <-l.c.stop:
			l.flush(false) // what was queued before closing (releases)
			return
		}
		l.flush(renew)
	}
}

// flush sends everything queued, and the renewals due, in one pipeline.
func (l *lane) flush(renew bool) {
	c := l.c
	l.mu.Lock()
	batch := l.pending
	l.pending = nil
	if renew {
		batch = append(batch, l.renewals(time.Now())...)
	}
	l.mu.Unlock()
	// Skip acquires whose callers gave up before they were sent.
	ops := batch[:0]
	for _, o := range batch {
		if o.w == nil || o.w.state.Load() != abandoned {
			ops = append(ops, o)
		}
	}
	if len(ops) == 0 {
		return
	}
	cmds, err := c.exec(ops)
	var failed int
	for i, o := range ops {
		r := parse(cmds[i], err)
		if o.lease != nil && r.err == nil && r.admitted {
			l.mu.Lock()
			o.lease.lane = l
			l.held[o.lease.id] = o.lease
			l.mu.Unlock()
		}
		if o.w == nil {
			if r.err != nil {
				failed++
			}
			continue
		}
		if o.w.state.CompareAndSwap(waiting, answered) {
			o.w.ch <- r
		} else if o.lease != nil && r.admitted { // its caller gave up: give the unit back
			c.release(o.lease)
		}
	}
	if failed > 0 {
		c.log.Warn("redis-quota: releases or lease renewals failed; those units come back when their leases expire",
			"redis", c.where, "failed", failed, "err", firstErr(cmds, err))
	}
}

// renewals returns the renewal scripts due at now, one per lease set.
// Called with ln.mu held.
func (ln *lane) renewals(now time.Time) []*op {
	bySet := map[string]*op{}
	var out []*op
	for id, l := range ln.held {
		if !l.deadline.IsZero() && !now.Before(l.deadline) {
			delete(ln.held, id) // its lease ends at the deadline; nothing to renew
			continue
		}
		if now.Before(l.renewAfter) {
			continue
		}
		l.renewAfter = now.Add(l.leaseTTL / 3)
		o := bySet[l.keys[1]]
		if o == nil {
			o = &op{script: renewScript, keys: l.keys, args: []any{l.ttlSecs}}
			bySet[l.keys[1]] = o
			out = append(out, o)
		}
		o.args = append(o.args, l.id, l.span(now).Milliseconds())
	}
	return out
}

// exec sends ops in one pipeline (EVALSHA each). When a server lacks the
// scripts (a restart, SCRIPT FLUSH, a replica promoted in a cluster:
// NOSCRIPT means the script did not run), every script is loaded into every
// server it can reach, so that a tenant's later scripts cannot overtake the
// missing ones, and the ops that got NOSCRIPT are sent again with EVAL (the
// source), which works even where loading failed.
func (c *conn) exec(ops []*op) ([]*redis.Cmd, error) {
	ctx, cancel := context.WithTimeout(c.ctx, execTimeout)
	defer cancel()
	cmds, err := c.pipeline(ctx, ops, false)
	var again []int
	for i, cmd := range cmds {
		if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
			again = append(again, i)
		}
	}
	if len(again) == 0 {
		return cmds, err
	}
	c.loadScripts(ctx)
	retry := make([]*op, len(again))
	for j, i := range again {
		retry[j] = ops[i]
	}
	rcmds, rerr := c.pipeline(ctx, retry, true)
	for j, i := range again {
		cmds[i] = rcmds[j]
	}
	if err == nil {
		err = rerr
	}
	return cmds, err
}

// loadScripts loads every script into the server, or into every master of
// a cluster, as far as it can: what fails here fails again, and is
// reported, when the ops are sent with EVAL.
func (c *conn) loadScripts(ctx context.Context) {
	load := func(ctx context.Context, cl *redis.Client) error {
		p := cl.Pipeline()
		for _, s := range allScripts {
			p.ScriptLoad(ctx, s.src)
		}
		_, err := p.Exec(ctx)
		return err
	}
	switch cl := c.client.(type) {
	case *redis.ClusterClient:
		_ = cl.ForEachMaster(ctx, load)
	case *redis.Client:
		_ = load(ctx, cl)
	}
	c.pipelines.Add(1)
}

// noRetryCmd is a script command that go-redis must never send again on
// its own after a network error or a timeout: the script may have run, and
// an acquire is not idempotent. A cluster client still follows MOVED and
// ASK replies for it (a redirected script did not run), and re-sends it
// when the connection to its node could not even be made.
type noRetryCmd struct{ *redis.Cmd }

// NoRetry tells go-redis not to retry the command (nor its pipeline).
func (noRetryCmd) NoRetry() bool { return true }

// scriptCmd returns EVALSHA (or EVAL with the source, when eval) of o.
func scriptCmd(ctx context.Context, o *op, eval bool) *redis.Cmd {
	args := make([]any, 0, 3+len(o.keys)+len(o.args))
	if eval {
		args = append(args, "eval", o.script.src)
	} else {
		args = append(args, "evalsha", o.script.sha)
	}
	args = append(args, len(o.keys))
	for _, k := range o.keys {
		args = append(args, k)
	}
	args = append(args, o.args...)
	cmd := redis.NewCmd(ctx, args...)
	cmd.SetFirstKeyPos(3) // the slot a cluster client sends it to: KEYS[1]'s
	return cmd
}

// pipeline sends ops in one pipeline. A cluster client splits it by node
// and sends the parts at once; each command carries its own outcome (a
// node that is down fails only its own commands). The error is the whole
// pipeline's, when it failed for something other than a command's reply.
func (c *conn) pipeline(ctx context.Context, ops []*op, eval bool) ([]*redis.Cmd, error) {
	p := c.client.Pipeline()
	cmds := make([]*redis.Cmd, len(ops))
	for i, o := range ops {
		cmds[i] = scriptCmd(ctx, o, eval)
		_ = p.Process(ctx, noRetryCmd{cmds[i]})
	}
	_, err := p.Exec(ctx)
	c.pipelines.Add(1)
	c.scripts.Add(int64(len(ops)))
	if err != nil && !isReplyError(err) {
		return cmds, fmt.Errorf("redis at %s: %w", c.where, err)
	}
	return cmds, nil
}

// isReplyError reports whether err is a command's own error reply (each
// command carries it), not a failure of the whole pipeline.
func isReplyError(err error) bool {
	var re redis.Error
	return errors.As(err, &re)
}

// parse reads a script's answer {admitted, count, wait ms}. A command
// answered by Redis carries its own reply or error; pipeErr, when set, is
// why the pipeline failed, for a command left without either.
func parse(cmd *redis.Cmd, pipeErr error) reply {
	v, err := cmd.Result()
	switch {
	case err != nil && isReplyError(err):
		return reply{err: fmt.Errorf("script: %w", err)}
	case err != nil && pipeErr != nil:
		return reply{err: pipeErr}
	case err != nil:
		return reply{err: fmt.Errorf("script: %w", err)}
	case v == nil && pipeErr != nil:
		return reply{err: pipeErr}
	}
	switch v := v.(type) {
	case int64:
		return reply{admitted: v == 1}
	case []any:
		var n [3]int64
		for i := 0; i < len(v) && i < 3; i++ {
			n[i], _ = v[i].(int64)
		}
		return reply{admitted: n[0] == 1, wait: time.Duration(n[2]) * time.Millisecond}
	}
	return reply{err: fmt.Errorf("script: unexpected answer %v", v)}
}

func firstErr(cmds []*redis.Cmd, pipeErr error) error {
	for _, c := range cmds {
		if c.Err() != nil {
			return c.Err()
		}
	}
	return pipeErr
}

// shutdown closes the connection: queued releases are written (for at most
// closeGrace), then the client is closed. Operations queued later fail
// with gate.ErrGateClosed.
func (c *conn) shutdown() error {
	c.mu.Lock()
	c.closing = true
	c.mu.Unlock()
	for _, l := range c.allLanes() {
		l.mu.Lock()
		l.closed = true
		l.mu.Unlock()
	}
	close(c.stop)
	go func() { c.loops.Wait(); close(c.done) }()
	timer := time.NewTimer(closeGrace)
	defer timer.Stop()
	defer c.cancel()
	select {
	case <-c.done:
	case <-timer.C:
		// A Redis that does not answer: give up. Closing the client ends
		// the read in flight (a cancelled context alone does not).
		c.cancel()
		_ = c.client.Close()
		<-c.done
		return nil
	}
	if err := c.client.Close(); err != nil {
		return fmt.Errorf("close redis-quota client for %s: %w", c.where, err)
	}
	return nil
}

// clients shares one connection among the gates built by one factory whose
// connection settings are equal, as upstream shares one client per address.
// The last gate to close closes it.
type clients struct {
	mu sync.Mutex
	m  map[string]*conn
}

// get returns the connection for cfg, opening it on first use.
func (s *clients) get(cfg Config, o *redisclient.Options, where string) *conn {
	key := cfg.shareKey()
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.m[key]; c != nil {
		c.refs++
		return c
	}
	if s.m == nil {
		s.m = map[string]*conn{}
	}
	c := newConn(o, where, cfg.Logger)
	c.refs, c.shareKey = 1, key
	s.m[key] = c
	return c
}

// put drops one gate's use of c, closing c after the last one.
func (s *clients) put(c *conn) error {
	s.mu.Lock()
	c.refs--
	last := c.refs == 0
	if last && s.m[c.shareKey] == c {
		delete(s.m, c.shareKey)
	}
	s.mu.Unlock()
	if !last {
		return nil
	}
	return c.shutdown()
}
