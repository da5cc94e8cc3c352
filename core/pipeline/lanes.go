package pipeline

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"

	"github.com/sluice-io/sluice/core/dispatch"
	"github.com/sluice-io/sluice/core/wire"
)

// Upstream's tier-priority merge policy, on sluice's credits.
//
// With the policy on, a worker pool's workers are not taken when a request
// is claimed but after the queue's gate, in one of six lanes: lane =
// class×3 + tier, class 0 for a request classified reserved and 1
// otherwise, tier 0 interactive, 1 async, 2 anything else. A freed worker
// goes to the lowest lane with a request that may start (strict priority),
// and within a lane to its source queues in turn, in the order they first
// appeared. The pool's gate is asked once the worker is held, as upstream's
// worker asks it; the lane goes to the gateway in the priority header when
// one is configured.
//
// Each queue keeps two bounds. Its in-flight limit, ceil(max_concurrency ×
// budget), is counted here: a queue whose requests hold that many workers
// starts no more, and its waiters let lower lanes go. Its claims are
// bounded by twice that (the queue's credits, see Pipeline.New), so that
// while its requests run, as many again wait in their lane: when one ends,
// the next is already there. With claims bounded by the in-flight limit
// alone, a queue whose requests held all the workers it may use had nothing
// waiting at the moment one of them ended (its next request is claimed
// only once that one settles), and the worker went to a lower lane: with
// one worker, batch and interactive requests took turns. Upstream's readers
// fill each lane up to 1000 messages whatever the workers do.
//
// Strict priority starves: under continuous load in a lower-numbered lane
// a higher-numbered one is never served (upstream's TLA+ model of
// MergePriority shows it). Priority.MinShare, off by default as upstream
// has no such thing, gives a lane a minimum share of the grants: each grant
// made while the lane has a request that may start adds its share to the
// lane's credit; a lane whose credit reached 1 is served before strict
// order, and every grant to the lane takes 1 off its credit (not below 0).
// The credits of all lanes together stay below k+1 (k lanes with a share,
// shares summing to at most 1), so while a lane keeps a request that may
// start, of every N grants it gets at least share×N − (k+1), whatever the
// other lanes do; a lane served by
// strict priority anyway spends its credit on that and changes nothing.
// A share is counted in grants, not time: no clock is read, and the
// guarantee holds however long the requests run.

// NumLanes is the number of priority lanes.
const NumLanes = 6

// Priority configures the tier-priority policy.
type Priority struct {
	// Header carries the lane ("0"…"5") to the gateway (upstream's
	// priority_header; empty: not sent, upstream's default since v0.10).
	Header string
	// TierLabel is the label holding the tier (default "tier").
	TierLabel string
	// ObjectiveHeader carries a lane's objective (upstream's
	// objective_header; default defaultObjectiveHeader).
	ObjectiveHeader string
	// LaneObjectives are the InferenceObjective names sent in
	// ObjectiveHeader, by lane ("": none for that lane; see LaneKey).
	LaneObjectives [NumLanes]string
	// MinShare is each lane's minimum share of the pool's worker grants
	// while it has a request that may start (0: none, strict priority
	// alone; see above). Each is in [0,1] and they sum to at most 1
	// (Validate). Upstream has no such setting: all zero is upstream's
	// strict priority.
	MinShare [NumLanes]float64

	headers [NumLanes][]dispatch.Header // each lane's priority and objective headers, built once
}

// defaultObjectiveHeader is upstream's objective header (api.ObjectiveHeader).
const defaultObjectiveHeader = "x-llm-d-inference-objective"

// LaneKey is the name upstream's lane_objectives give lane i:
// "<class>-<tier>", class reserved or overflow, tier interactive, async or
// batch.
func LaneKey(i int) string {
	class := "overflow"
	if i/3 == 0 {
		class = "reserved"
	}
	return class + "-" + [...]string{"interactive", "async", "batch"}[i%3]
}

// Validate reports shares out of range.
func (p *Priority) Validate() error {
	sum := 0.0
	for i, v := range p.MinShare {
		if v != v || v < 0 || v > 1 {
			return fmt.Errorf("pipeline: priority: min share of lane %s: %v is not in [0,1]", LaneKey(i), v)
		}
		sum += v
	}
	if sum > 1+1e-9 {
		return fmt.Errorf("pipeline: priority: min shares sum to %v > 1", sum)
	}
	return nil
}

