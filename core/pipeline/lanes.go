package pipeline

import (
	"context"
	"strconv"
	"sync"

	"github.com/sluice-io/sluice/core/dispatch"
	"github.com/sluice-io/sluice/core/wire"
)

// Upstream's tier-priority merge policy, on sluice's credits.
//
// With the policy on, a worker pool's workers are not taken when a request
// is claimed (its queue's credits still bound what is claimed, so at most
// the queues' max_concurrency requests wait in memory) but after the
// queue's gate, in one of six lanes: lane = class×3 + tier, class 0 for a
// request classified reserved and 1 otherwise, tier 0 interactive, 1 async,
// 2 anything else. A freed worker goes to the lowest non-empty lane (strict
// priority), and within a lane to its source queues in turn, in the order
// they first appeared. The pool's gate is asked once the worker is held, as
// upstream's worker asks it; the lane goes to the gateway in the priority
// header.

// NumLanes is the number of priority lanes.
const NumLanes = 6

// Priority configures the tier-priority policy.
type Priority struct {
	// Header carries the lane ("0"…"5") to the gateway (upstream's
	// priority_header, default x-gateway-priority).
	Header string
	// TierLabel is the label holding the tier (default "tier").
	TierLabel string

	headers [NumLanes][]dispatch.Header // the priority header of each lane, built once
}

// init fills the defaults and the lanes' headers.
func (p *Priority) init() {
	if p.Header == "" {
		p.Header = "x-gateway-priority"
	}
	if p.TierLabel == "" {
		p.TierLabel = wire.DefaultTierLabel
	}
	for i := range p.headers {
		p.headers[i] = []dispatch.Header{{Name: p.Header, Value: laneValues[i]}}
	}
}

// lane returns req's lane under p.
func (p *Priority) lane(req *wire.Request) int {
	class := 1
	if req.Classification() == wire.ClassReserved {
		class = 0
	}
	tier := 2
	switch req.Label(p.TierLabel) {
	case wire.TierInteractive:
		tier = 0
	case wire.TierAsync:
		tier = 1
	}
	return class*3 + tier
}

// laneValues are the header values of the lanes, built once.
var laneValues = func() (v [NumLanes]string) {
	for i := range v {
		v[i] = strconv.Itoa(i)
	}
	return v
}()

// LaneEvent is one step of a worker pool's lanes, as the function given to
// Pipeline.ObserveLanes sees it.
type LaneEvent struct {
	// Kind is what happened to the request.
	Kind LaneEventKind
	// Lane is the request's lane (0…NumLanes-1).
	Lane int
	// Queue is the id of the request's queue (its source within the lane).
	Queue string
	// Seq numbers the requests in the order they reached the pool's lanes
	// (from 1, counted only while observed): a request's Waiting, Granted
	// and Abandoned steps carry the same Seq.
	Seq uint64
}

// LaneEventKind says what a LaneEvent reports.
type LaneEventKind uint8

// The steps of a request in the lanes.
const (
	// LaneWaiting: no worker could go to the request, so it waits in its lane.
	LaneWaiting LaneEventKind = iota
	// LaneGranted: the request was given a worker, at once (no LaneWaiting
	// step before) or after waiting.
	LaneGranted
	// LaneAbandoned: the request stopped waiting without a worker (its
	// deadline or the gate timeout passed, or shutdown began).
	LaneAbandoned
)

// lanes hands a pool's workers out by lane.
type lanes struct {
	mu      sync.Mutex
	free    int
	open    bool
	queues  [NumLanes]laneQueue
	observe func(LaneEvent) // Pipeline.ObserveLanes (nil: not observed)
	seq     uint64          // the last LaneEvent.Seq given
}

// laneQueue holds one lane's waiters by source, served in turn.
type laneQueue struct {
	sources  []string
	waiting  map[string][]*laneWaiter
	next     int
	nwaiting int
}

