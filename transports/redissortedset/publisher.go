package redissortedset

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/cenkalti/backoff/v5"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/internal/mutant"
	"github.com/sluice-io/sluice/internal/retry"
	"github.com/sluice-io/sluice/transports/redissortedset/internal/keys"
)

// publisher writes results with the fenced settle script.
type publisher struct {
	t  *Transport
	q  transport.Queue
	qs *queueState
}

var _ message.Publisher = (*publisher)(nil)

// Publish writes each result to the list topic and drops its claim, in one
// atomic step fenced by the owner token in the message's metadata. An
// envelope's result goes to the list its routing resolved to at dequeue
// (see stampEnvelope) rather than topic, carries the request's
// request_token, and its result_ttl_seconds is the list's expiry. A result
// whose claim was lost is discarded and counted (Stats.LateResults): the
// request was reclaimed and another claim answers it. While Redis is
// unreachable the write is retried with backoff for up to result_retry_ms;
// the request stays claimed meanwhile, so a final failure loses nothing:
// the core nacks, or the lease expires and the request is run again.
func (p *publisher) Publish(topic string, ms ...*message.Message) error {
	for _, m := range ms {
		if m.Metadata.Get(MetaLease) == "" {
			return fmt.Errorf("publish result %s to %s: message has no lease token", m.UUID, topic)
		}
		list := topic
		if r := m.Metadata.Get(metaRoute); r != "" {
			list = r
		}
		it := p.t.resultItem(p.q, m, m.Payload)
		if err := p.t.settleRetrying(p.qs, list, it); err != nil {
			return err
		}
		if err := p.t.fault(faultBeforePayloadDel); err != nil {
			return err
		}
		if key := m.Metadata.Get(metaPayloadKey); key != "" && p.t.cluster {
			// In a cluster the payload key is in another slot than the
			// claim: deleted after the result, as upstream does there (it
			// expires on its own if this fails).
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_ = p.t.client.Del(ctx, key).Err()
			cancel()
		}
	}
	return nil
}

// Close does nothing: the transport owns the client.
func (*publisher) Close() error { return nil }

// RoutesResults implements transport.ResultRouter: a result list is any key.
func (*Transport) RoutesResults() {}

var _ transport.ResultRouter = (*Transport)(nil)

// settleRetrying settles one lease through the group-commit settler of
// (qs, list), retrying while Redis fails, for up to result_retry_ms: after
// settleRetryFirst, then twice as long each time up to settleRetryMax.
func (t *Transport) settleRetrying(qs *queueState, list string, it settleItem) error {
	s, err := t.settler(qs, list)
	if err != nil {
		return err
	}
	give := time.Now().Add(ms(t.opts.ResultRetryMS))
	settle := func() (struct{}, error) {
		o := s.submit(it)
		it.pushed = it.pushed || o.pushed
		if o.err != nil {
			if errors.Is(o.err, ErrClosed) {
				return struct{}{}, backoff.Permanent(o.err)
			}
			return struct{}{}, o.err
		}
		qs.settle(it.token)
		if !o.ok {
			t.lateResults.Add(1)
			t.log.Warn("late result discarded: the lease expired and the request was handed to another claim", "queue", qs.k.Name)
		}
		return struct{}{}, nil
	}
	_, err = settle() // the common case: no backoff state at all
	if err == nil || errors.Is(err, ErrClosed) {
		return wrapSettle(list, err)
	}
	left := time.Until(give)
	if left <= 0 {
		return wrapSettle(list, err)
	}
	_, err = backoff.Retry(t.closingCtx, retry.After(err, settle),
		backoff.WithBackOff(retry.Doubling(settleRetryFirst, settleRetryMax)),
		backoff.WithMaxElapsedTime(left),
		backoff.WithNotify(func(err error, next time.Duration) {
			t.log.Warn("writing a result failed; retrying (the request stays leased)", "queue", qs.k.Name, "err", err, "backoff", next)
		}))
	return wrapSettle(list, err)
}

// Result writes that fail while Redis does are tried again after
// settleRetryFirst, then twice as long each time up to settleRetryMax
// (for up to result_retry_ms in all).
const (
	settleRetryFirst = 50 * time.Millisecond
	settleRetryMax   = time.Second
)

// wrapSettle names list in the error of a result write (nil stays nil).
func wrapSettle(list string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("write result to %s: %w", list, err)
}

// settleItem is one claim to settle (owner token and claim id); see
// keys.Settle for the modes. reqID and reqToken are the request's id and
// upstream request token when the message carries one: the settle then
// also cleans upstream's cancellation keys of that request. payloadKey is
// deleted with the result; ttl (seconds, when above 0) becomes the result
// list's expiry.
type settleItem struct {
	mode            byte
	token, claim    string
	result, dead    []byte
	reqID, reqToken string
	payloadKey      string
	ttl             int64
	// pushed is set once a cross-slot settle pushed the result (see
	// xslot.go): a retry then only commits.
	pushed bool
	done   chan settleOutcome
}

type settleOutcome struct {
	ok, pushed bool
	err        error
}

// settler batches the settles of concurrent handlers into one script call
// (group commit): while one call runs, the next batch gathers.
type settler struct {
	t    *Transport
	keys []string
	// q and list are the claims' queue and the result list; cross is set
	// when they are in different hash slots (see xslot.go).
	q     keys.Queue
	list  string
	cross bool
	ch    chan settleItem
	dones sync.Pool // chan settleOutcome, empty, for reuse by submit
}

