package upstream

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/wire"
)

// cancelReadTimeout bounds one batched read of cancel keys: it runs on
// behalf of every check waiting in it, so no single caller's context
// governs it.
const cancelReadTimeout = 5 * time.Second

// maxCancelBatch is the most cancel keys one round trip reads.
const maxCancelBatch = 256

// CancelReader answers Cancelled for many concurrent callers with few round
// trips: the checks that arrive while one read is on the wire are read
// together in the next one (one MGET on a single node; a pipeline of GETs
// on a Redis Cluster, where the keys live on different nodes). Each check still reads its key
// after it was asked, as a lone GET would: nothing is cached, so a
// cancellation written before a check started is always seen. A check
// alone costs one round trip, as before; under load the round trips per
// check fall towards 1/maxCancelBatch. It needs no goroutine of its own:
// the first caller to find no read running does the reads until none is
// waiting.
//
// A transport whose claim reads the markers itself (the sorted set's claim
// script on a single node) records each answer with Claimed; the first
// check of that request taken within one claim round trip of the claim's
// answer takes it instead of a round trip of its own. A check later than
// that reads the marker again: a request claimed ahead of its credit
// (prefetch) waits up to a second before its dispatch, and a cancel (or an
// un-cancel, which deletes the marker) written meanwhile must decide it.
// So what decides a dispatch is never older than the check made just
// before it, give or take one round trip, as a lone GET would be.
type CancelReader struct {
	c redis.Cmdable
	// mget: c is one node (not a Cluster client), so a batch is one MGET,
	// a single command to encode and parse instead of one GET each.
	mget bool

	mu      sync.Mutex
	waiting []*cancelAsk
	reading bool

	claims claimAnswers
}

// claimedKeep is how long an answer no check took is kept: a turn of the
// generations (claimAnswers) drops what two turns left untaken.
const claimedKeep = time.Second

// claimKey names one enqueue of a request: its id and request token.
type claimKey struct{ id, token string }

// claimAnswer is what a claim read, when its answer came, and how long
// the claim's round trip took.
type claimAnswer struct {
	at        time.Time
	rtt       time.Duration
	cancelled bool
}

// claimAnswers holds the claims' answers not yet taken, in two
// generations: cur since turned, prev the one before. A turn every
// claimedKeep drops what was never asked for (a request that ended before
// its check); each answer's own time decides whether it still stands.
type claimAnswers struct {
	mu        sync.Mutex
	cur, prev map[claimKey]claimAnswer
	turned    time.Time
}

// Claimed records that a claim sent at sent, answered at answered, read
// the cancel marker of the request (id, token): cancelled says it held the
// token. The answer stands for a check within answered - sent (one claim
// round trip) of answered.
func (r *CancelReader) Claimed(id, token string, cancelled bool, sent, answered time.Time) {
	if token == "" {
		return
	}
	a := &r.claims
	a.mu.Lock()
	a.turn(answered)
	a.cur[claimKey{id, token}] = claimAnswer{at: answered, rtt: max(answered.Sub(sent), 0), cancelled: cancelled}
	a.mu.Unlock()
}

// turn starts a new generation when the current one is claimedKeep old.
func (a *claimAnswers) turn(now time.Time) {
	if a.cur == nil {
		a.cur, a.turned = map[claimKey]claimAnswer{}, now
		return
	}
	if now.Sub(a.turned) >= claimedKeep {
		a.prev, a.cur, a.turned = a.cur, make(map[claimKey]claimAnswer, len(a.cur)), now
	}
}

// take removes and returns the claim's answer for (id, token) if now is
// within one claim round trip of it.
func (a *claimAnswers) take(id, token string, now time.Time) (cancelled, ok bool) {
	k := claimKey{id, token}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, m := range [2]map[claimKey]claimAnswer{a.cur, a.prev} {
		if v, found := m[k]; found {
			delete(m, k)
			return v.cancelled, now.Sub(v.at) <= v.rtt
		}
	}
	return false, false
}

type cancelAsk struct {
	key, token string
	cancelled  bool
	err        error
	done       chan struct{}
}

// NewCancelReader returns a reader of upstream's cancel keys on c.
func NewCancelReader(c redis.Cmdable) *CancelReader {
	_, cluster := c.(*redis.ClusterClient)
	return &CancelReader{c: c, mget: !cluster}
}

// Cancelled reports whether upstream's producer cancelled req: its cancel
// key holds req's token (a key holding another token cancelled an older
// enqueue of the same id). Requests without a token (the flat form) cost
// no round trip.
func (r *CancelReader) Cancelled(ctx context.Context, req *wire.Request) (bool, error) {
	if req.Token == "" {
		return false, nil
	}
	if cancelled, ok := r.claims.take(req.ID, req.Token, time.Now()); ok {
		return cancelled, nil
	}
	a := &cancelAsk{key: CancelKey(req.ID), token: req.Token, done: make(chan struct{})}
	r.mu.Lock()
	r.waiting = append(r.waiting, a)
	lead := !r.reading
	r.reading = true
	r.mu.Unlock()
	if lead {
		r.readAll(ctx)
	}
	select {
	case <-a.done:
		return a.cancelled, a.err
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

// readAll reads batches until no check is waiting.
func (r *CancelReader) readAll(ctx context.Context) {
	ctx = context.WithoutCancel(ctx)
	for {
		r.mu.Lock()
		batch := r.waiting
		if len(batch) > maxCancelBatch {
			batch = batch[:maxCancelBatch:maxCancelBatch]
			r.waiting = r.waiting[maxCancelBatch:]
		} else {
			r.waiting = nil
		}
		if len(batch) == 0 {
			r.reading = false
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
		r.read(ctx, batch)
	}
}

// read answers one batch with one pipelined round trip.
func (r *CancelReader) read(ctx context.Context, batch []*cancelAsk) {
	ctx, cancel := context.WithTimeout(ctx, cancelReadTimeout)
	defer cancel()
	if r.mget {
		r.readMGet(ctx, batch)
		return
	}
	cmds := make([]*redis.StringCmd, len(batch))
	_, _ = r.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, a := range batch {
			cmds[i] = p.Get(ctx, a.key)
		}
		return nil
	})
	for i, a := range batch {
		v, err := cmds[i].Result()
		switch {
		case errors.Is(err, redis.Nil):
		case err != nil:
			a.err = fmt.Errorf("check %s: %w", a.key, err)
		default:
			a.cancelled = v == a.token
		}
		close(a.done)
	}
}

// readMGet answers one batch with one MGET (a single node: the keys carry
// no hash tag, so a Cluster would refuse them together).
func (r *CancelReader) readMGet(ctx context.Context, batch []*cancelAsk) {
	names := make([]string, len(batch))
	for i, a := range batch {
		names[i] = a.key
	}
	vals, err := r.c.MGet(ctx, names...).Result()
	if err == nil && len(vals) != len(batch) {
		err = fmt.Errorf("MGET answered %d values for %d keys", len(vals), len(batch))
	}
	for i, a := range batch {
		switch {
		case err != nil:
			a.err = fmt.Errorf("check %s: %w", a.key, err)
		default:
			v, ok := vals[i].(string)
			a.cancelled = ok && v == a.token
		}
		close(a.done)
	}
}