// shares reports whether any lane has a minimum share.
func (p *Priority) shares() bool {
	return p != nil && p.MinShare != [NumLanes]float64{}
}

// init fills the defaults and the lanes' headers.
func (p *Priority) init() {
	if p.TierLabel == "" {
		p.TierLabel = wire.DefaultTierLabel
	}
	if p.ObjectiveHeader == "" {
		p.ObjectiveHeader = defaultObjectiveHeader
	}
	for i := range p.headers {
		var hs []dispatch.Header
		if p.Header != "" {
			hs = append(hs, dispatch.Header{Name: p.Header, Value: laneValues[i]})
		}
		if o := p.LaneObjectives[i]; o != "" {
			hs = append(hs, dispatch.Header{Name: p.ObjectiveHeader, Value: o})
		}
		p.headers[i] = hs
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
	sources map[string]*laneSource // by queue id
	observe func(LaneEvent)        // Pipeline.ObserveLanes (nil: not observed)
	seq     uint64                 // the last LaneEvent.Seq given
	share   [NumLanes]float64      // Priority.MinShare
	credit  [NumLanes]float64      // each lane's share credit (see MinShare)
	shares  bool                   // some share is not 0
}

// laneSource is one queue of the pool: its in-flight limit and the workers
// its requests hold.
type laneSource struct {
	max     int // max_concurrency: the limit at budget 1
	limit   int // ceil(max × budget); 0 until the first budget
	running int // requests of the queue holding a worker
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

func newLanes(workers int, p *Priority) *lanes {
	l := &lanes{free: workers, open: true, sources: map[string]*laneSource{}}
	if p.shares() {
		l.share, l.shares = p.MinShare, true
	}
	for i := range l.queues {
		l.queues[i].waiting = map[string][]*laneWaiter{}
	}
	return l
}

// addSource registers queue id with its max_concurrency and returns the
// follower that sets its in-flight limit from the queue gate's budget.
// A request of a queue never registered is bounded by the pool only. A
// queue registered again (a reload changed it) keeps the workers its
// requests hold and its limit until its new gate sets one: only its
// max_concurrency changes.
func (l *lanes) addSource(id string, maxConcurrency int) sourceFollower {
	l.mu.Lock()
	if src := l.sources[id]; src != nil {
		src.max = max(1, maxConcurrency)
	} else {
		l.sources[id] = &laneSource{max: max(1, maxConcurrency)}
	}
	l.mu.Unlock()
	return sourceFollower{l, id}
}

// sourceFollower sets one queue's in-flight limit in the lanes from its
// gate's budget, as credit.Pool does for claims (without the ramp: the
// claims, which ramp, bound what can start).
type sourceFollower struct {
	l  *lanes
	id string
}

// SetBudget sets the queue's limit to ceil(max × b) and hands out workers
// it frees.
func (f sourceFollower) SetBudget(b float64) {
	if b != b || b < 0 {
		b = 0
	}
	f.l.mu.Lock()
	src := f.l.sources[f.id]
	src.limit = int(math.Ceil(float64(src.max) * min(b, 1)))
	f.l.grantLocked()
	f.l.mu.Unlock()
}

// SetBudget opens the lanes while a pool gate's budget is above 0.
func (l *lanes) SetBudget(b float64) {
	l.mu.Lock()
	l.open = b > 0
	l.grantLocked()
	l.mu.Unlock()
}

// acquire takes a worker for a request of lane from source, after every
// request of a lower lane that may start; it returns ctx's error, or
// errDraining when draining closes first. waited says the request was not
// granted at once.
func (l *lanes) acquire(ctx context.Context, lane int, source string, draining <-chan struct{}) (waited bool, err error) {
	w, granted := l.enqueue(lane, source)
	if granted {
		return false, nil
	}
	select {
	case <-w.ready:
		return true, nil
	case <-ctx.Done():
		return true, l.abandon(w, lane, source, context.Cause(ctx))
	case <-draining:
		return true, l.abandon(w, lane, source, errDraining)
	}
}

// enqueue adds a waiter for a request of lane from source and hands out
// what workers are free; the waiter is granted at once (granted, read under
// the lock: a later grant writes w.granted under it) or its ready closes
// when it is.
func (l *lanes) enqueue(lane int, source string) (w *laneWaiter, granted bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	w = &laneWaiter{ready: make(chan struct{})}
	q := &l.queues[lane]
	if _, ok := q.waiting[source]; !ok {
		q.sources = append(q.sources, source)
	}
	q.waiting[source] = append(q.waiting[source], w)
	q.nwaiting++
	if l.observe != nil {
		l.seq++
		w.seq = l.seq
	}
	l.grantLocked()
	if !w.granted && w.seq != 0 {
		l.observe(LaneEvent{Kind: LaneWaiting, Lane: lane, Queue: source, Seq: w.seq})
	}
	return w, w.granted
}

// abandon withdraws w, or gives its worker back when it was granted meanwhile.
func (l *lanes) abandon(w *laneWaiter, lane int, source string, err error) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if w.granted {
		l.releaseLocked(source)
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

// release gives back the worker a request of source held and hands it to
// the first waiter in order.
func (l *lanes) release(source string) {
	l.mu.Lock()
	l.releaseLocked(source)
	l.mu.Unlock()
}

func (l *lanes) releaseLocked(source string) {
	l.free++
	if src := l.sources[source]; src != nil {
		src.running--
	}
	l.grantLocked()
}

// mayStart reports whether a request of source may take a worker now.
func (l *lanes) mayStart(source string) bool {
	src := l.sources[source]
	return src == nil || src.running < src.limit
}

// grantLocked hands free workers to waiters: lowest lane first, its sources
// in turn, skipping sources at their in-flight limit.
func (l *lanes) grantLocked() {
	for l.open && l.free > 0 {
		if !l.grantOneLocked() {
			return
		}
	}
}

// grantOneLocked gives one free worker to the first waiter in order that
// may start; it reports false when there is none.
func (l *lanes) grantOneLocked() bool {
	if l.shares {
		return l.grantShareLocked()
	}
	for lane := range l.queues {
		if l.grantLaneLocked(lane) {
			return true
		}
	}
	return false
}

// grantShareLocked is grantOneLocked with minimum shares: every lane with
// a share and a request that may start earns its share; the lowest lane
// whose credit reached 1 is served first, else strict order; the lane
// served pays 1 (not below 0).
func (l *lanes) grantShareLocked() bool {
	var ready [NumLanes]bool
	found := false
	for lane := range l.queues {
		ready[lane] = l.startableLocked(lane)
		found = found || ready[lane]
	}
	if !found {
		return false
	}
	pick := -1
	for lane, r := range ready {
		if r && l.share[lane] > 0 {
			l.credit[lane] += l.share[lane]
			if pick < 0 && l.credit[lane] >= 1 {
				pick = lane
			}
		}
	}
	if pick < 0 {
		pick = slices.Index(ready[:], true)
	}
	l.credit[pick] = max(0, l.credit[pick]-1)
	return l.grantLaneLocked(pick)
}

// startableLocked reports whether lane holds a waiter whose source may
// start.
func (l *lanes) startableLocked(lane int) bool {
	q := &l.queues[lane]
	if q.nwaiting == 0 {
		return false
	}
	for src, ws := range q.waiting {
		if len(ws) > 0 && l.mayStart(src) {
			return true
		}
	}
	return false
}

// grantLaneLocked gives one free worker to lane's next source in turn
// that has a waiter and may start; it reports false when there is none.
func (l *lanes) grantLaneLocked(lane int) bool {
	q := &l.queues[lane]
	if q.nwaiting == 0 {
		return false
	}
	for range q.sources {
		src := q.sources[q.next%len(q.sources)]
		q.next++
		ws := q.waiting[src]
		if len(ws) == 0 || !l.mayStart(src) {
			continue
		}
		w := ws[0]
		q.waiting[src] = ws[1:]
		q.nwaiting--
		w.granted = true
		l.free--
		if s := l.sources[src]; s != nil {
			s.running++
		}
		if l.observe != nil && w.seq != 0 {
			l.observe(LaneEvent{Kind: LaneGranted, Lane: lane, Queue: src, Seq: w.seq})
		}
		close(w.ready)
		return true
	}
	return false
}
