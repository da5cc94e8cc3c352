package redisstream

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/transport"
)

// source reads one stream through the consumer group for the claim loop
// (transport.NewSubscriber), in windows sized by the free credits; it keeps
// its entries in flight claimed (heartbeat) and takes over entries of dead
// consumers.
type source struct {
	t      *Transport
	stream string

	mu   sync.Mutex
	mine map[string]*delivery // this source's deliveries in flight, by entry id

	// The loop's own state (Claim and Wait run on its goroutine).
	lastClaim   time.Time
	claimCursor string
	stash       *delivery // read by an idle Wait, handed out by the next Claim (under mu)

	cancel context.CancelFunc // ends the mover
	loops  sync.WaitGroup
}

var (
	_ transport.Source     = (*source)(nil)
	_ transport.BatchSizer = (*source)(nil)
)

// BatchSize implements transport.BatchSizer.
func (s *source) BatchSize() int { return s.t.opts.BatchSize }

// Open creates the consumer group if needed and starts the heartbeat (until
// the transport closes: the drain outlives the reads) and the mover of due
// retries (until ctx ends).
func (s *source) Open(ctx context.Context) error {
	if err := s.t.ensureGroup(ctx, s.stream); err != nil {
		return err
	}
	s.claimCursor = "0-0"
	ctx, s.cancel = context.WithCancel(ctx)
	s.t.bg.Add(1)
	go func() {
		defer s.t.bg.Done()
		s.heartbeat(s.t.ctx)
	}()
	s.loops.Add(1)
	go func() {
		defer s.loops.Done()
		s.moveDue(ctx)
	}()
	return nil
}

// ensureGroup creates the group at the start of the stream (MKSTREAM).
func (t *Transport) ensureGroup(ctx context.Context, stream string) error {
	t.mu.Lock()
	done := t.groups[stream]
	t.mu.Unlock()
	if done {
		return nil
	}
	err := t.client.XGroupCreateMkStream(ctx, stream, t.opts.ConsumerGroup, "0").Err()
	if err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
		return fmt.Errorf("create group %s on %s: %w", t.opts.ConsumerGroup, stream, err)
	}
	t.mu.Lock()
	t.groups[stream] = true
	t.mu.Unlock()
	return nil
}

// Claim takes over up to n entries idle for claim_idle_ms (every half of
// it, walking the pending list), then reads new ones without waiting; an
// entry read by an idle Wait comes first.
func (s *source) Claim(ctx context.Context, n int) ([]*message.Message, error) {
	t := s.t
	// Every entry this claim hands out is checked against the
	// cancellations recorded before it was read: readNew reads the cancel
	// epoch after its entries (in the same round trip), and a claim that
	// hands out entries without reading new ones looks at it apart.
	read := false
	out := make([]*message.Message, 0, n)
	if d := s.takeStash(); d != nil {
		out = append(out, d.msg)
	}
	var entries []redis.XMessage
	var err error
	claimEvery := time.Duration(t.opts.ClaimIdleMS) * time.Millisecond / 2
	if want := n - len(out); want > 0 && (time.Since(s.lastClaim) >= claimEvery || s.claimCursor != "0-0") {
		var claimed []redis.XMessage
		var next string
		claimed, next, err = t.client.XAutoClaim(ctx, &redis.XAutoClaimArgs{
			Stream: s.stream, Group: t.opts.ConsumerGroup, Consumer: t.opts.Consumer,
			MinIdle: time.Duration(t.opts.ClaimIdleMS) * time.Millisecond, Start: s.claimCursor, Count: int64(want),
		}).Result()
		if err == nil {
			entries, s.claimCursor = s.notMine(claimed), next
			t.reclaimed.Add(int64(len(entries)))
			if s.claimCursor == "0-0" {
				s.lastClaim = time.Now()
			}
		} else {
			err = fmt.Errorf("take over idle entries of %s: %w", s.stream, err)
			s.lastClaim = time.Now()
		}
	}
	if want := n - len(out) - len(entries); want > 0 {
		more, rerr := s.readNew(ctx, want, -1)
		entries = append(entries, more...)
		if rerr != nil {
			err = rerr
		} else {
			read = true
		}
	}
	if !read && len(out)+len(entries) > 0 {
		if cerr := t.refreshCancels(ctx); cerr != nil {
			// Not checked against the latest cancellations: handed back.
			for _, e := range entries {
				out = append(out, s.delivery(e).msg)
			}
			s.HandBack(out)
			return nil, cerr
		}
	}
	for _, e := range entries {
		out = append(out, s.delivery(e).msg)
	}
	t.delivered.Add(int64(len(out)))
	if len(out) == 0 && err != nil {
		return nil, err
	}
	return out, nil
}

