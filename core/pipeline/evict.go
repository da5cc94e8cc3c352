package pipeline

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/wire"
)

// DefaultEvictLimit is how many times one request may be taken back when
// Queue.EvictLimit is 0.
const DefaultEvictLimit = 2

// EvictionsLabel is the request label counting how many times the request
// was taken back; it travels with the re-queued message.
const EvictionsLabel = "sluice_evictions"

// errEvicted is the cancellation cause of a request the evictor took back:
// its HTTP call is aborted and the request re-queued due at once, without
// counting an attempt (see retrier).
var errEvicted = errors.New("request evicted: the gate's budget fell below what was in flight")

// evictor takes requests back from the pool when a queue's gate budget
// falls below what the queue has in flight (Queue.Evict). Without it a
// falling budget only stops new claims, and the pool gets its seats back as
// the requests running finish: seconds for an LLM generation, which is how
// long an interactive burst waits behind a batch. With it, the youngest
// calls over the new limit are aborted at once (an inference server frees
// the seat of a request whose client hung up) and their requests re-queued
// due now in their deadline order, their attempt count unchanged. The
// youngest have the least work done, so the least is lost.
//
// It follows the queue's gate after the queue's credits (so the credits'
// limit is the new one when it looks) and acts only on a measured budget
// (gate.MeasuredFollower): a gate that fails to read its backend keeps the
// work running. Cost on the per-message path: one map insert and delete per
// dispatched request, under one mutex, for the queues that enable it.
//
// When the gate is a gate.EvictionChecker (pool-headroom), the evictor
// asks it before taking anything back and tells it what it took back: a
// pool that does not free the calls aborted (a server that ignores
// hang-ups) suspends eviction for a back-off, logged once per suspension
// and shown as sluice_evict_suspended{queue} and on the status page, while
// the queue keeps dispatching under its gate's limit.
type evictor struct {
	q     *Queue
	limit int // evictions allowed per request; negative: no limit
	check gate.EvictionChecker
	log   *slog.Logger
	gauge prometheus.Gauge // sluice_evict_suspended of the queue

	mu      sync.Mutex
	calls   map[*evictCall]struct{} // the calls being dispatched
	pending int                     // evicted, their deliveries not settled yet
	state   gate.EvictionState      // the gate's last answer
}

type evictCall struct {
	started time.Time
	cancel  context.CancelCauseFunc
	evicted bool
}

func newEvictor(q *Queue, log *slog.Logger, suspended *prometheus.GaugeVec) *evictor {
	limit := q.EvictLimit
	if limit == 0 {
		limit = DefaultEvictLimit
	}
	e := &evictor{q: q, limit: limit, calls: map[*evictCall]struct{}{}, log: log,
		check: gate.EvictionCheckerOf(q.Gate.Gate())}
	if suspended != nil {
		e.gauge = suspended.WithLabelValues(q.ID)
		e.gauge.Set(0)
	}
	return e
}

// allowed asks the gate's checker whether calls may be taken back now,
// and logs and exports a change of suspension.
func (e *evictor) allowed() bool {
	if e.check == nil {
		return true
	}
	st := e.check.EvictionState(context.Background())
	e.mu.Lock()
	was := e.state.Suspended
	e.state = st
	e.mu.Unlock()
	switch {
	case st.Suspended && !was:
		e.log.Warn("eviction suspended: the pool did not free the calls taken back; dispatching under the gate without eviction",
			"queue", e.q.ID, "gate", e.q.Gate.Name(), "saw", st.Reason, "retry_at", st.Until.Format(time.RFC3339))
	case !st.Suspended && was:
		e.log.Info("eviction resumed after its back-off", "queue", e.q.ID, "gate", e.q.Gate.Name())
	}
	if e.gauge != nil {
		if st.Suspended {
			e.gauge.Set(1)
		} else {
			e.gauge.Set(0)
		}
	}
	return !st.Suspended && !st.Pending
}

// State returns the gate's last answer on eviction (zero: not suspended).
func (e *evictor) State() gate.EvictionState {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.state
}

// evictions returns how many times req was taken back.
func evictions(req *wire.Request) int {
	n, _ := strconv.Atoi(req.Label(EvictionsLabel))
	return n
}

// SetBudget is a budget whose origin is unknown (Attach's first): no
// eviction.
func (e *evictor) SetBudget(float64) {}

// SetBudgetMeasured evicts, on a measured budget, the youngest calls over
// the queue's new limit that are not being evicted already.
func (e *evictor) SetBudgetMeasured(b float64, measured bool) {
	if !measured || !e.allowed() {
		return
	}
	// The budget's own limit, not the credits' ramped one: the ramp paces
	// new claims after a rise, and a rise that is still ramping must not
	// read as a fall.
	inflight, _, _ := e.q.credits.Snapshot()
	limit := int(math.Ceil(float64(e.q.credits.Max()) * max(0, min(b, 1))))
	e.mu.Lock()
	excess := inflight - limit - e.pending
	if excess <= 0 {
		e.mu.Unlock()
		return
	}
	victims := make([]*evictCall, 0, len(e.calls))
	for c := range e.calls {
		if !c.evicted {
			victims = append(victims, c)
		}
	}
	slices.SortFunc(victims, func(a, b *evictCall) int { return b.started.Compare(a.started) })
	victims = victims[:min(excess, len(victims))]
	for _, c := range victims {
		c.evicted = true
	}
	e.pending += len(victims)
	e.mu.Unlock()
	for _, c := range victims {
		c.cancel(errEvicted)
	}
	if n := len(victims); n > 0 {
		e.q.metrics.own.Evicted.Add(float64(n))
		if e.check != nil {
			e.check.Evicted(context.Background(), n)
		}
	}
}

// track registers d's HTTP call (unless its request was taken back
// EvictLimit times already), bounded by ctx, and returns the context
// to make it with and the func that ends the registration once the call
// returned. An evicted delivery stays counted as pending until it is
// settled (d.afterSettle), so that the next budget does not take its seat
// back twice.
func (e *evictor) track(d *delivery, ctx context.Context) (context.Context, func()) {
	if e.limit >= 0 && evictions(d.Req) >= e.limit {
		return ctx, func() {} // taken back often enough: it runs to its end
	}
	ctx, cancel := context.WithCancelCause(ctx)
	c := &evictCall{started: time.Now(), cancel: cancel}
	e.mu.Lock()
	e.calls[c] = struct{}{}
	e.mu.Unlock()
	return ctx, func() {
		e.mu.Lock()
		delete(e.calls, c)
		evicted := c.evicted
		e.mu.Unlock()
		cancel(nil)
		if evicted {
			d.afterSettle = e.settled
		}
	}
}

// settled ends the pending count of one evicted delivery.
func (e *evictor) settled() {
	e.mu.Lock()
	e.pending--
	e.mu.Unlock()
}
