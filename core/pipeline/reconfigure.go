package pipeline

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Reconfiguring a running pipeline (the queue file's hot reload).
//
// Reconfigure replaces the pipeline's queues with a new list while Run
// runs, without a restart and without dropping a request:
//
//   - a queue whose id and settings are unchanged (same names, result
//     destination, max concurrency, target, gate loop, ramp, worker pool,
//     labels) is kept as it is: its claim loop and its requests in flight
//     are not touched;
//   - a queue that is new starts claiming at once (its gate loop is started
//     first when it is not running yet);
//   - a queue that is gone stops claiming: its claim loop ends (what it had
//     claimed but not delivered is handed back to the transport), its
//     requests in flight finish and their results are written through its
//     publisher, and then its publisher is closed, its credits stop following
//     its gate, its gate loop is closed when no queue or pool uses it any
//     more, and its sampled series (backlog, budget, depth, proximity) are
//     deleted unless a queue with the same labels runs (upstream's
//     RemoveQueueSnapshots; counters are kept);
//   - a queue whose settings changed is both: the new one starts claiming
//     while the old one's requests in flight finish under the old settings.
//     Until they have, the queue may have up to its old and its new max
//     concurrency in flight together; a worker pool's bound holds
//     throughout (the requests hold the pool's credits or lanes whichever
//     settings claimed them).
//
// New claim loops start before old ones stop, so the router is never left
// without a handler (Watermill's router closes itself when its last
// handler stops); an empty list is allowed, as upstream allows it on
// reload: an idle handler then keeps the router up until shutdown.
//
// What Reconfigure cannot change is the rest of the Config (transport,
// pools, policy, retry, timeouts): those are fixed by New.

// Changes says what a Reconfigure did, by queue id.
type Changes struct {
	Added, Removed, Changed []string
}

// Empty reports whether nothing changed.
func (c Changes) Empty() bool { return len(c.Added)+len(c.Removed)+len(c.Changed) == 0 }

// ErrNotRunning is returned by Reconfigure before Run started claiming or
// once shutdown began.
var ErrNotRunning = errors.New("pipeline: not running")

// ErrStartClaims is wrapped by Reconfigure's error when a new claim loop
// could not start (its transport refused to open the queue): the queues
// whose loops started run, beside the old ones.
var ErrStartClaims = errors.New("pipeline: start claim loops")

// Reconfigure makes queues the pipeline's queues while Run runs (see the
// comment above for what happens to each). The queues are checked as New
// checks them, except that the list may be empty; on an error nothing
// changed. It returns once the new claim loops run; removed queues drain
// in the background (their claims have stopped when it returns), and
// Run's shutdown waits for them as for the others.
// Calls are serialized.
func (p *Pipeline) Reconfigure(ctx context.Context, queues []Queue) (Changes, error) {
	p.reconf.Lock()
	defer p.reconf.Unlock()
	var ch Changes
	if err := ctx.Err(); err != nil {
		return ch, err
	}
	p.mu.Lock()
	router, work := p.router, p.work
	cur := slices.Clone(p.queues)
	p.mu.Unlock()
	if router == nil || !p.ready.Load() {
		return ch, ErrNotRunning
	}
	if errs := checkQueues(queues); len(errs) > 0 {
		return ch, errors.Join(errs...)
	}
	byID := map[string]*Queue{}
	for _, q := range cur {
		byID[q.ID] = q
	}
	var next, added []*Queue
	kept := map[*Queue]bool{}
	undo := func() {
		for _, q := range added {
			p.release(q)
		}
	}
	for _, spec := range queues {
		old := byID[spec.ID]
		if old != nil {
			s := spec
			if s.WorkerPool == "" {
				s.WorkerPool = defaultWorkerPool
			}
			if old.spec.equal(specOf(s)) {
				next, kept[old] = append(next, old), true
				continue
			}
		}
		q, err := p.initQueue(spec)
		if err == nil {
			err = p.openQueue(q)
			if err != nil {
				p.detach(q)
			}
		}
		if err != nil {
			undo()
			return ch, err
		}
		added, next = append(added, q), append(next, q)
		if old != nil {
			ch.Changed = append(ch.Changed, q.ID)
		} else {
			ch.Added = append(ch.Added, q.ID)
		}
	}
	var removed []*Queue
	for _, q := range cur {
		if !kept[q] {
			removed = append(removed, q)
			if !slices.Contains(ch.Changed, q.ID) {
				ch.Removed = append(ch.Removed, q.ID)
			}
		}
	}
	for _, q := range added {
		p.startGate(work, q.Gate)
	}
	if len(next) == 0 && !p.keeper {
		p.keeper = true
		router.AddConsumerHandler("sluice-idle", "idle", &idleSubscriber{ch: make(chan *message.Message)}, func(*message.Message) error { return nil })
	}
	for _, q := range added {
		p.seq++
		router.AddConsumerHandler(q.ID+"#"+strconv.Itoa(p.seq), q.Name, q.sub, p.handlerOf(work, q))
	}
	if err := router.RunHandlers(work); err != nil {
		// A subscriber refused to start (the transport is closing): the
		// handlers that did start run, the old queues keep running too.
		p.mu.Lock()
		p.queues = append(p.queues, added...)
		p.mu.Unlock()
		return ch, fmt.Errorf("%w: %w", ErrStartClaims, err)
	}
	p.mu.Lock()
	p.queues = next
	p.retiring = append(p.retiring, removed...)
	p.mu.Unlock()
	for _, q := range removed {
		// Claims stop now (what was claimed and not delivered is handed
		// back); the requests in flight drain in the background.
		if err := q.sub.Close(); err != nil {
			p.log.Warn("closing a removed queue's claim loop", "queue", q.ID, "err", err)
		}
		go p.retire(q)
	}
	if !ch.Empty() {
		p.log.Info("queues reconfigured", "added", ch.Added, "removed", ch.Removed, "changed", ch.Changed, "queues", len(next))
	}
	return ch, nil
}

// retirePoll is how often a removed queue's requests in flight are counted.
const retirePoll = 20 * time.Millisecond

// retire waits for the requests in flight of q, whose claims stopped, to
// settle and releases what q alone holds. When shutdown begins first, Run's drain
// takes over (it waits for every handler and closes the publishers and
// gates that remain).
func (p *Pipeline) retire(q *Queue) {
	t := time.NewTicker(retirePoll)
	defer t.Stop()
	for {
		if inflight, _, _ := q.credits.Snapshot(); inflight == 0 {
			break
		}
		select {
		case <-p.draining:
			return
		case <-t.C:
		}
	}
	p.mu.Lock()
	select {
	case <-p.draining: // handBack closes what remains
		p.mu.Unlock()
		return
	default:
	}
	p.retiring = slices.DeleteFunc(p.retiring, func(x *Queue) bool { return x == q })
	p.mu.Unlock()
	p.release(q)
	p.log.Info("removed queue drained", "queue", q.ID)
}

// release undoes what q holds: its publisher, its followers of the gate,
// the gate loop when nothing else uses it, its sampled series when no
// running queue has its labels (its sluice_evict_suspended when no running
// queue of its id evicts). q must be in neither p.queues nor
// p.retiring.
func (p *Pipeline) release(q *Queue) {
	p.detach(q)
	q.workers.close()
	p.mu.Lock()
	p.publishers = slices.DeleteFunc(p.publishers, func(x message.Publisher) bool { return x == q.pub })
	gateUsed, labelsUsed, evictShown := false, false, false
	for _, o := range append(slices.Clone(p.queues), p.retiring...) {
		gateUsed = gateUsed || o.Gate == q.Gate
		labelsUsed = labelsUsed || o.metrics.own.Labels == q.metrics.own.Labels
		evictShown = evictShown || (o.ID == q.ID && o.evictor != nil)
	}
	for _, pl := range p.cfg.Pools {
		gateUsed = gateUsed || pl.Gate == q.Gate
	}
	started := p.gates[q.Gate]
	if !gateUsed {
		delete(p.gates, q.Gate)
	}
	p.mu.Unlock()
	if q.pub != nil {
		if err := q.pub.Close(); err != nil {
			p.log.Warn("closing a removed queue's result publisher", "queue", q.ID, "err", err)
		}
	}
	if !gateUsed && started {
		if err := q.Gate.Close(); err != nil {
			p.log.Warn("closing a removed queue's gate", "queue", q.ID, "err", err)
		}
	}
	if !labelsUsed {
		p.cfg.Metrics.RemoveQueueSnapshots(q.metrics.own.Labels)
	}
	if q.evictor != nil && !evictShown {
		// no running queue of that id evicts (any more): its
		// sluice_evict_suspended must not stay at its last value
		p.cfg.Metrics.EvictSuspended.DeleteLabelValues(q.ID)
	}
}

// detach stops q's credits (and lane source) from following its gate.
func (p *Pipeline) detach(q *Queue) {
	for _, f := range q.followers {
		q.Gate.Detach(f)
	}
}

// idleSubscriber delivers nothing; its channel closes when it is closed
// (the router closes it at shutdown). It keeps the router running while
// the pipeline has no queues.
type idleSubscriber struct {
	ch   chan *message.Message
	once sync.Once
}

func (s *idleSubscriber) Subscribe(context.Context, string) (<-chan *message.Message, error) {
	return s.ch, nil
}

func (s *idleSubscriber) Close() error {
	s.once.Do(func() { close(s.ch) })
	return nil
}