// maxSettleBatch bounds one settle call.
const maxSettleBatch = 256

// crossSlotWorkers is how many batches of a cross-slot settler run at once.
const crossSlotWorkers = 3

// settler returns the settler of (qs, list), starting it.
func (t *Transport) settler(qs *queueState, list string) (*settler, error) {
	key := [2]string{qs.k.Name, list}
	t.mu.Lock()
	defer t.mu.Unlock()
	if s, ok := t.batchers[key]; ok {
		return s, nil
	}
	if t.closed {
		return nil, ErrClosed
	}
	if err := t.names.CheckSlots(qs.k.Name); err != nil {
		return nil, err
	}
	s := &settler{t: t, keys: []string{qs.k.Claimed, qs.k.Owners, qs.k.ClaimsIdx, list, qs.k.Dead, qs.k.Stats, qs.k.Redeliveries},
		q: qs.k, list: list, cross: t.names.CrossSlot(qs.k.Name, list), ch: make(chan settleItem)}
	if s.cross {
		t.warnCrossSlotLocked(qs.k.Name, list)
	}
	t.batchers[key] = s
	// A cross-slot settle takes three round trips: that many batches are
	// in flight at once, each in its own step (batches share no claim, and
	// each keeps its own steps in order).
	workers := 1
	if s.cross {
		workers = crossSlotWorkers
	}
	t.wg.Add(workers)
	for range workers {
		go s.run()
	}
	return s, nil
}

func (s *settler) submit(it settleItem) settleOutcome {
	done, _ := s.dones.Get().(chan settleOutcome)
	if done == nil {
		done = make(chan settleOutcome, 1)
	}
	it.done = done
	select {
	case s.ch <- it:
	case <-s.t.closing:
		s.dones.Put(done)
		return settleOutcome{err: ErrClosed}
	}
	o := <-done // run sends exactly once per item: done is empty again
	s.dones.Put(done)
	return o
}

// modeArg is the settle script's mode argument for mode (a constant, so
// passing it costs no allocation).
func modeArg(mode byte) string {
	switch mode {
	case 'r':
		return "r"
	case 'd':
		return "d"
	case 'b':
		return "b"
	}
	return string(mode)
}

func (s *settler) run() {
	defer s.t.wg.Done()
	batch := make([]settleItem, 0, maxSettleBatch)
	args := make([]any, 0, keys.SettleArgs*maxSettleBatch)
	for {
		batch = batch[:0]
		select {
		case it := <-s.ch:
			batch = append(batch, it)
		case <-s.t.closing:
			return
		}
	gather:
		for len(batch) < maxSettleBatch {
			select {
			case it := <-s.ch:
				batch = append(batch, it)
			default:
				break gather
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var st []int64
		var pushed []bool
		var err error
		if s.cross {
			st, pushed, err = s.flushCross(ctx, batch)
		} else {
			args = args[:0]
			for _, it := range batch {
				pk := it.payloadKey
				if s.t.cluster {
					pk = "" // another slot: the publisher deletes it
				}
				args = append(args, modeArg(it.mode), it.token, it.claim, it.result, it.dead, it.reqID, it.reqToken, pk, it.ttl)
			}
			st, err = s.call(ctx, batch, args)
			if err == nil && len(st) != len(batch) {
				err = fmt.Errorf("settle: %d statuses for %d items", len(st), len(batch))
			}
		}
		cancel()
		for i, it := range batch {
			o := settleOutcome{err: err}
			if pushed != nil {
				o.pushed = pushed[i]
			}
			if err == nil {
				o.ok = st[i] == 1
			}
			it.done <- o
		}
	}
}

// call writes one batch of settles: the results and the removal of their
// claims in one fenced script call (keys.Settle), so no crash can fall
// between the two. The transport's settle hook, when a test set one, runs
// after the call (a crash right after the write).
func (s *settler) call(ctx context.Context, batch []settleItem, args []any) ([]int64, error) {
	if mutant.On(mutant.AckBeforeResult) {
		return s.ackThenWrite(ctx, batch, args)
	}
	script := keys.Settle
	if mutant.On(mutant.SettleNoFence) {
		// Planted bug: the settle does not check the owner token.
		script = keys.Mutated(mutant.SettleNoFence)
	}
	st, err := s.t.runScript(ctx, script, s.keys, args...).Int64Slice()
	if err == nil && s.t.settleHook != nil {
		err = s.t.settleHook()
	}
	return st, err
}

// ackThenWrite is the planted bug AckBeforeResult: the claims are dropped in
// one call and the results pushed in a second, so a crash between the two
// (the settle hook) loses the results.
func (s *settler) ackThenWrite(ctx context.Context, batch []settleItem, args []any) ([]int64, error) {
	st, err := s.t.runScript(ctx, keys.Mutated(mutant.AckBeforeResult), s.keys, args...).Int64Slice()
	if err != nil {
		return nil, err
	}
	if s.t.settleHook != nil {
		if err := s.t.settleHook(); err != nil {
			return nil, err
		}
	}
	for i, it := range batch {
		if i < len(st) && st[i] == 1 && it.mode != 'd' {
			if err := s.t.client.LPush(ctx, s.keys[3], it.result).Err(); err != nil {
				return nil, err
			}
		}
	}
	return st, nil
}
