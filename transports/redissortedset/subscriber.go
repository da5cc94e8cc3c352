package redissortedset

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/transports/redissortedset/internal/keys"
)

// minIdle is the first idle wait after a claim found the queue empty; it
// doubles up to the poll interval. A producer's notify wakes the loop early.
const minIdle = 2 * time.Millisecond

// source is the broker side of one queue for the claim loop (see
// transport.NewSubscriber): the claim script moves requests into leases, a
// producer's notify wakes an idle wait, and settling a lease is fenced by its
// token.
type source struct {
	t  *Transport
	q  transport.Queue
	qs *queueState

	wake  chan struct{} // a producer's notify or the transport closing
	timer *time.Timer
	bg    sync.WaitGroup

	// The last claim, for Wait (Claim and Wait run on the loop's goroutine).
	got, asked int
	nextDue    time.Duration // until the next delayed request; <0: none
	idle       time.Duration // the next idle wait; doubles while claims come back empty
	epochRead  time.Time     // in a cluster, when the cancel epoch was last read
}

// epochEvery is how often a claim loop on a cluster reads the cancel epoch
// (on a single node the claim script returns it with every claim).
const epochEvery = 100 * time.Millisecond

var (
	_ transport.Source     = (*source)(nil)
	_ transport.BatchSizer = (*source)(nil)
	_ transport.Prefetcher = (*source)(nil)
)

// BatchSize implements transport.BatchSizer.
func (s *source) BatchSize() int { return s.t.opts.BatchSize }

// Prefetch implements transport.Prefetcher (Options.Prefetch).
func (s *source) Prefetch() int {
	switch p := s.t.opts.Prefetch; {
	case p < 0:
		return 0
	case p > 0:
		return p
	default:
		return min(s.q.MaxConcurrency, s.t.opts.BatchSize)
	}
}

// claimed is one request taken by a claim: its owner token, the score it
// had in the queue, deliveries so far, the member, its claim id and the
// cap of its lease (Unix ms).
type claimed struct {
	token, score string
	deliveries   int
	member       string
	claim        string
	capMS        int64
}

// claimResult is the answer of the claim script.
type claimResult struct {
	nextDue int64 // Unix ms of the next delayed request, -1 if none
	epoch   string
	now     int64
	items   []claimed
}

// claim runs the claim script for up to n requests.
func (t *Transport) claim(ctx context.Context, qs *queueState, n int) (claimResult, error) {
	call := strconv.FormatUint(t.seq.Add(1), 36)
	prefix := t.id + ":" + call + ":"
	ks := []string{qs.k.Name, qs.k.Claimed, qs.k.Owners, qs.k.ClaimsIdx, qs.k.Redeliveries, qs.k.Delayed,
		qs.k.ClaimCalls + t.id + ":" + call, t.names.CancelEpoch()}
	if t.cluster {
		ks = ks[:7] // the epoch is in another slot: Claim reads it apart
	}
	qs.mu.Lock()
	prev := qs.lastCall
	qs.lastCall = ks[6]
	qs.mu.Unlock()
	sent := time.Now() // the markers the claim reads are read after this
	raw, err := keys.Claim.Run(ctx, t.client, ks, n, t.opts.LeaseMS, prefix, qs.k.JobPrefix, prev).Slice()
	if err != nil {
		return claimResult{}, fmt.Errorf("claim from %s: %w", qs.k.Name, err)
	}
	answered := time.Now()
	const f = keys.ClaimReplyFields
	if len(raw) < 3 || (len(raw)-3)%f != 0 {
		return claimResult{}, fmt.Errorf("claim from %s: unexpected reply of %d elements", qs.k.Name, len(raw))
	}
	var res claimResult
	res.nextDue = -1
	if s, ok := raw[0].(string); ok {
		if f, err := strconv.ParseFloat(s, 64); err == nil {
			res.nextDue = int64(f)
		}
	}
	res.epoch, _ = raw[1].(string)
	res.now, _ = raw[2].(int64)
	res.items = make([]claimed, 0, (len(raw)-3)/f)
	for i := 3; i+f-1 < len(raw); i += f {
		c := claimed{}
		c.token, _ = raw[i].(string)
		c.score, _ = raw[i+1].(string)
		d, _ := raw[i+2].(int64)
		c.deliveries = int(d)
		c.member, _ = raw[i+3].(string)
		c.claim, _ = raw[i+4].(string)
		c.capMS, _ = raw[i+5].(int64) // the heartbeat keeps the lease within deadline + 5 min
		if cm, _ := raw[i+6].(int64); cm != keys.CancelUnread {
			if id, token, ok := strings.Cut(c.claim, "\x00"); ok {
				t.upCancel.Claimed(id, token, cm == keys.CancelSet, sent, answered)
			}
		}
		res.items = append(res.items, c)
	}
	t.claimed.Add(int64(len(res.items)))
	return res, nil
}