// Wait blocks in a read of one new entry for up to block_ms; what it reads
// is held for the next Claim (kept claimed by the heartbeat meanwhile, and
// handed back if the subscription ends first).
func (s *source) Wait(ctx context.Context) {
	es, err := s.readNew(ctx, 1, time.Duration(s.t.opts.BlockMS)*time.Millisecond)
	if err == nil && len(es) > 0 {
		d := s.delivery(es[0])
		s.mu.Lock()
		s.stash = d
		s.mu.Unlock()
	}
}

func (s *source) takeStash() *delivery {
	s.mu.Lock()
	defer s.mu.Unlock()
	d := s.stash
	s.stash = nil
	return d
}

// Settle settles one delivery when the core acks or nacks it. An ack after
// a fenced write (result, retry, dead letter) has nothing left to do; a bare
// ack acks the entry (fenced); a nack re-appends it at the tail, at once
// available to every consumer.
func (s *source) Settle(m *message.Message, acked bool) {
	s.mu.Lock()
	d := s.mine[m.Metadata.Get(MetaEntry)]
	s.mu.Unlock()
	if d == nil || d.msg != m {
		return // handed back by Transport.Close
	}
	s.settle(d, acked)
}

// HandBack re-appends entries read but never delivered.
func (s *source) HandBack(ms []*message.Message) {
	for _, m := range ms {
		s.Settle(m, false)
	}
}

// Close hands back an entry an idle Wait read and stops the mover; the
// transport's Close calls it too. Deliveries in flight are still settled
// when acked or nacked (Transport.Close hands back what is left).
func (s *source) Close() error {
	if d := s.takeStash(); d != nil {
		s.settle(d, false)
	}
	if s.cancel != nil {
		s.cancel()
	}
	s.loops.Wait()
	return nil
}