type laneWaiter struct {
	ready   chan struct{}
	granted bool
	seq     uint64 // LaneEvent.Seq, when observed
}

func newLanes(workers int) *lanes {
	l := &lanes{free: workers, open: true}
	for i := range l.queues {
		l.queues[i].waiting = map[string][]*laneWaiter{}
	}
	return l
}

// SetBudget opens the lanes while a pool gate's budget is above 0.
func (l *lanes) SetBudget(b float64) {
	l.mu.Lock()
	l.open = b > 0
	l.grantLocked()
	l.mu.Unlock()
}

// acquire takes a worker for a request of lane from source, waiting behind
// every request of a lower lane; it returns ctx's error, or errDraining when
// draining closes first.
func (l *lanes) acquire(ctx context.Context, lane int, source string, draining <-chan struct{}) error {
	l.mu.Lock()
	if l.open && l.free > 0 && l.waitingBefore(lane+1) == 0 {
		l.free--
		if l.observe != nil {
			l.seq++
			l.observe(LaneEvent{Kind: LaneGranted, Lane: lane, Queue: source, Seq: l.seq})
		}
		l.mu.Unlock()
		return nil
	}
	w := &laneWaiter{ready: make(chan struct{})}
	q := &l.queues[lane]
	if _, ok := q.waiting[source]; !ok {
		q.sources = append(q.sources, source)
	}
	q.waiting[source] = append(q.waiting[source], w)
	q.nwaiting++
	if l.observe != nil {
		l.seq++
		w.seq = l.seq
		l.observe(LaneEvent{Kind: LaneWaiting, Lane: lane, Queue: source, Seq: w.seq})
	}
	l.mu.Unlock()
	select {
	case <-w.ready:
		return nil
	case <-ctx.Done():
		return l.abandon(w, lane, source, context.Cause(ctx))
	case <-draining:
		return l.abandon(w, lane, source, errDraining)
	}
}

// abandon withdraws w, or gives its worker back when it was granted meanwhile.
func (l *lanes) abandon(w *laneWaiter, lane int, source string, err error) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if w.granted {
		l.free++
		l.grantLocked()
		return err
	}
	q := &l.queues[lane]
	ws := q.waiting[source]
	for i, x := range ws {
		if x == w {
			q.waiting[source] = append(ws[:i:i], ws[i+1:]...)
			q.nwaiting--
			if l.observe != nil && w.seq != 0 {
				l.observe(LaneEvent{Kind: LaneAbandoned, Lane: lane, Queue: source, Seq: w.seq})
			}
			break
		}
	}
	return err
}

// release gives a worker back and hands it to the first waiter in order.
func (l *lanes) release() {
	l.mu.Lock()
	l.free++
	l.grantLocked()
	l.mu.Unlock()
}

// grantLocked hands free workers to waiters: lowest lane first, its sources
// in turn.
func (l *lanes) grantLocked() {
	for l.open && l.free > 0 {
		lane := -1
		for i := range l.queues {
			if l.queues[i].nwaiting > 0 {
				lane = i
				break
			}
		}
		if lane < 0 {
			return
		}
		q := &l.queues[lane]
		for range q.sources {
			src := q.sources[q.next%len(q.sources)]
			q.next++
			if ws := q.waiting[src]; len(ws) > 0 {
				w := ws[0]
				q.waiting[src] = ws[1:]
				q.nwaiting--
				w.granted = true
				l.free--
				if l.observe != nil && w.seq != 0 {
					l.observe(LaneEvent{Kind: LaneGranted, Lane: lane, Queue: src, Seq: w.seq})
				}
				close(w.ready)
				break
			}
		}
	}
}

// waitingBefore counts the waiters of lanes below n.
func (l *lanes) waitingBefore(n int) int {
	total := 0
	for i := 0; i < n && i < NumLanes; i++ {
		total += l.queues[i].nwaiting
	}
	return total
}