// Open starts the queue's heartbeat and reclaim loops (once per queue),
// registers the queue for `sluice queues`, and listens for new work so that
// an enqueue ends an idle wait at once: on the queue's notify channel
// (written by the producer library, `sluice enqueue`, hand-backs and
// reclaims) and on the queue key's keyspace channel, whose "zadd" events
// the server publishes for any producer (upstream's plain ZADD) when its
// notify-keyspace-events include K and z. Without either, the idle poll
// finds the work.
func (s *source) Open(ctx context.Context) error {
	t := s.t
	select {
	case <-t.closing:
		return ErrClosed
	default:
	}
	if err := t.startLoops(s.qs); err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	if err := t.client.SAdd(rctx, t.names.Registry(), s.q.Name).Err(); err != nil {
		t.log.Warn("registering the queue failed (only `sluice queues` needs it)", "queue", s.q.Name, "err", err)
	}
	cancel()
	s.wake = make(chan struct{}, 1)
	s.timer = time.NewTimer(time.Hour)
	s.timer.Stop()
	s.idle = minIdle
	keyspace := keyspaceChannel(t.db, s.q.Name)
	// Keyspace events are published only by the node holding the key; in a
	// cluster they are heard on that node's connection, and a failover
	// ends them until the source opens again (the idle poll still finds
	// the work meanwhile).
	node, err := keys.MasterFor(ctx, t.client, s.q.Name)
	if err != nil {
		t.log.Warn("cannot find the queue's node; plain ZADDs wake the claim loop only at the idle poll", "queue", s.q.Name, "err", err)
		node = nil
	}
	var subs []*redis.PubSub
	if t.cluster {
		subs = append(subs, t.client.Subscribe(ctx, s.qs.k.Notify))
		if node != nil {
			t.checkKeyspaceEvents(ctx, node, s.q.Name)
			subs = append(subs, node.Subscribe(ctx, keyspace))
		}
	} else {
		t.checkKeyspaceEvents(ctx, t.client, s.q.Name)
		subs = append(subs, t.client.Subscribe(ctx, s.qs.k.Notify, keyspace))
	}
	s.bg.Add(1 + len(subs))
	go func() {
		defer s.bg.Done()
		select {
		case <-ctx.Done():
		case <-t.closing:
		}
		for _, ps := range subs {
			_ = ps.Close()
		}
	}()
	for _, ps := range subs {
		go func() {
			defer s.bg.Done()
			for m := range ps.Channel() {
				if m.Channel != keyspace || m.Payload == "zadd" {
					s.signal()
				}
			}
			s.signal() // closed: let a waiting loop look again (and find the transport closing)
		}()
	}
	return nil
}