// readNew reads up to n new entries, waiting up to block (-1: not at all).
// After NOGROUP (the stream was deleted) it creates the group again.
func (s *source) readNew(ctx context.Context, n int, block time.Duration) ([]redis.XMessage, error) {
	t := s.t
	// The cancel epoch is read after the entries (on the same connection,
	// so after a blocking read returns): a cancellation recorded before an
	// entry was read is in the copy its check reads.
	var read *redis.XStreamSliceCmd
	var epoch *redis.StringCmd
	_, _ = t.client.Pipelined(ctx, func(pl redis.Pipeliner) error {
		read = pl.XReadGroup(ctx, &redis.XReadGroupArgs{
			Group: t.opts.ConsumerGroup, Consumer: t.opts.Consumer, Streams: []string{s.stream, ">"},
			Count: int64(n), Block: block,
		})
		epoch = pl.Get(ctx, t.opts.CancelKey+":epoch")
		return nil
	})
	res, err := read.Result()
	if err == nil || errors.Is(err, redis.Nil) {
		e, eerr := epoch.Result()
		if eerr != nil && !errors.Is(eerr, redis.Nil) {
			eerr = fmt.Errorf("read cancellations: %w", eerr)
		} else {
			eerr = t.applyEpoch(ctx, e)
		}
		var out []redis.XMessage
		for _, st := range res {
			out = append(out, st.Messages...)
		}
		if eerr != nil {
			// Not checked against the latest cancellations: handed back.
			if len(out) > 0 {
				ms := make([]*message.Message, len(out))
				for i, e := range out {
					ms[i] = s.delivery(e).msg
				}
				s.HandBack(ms)
			}
			return nil, eerr
		}
		return out, nil
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	if strings.HasPrefix(err.Error(), "NOGROUP") {
		t.mu.Lock()
		delete(t.groups, s.stream)
		t.mu.Unlock()
		_ = t.ensureGroup(ctx, s.stream)
	}
	return nil, fmt.Errorf("read %s: %w", s.stream, err)
}

// notMine drops re-claimed entries that this subscriber is running already
// (its heartbeat was late): they must not run twice.
func (s *source) notMine(es []redis.XMessage) []redis.XMessage {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := es[:0]
	for _, e := range es {
		if _, running := s.mine[e.ID]; !running {
			out = append(out, e)
		}
	}
	return out
}

// delivery builds and indexes the message of entry e.
func (s *source) delivery(e redis.XMessage) *delivery {
	m, err := redisstream.DefaultMarshallerUnmarshaller{}.Unmarshal(e.Values)
	if err != nil {
		// Not written by Watermill: take the payload field as it is.
		p, _ := e.Values["payload"].(string)
		m = message.NewMessage(e.ID, []byte(p))
	}
	if m.Metadata == nil {
		m.Metadata = message.Metadata{}
	}
	m.Metadata.Set(MetaStream, s.stream)
	m.Metadata.Set(MetaEntry, e.ID)
	d := &delivery{stream: s.stream, id: e.ID, msg: m}
	s.mu.Lock()
	s.mine[e.ID] = d
	s.mu.Unlock()
	s.t.mu.Lock()
	s.t.inflight[key(s.stream, e.ID)] = d
	s.t.mu.Unlock()
	return d
}

// drop removes d from both indexes; it reports whether the transport still held it.
func (s *source) drop(d *delivery) bool {
	s.mu.Lock()
	if s.mine[d.id] == d {
		delete(s.mine, d.id)
	}
	s.mu.Unlock()
	return s.t.forget(d)
}

// settle settles one delivery when the core acks or nacks it (through
// transport.Ack / transport.Nack; no goroutine waits per message). An ack
// after a fenced write (result, retry, dead letter) has nothing left to do;
// a bare ack acks the entry (fenced); a nack re-appends it at the tail, at
// once available to every consumer.
func (s *source) settle(d *delivery, acked bool) {
	nacked := !acked
	if !s.drop(d) {
		return // handed back by Transport.Close
	}
	if nacked {
		_ = s.t.handBack(d)
		return
	}
	if d.settled.Load() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := s.t.fenced(ctx, ackScript, d, nil); err != nil {
		s.t.log.Error("ack failed; the entry stays pending and is taken over after claim_idle_ms", "stream", d.stream, "entry", d.id, "err", err)
	}
}

// ackScript acks the entry, if still owned.
var ackScript = redis.NewScript(ownedPrelude + ackTail)

// heartbeat keeps this subscriber's entries in flight claimed, so no other
// consumer sees them idle while they run.
func (s *source) heartbeat(ctx context.Context) {
	t := s.t
	tick := time.NewTicker(time.Duration(t.opts.HeartbeatMS) * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if err := s.touch(ctx); err != nil && ctx.Err() == nil {
			t.log.Warn("heartbeat of entries in flight failed", "stream", s.stream, "err", err)
		}
	}
}

// touch is one heartbeat: the idle time of this subscriber's entries in
// flight that are still its own is reset.
func (s *source) touch(ctx context.Context) error {
	t := s.t
	s.mu.Lock()
	ids := make([]any, 0, 2+len(s.mine))
	ids = append(ids, t.opts.ConsumerGroup, t.opts.Consumer)
	for id := range s.mine {
		ids = append(ids, id)
	}
	s.mu.Unlock()
	if len(ids) == 2 {
		return nil
	}
	return touchScript.Run(ctx, t.client, []string{s.stream}, ids...).Err()
}

// moveDue moves due retries of the stream back to it.
func (s *source) moveDue(ctx context.Context) {
	t := s.t
	tick := time.NewTicker(time.Duration(t.opts.RetryPollIntervalMS) * time.Millisecond)
	defer tick.Stop()
	const limit = 256
	for {
		for {
			n, err := moveScript.Run(ctx, t.client, []string{s.stream, s.stream + t.opts.DelayedSuffix}, time.Now().UnixMilli(), limit).Int()
			if err != nil {
				if ctx.Err() == nil {
					t.log.Warn("moving due retries failed; will try again", "stream", s.stream, "err", err)
				}
				break
			}
			if n < limit {
				break
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