func (s *source) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Claim runs the claim script for up to n requests, answers (and
// dead-letters) those that kept losing their lease, and returns the rest.
func (s *source) Claim(ctx context.Context, n int) ([]*message.Message, error) {
	t := s.t
	select {
	case <-t.closing:
		return nil, ErrClosed
	default:
	}
	// A wake-up heard before this claim is sent announces work the claim
	// will see (the producer's write precedes its notify): dropping it
	// spares an empty claim, and its round trip, after this one. Wake-ups
	// heard while the claim is on the wire are kept.
	select {
	case <-s.wake:
	default:
	}
	res, err := t.claim(ctx, s.qs, n)
	if err != nil {
		return nil, err
	}
	s.got, s.asked = len(res.items), n
	s.nextDue = -1
	if res.nextDue >= 0 {
		s.nextDue = time.Duration(max(res.nextDue-res.now, 1)) * time.Millisecond
	}
	if t.cluster {
		if time.Since(s.epochRead) >= epochEvery {
			s.epochRead = time.Now()
			t.refreshCancels(ctx, "")
		}
	} else if !t.cancels.Current(res.epoch) {
		t.refreshCancels(ctx, res.epoch)
	}
	s.qs.hold(res.items)
	out := make([]*message.Message, 0, len(res.items))
	var refs []*message.Message // messages whose payload lives in a payload key
	for _, c := range res.items {
		if c.deliveries > t.opts.MaxDeliveries {
			s.giveUp(c)
			continue
		}
		m := message.NewMessage(c.token, []byte(c.member))
		md := m.Metadata // NewMessage's own (empty) map: filled, not replaced
		md[MetaLease], md[MetaClaim], md[MetaScore] = c.token, c.claim, c.score
		md[MetaDeliveries], md[MetaQueue] = strconv.Itoa(c.deliveries), s.q.Name
		if s.stampEnvelope(m) {
			refs = append(refs, m)
		}
		out = append(out, m)
	}
	if len(refs) > 0 {
		out = s.attachPayloads(ctx, out, refs)
	}
	return out, nil
}

// Wait sleeps after a short claim: briefly after a partial batch (more may
// be arriving), and for an idle wait that doubles up to the poll interval
// after empty ones; never past the next delayed request's due time. A
// producer's notify ends it early.
func (s *source) Wait(ctx context.Context) {
	poll := ms(s.t.opts.PollIntervalMS)
	wait := s.idle
	if s.got > 0 {
		wait, s.idle = minIdle, minIdle
	} else {
		s.idle = min(s.idle*2, poll)
	}
	if s.nextDue >= 0 {
		wait = min(wait, s.nextDue)
	}
	s.timer.Reset(min(wait, poll))
	defer s.timer.Stop()
	select {
	case <-ctx.Done():
	case <-s.wake:
	case <-s.timer.C:
	}
}

// Settle settles a delivered request when the core acks or nacks it. An ack
// finds the lease already settled by the result publisher, Requeue or
// DeadLetter; a nack hands the request back. After the transport closed it
// does nothing: Close hands back what is still held.
func (s *source) Settle(m *message.Message, acked bool) {
	select {
	case <-s.t.closing:
		return
	default:
	}
	if h, ok := s.qs.settle(m.UUID); ok {
		if acked {
			s.t.log.Error("a request was acked without a result, retry or dead letter; handing it back", "queue", s.q.Name, "uuid", m.UUID)
		}
		s.t.releaseRetrying(s.qs, heldClaim{token: m.UUID, hold: h})
	}
}

// HandBack returns claims made but never delivered to the queue.
func (s *source) HandBack(ms []*message.Message) {
	var rest []heldClaim
	for _, m := range ms {
		if h, ok := s.qs.settle(m.UUID); ok {
			rest = append(rest, heldClaim{token: m.UUID, hold: h})
		}
	}
	s.t.releaseRetrying(s.qs, rest...)
}

// Close waits for the notify listener, which stops with the subscription.
func (s *source) Close() error {
	s.bg.Wait()
	return nil
}

// giveUp answers a request claimed more than max_deliveries times with an
// INFERENCE_ERROR result and dead-letters it, in one fenced step.
func (s *source) giveUp(c claimed) {
	t := s.t
	t.gaveUp.Add(1)
	text := fmt.Sprintf("gave up after %d deliveries: each time the lease expired before a result was written (max_deliveries %d)",
		c.deliveries-1, t.opts.MaxDeliveries)
	var res *wire.Result
	if req, err := wire.Decode([]byte(c.member)); err == nil {
		res = wire.ErrorResult(req, wire.CodeInferenceError, text)
	} else if de, ok := wire.AsDecodeError(err); ok && de.ID != "" {
		res = &wire.Result{ID: de.ID, Payload: wire.ErrorPayload(text), Metadata: de.Metadata, ErrorCode: wire.CodeInferenceError, ErrorMessage: text}
	}
	t.log.Error("dead-lettering a request that kept losing its lease", "queue", s.q.Name, "deliveries", c.deliveries-1)
	var err error
	if res != nil {
		m := message.NewMessage(c.token, []byte(c.member))
		m.Metadata = message.Metadata{}
		s.stampEnvelope(m)
		it := t.resultItem(s.q, m, res.Marshal())
		it.mode, it.token, it.claim = 'b', c.token, c.claim
		err = t.settleRetrying(s.qs, s.routeOf(m), it)
	} else {
		err = t.settleRetrying(s.qs, s.q.ResultName, settleItem{mode: 'd', token: c.token, claim: c.claim, dead: []byte(c.member)})
	}
	if err != nil {
		t.log.Error("dead-lettering failed; the lease will expire and the request come back", "queue", s.q.Name, "err", err)
	}
}

// keyspaceChannel is the keyspace notification channel of key in database db.
func keyspaceChannel(db int, key string) string {
	return "__keyspace@" + strconv.Itoa(db) + "__:" + key
}

// checkKeyspaceEvents logs, once per queue opened, whether the server
// publishes the keyspace events that wake an idle claim loop when a
// producer writes with a plain ZADD. A server that refuses CONFIG GET
// (managed Redis) is not asked again; the subscription costs nothing when
// the events are off.
func (t *Transport) checkKeyspaceEvents(ctx context.Context, c redis.Cmdable, queue string) {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	v, err := c.ConfigGet(cctx, "notify-keyspace-events").Result()
	if err != nil {
		t.log.Debug("cannot read notify-keyspace-events; plain ZADDs wake the claim loop only if the server publishes keyspace events", "queue", queue, "err", err)
		return
	}
	if flags := v["notify-keyspace-events"]; !keyspaceZsetEvents(flags) {
		t.log.Info("keyspace notifications for sorted sets are off: requests written with a plain ZADD (not the producer library or `sluice enqueue`) wait for the idle poll; set notify-keyspace-events to include K and z (e.g. Kz) to wake the claim loop at once",
			"queue", queue, "notify_keyspace_events", flags, "poll_interval_ms", t.opts.PollIntervalMS)
	}
}

// keyspaceZsetEvents reports whether notify-keyspace-events flags make the
// server publish sorted-set events on keyspace channels: K, and z or A
// (every class but key-miss and new-key).
func keyspaceZsetEvents(flags string) bool {
	return strings.ContainsRune(flags, 'K') && strings.ContainsAny(flags, "zA")
}

// redisNil reports a missing key.
func redisNil(err error) bool { return err == redis.Nil }
