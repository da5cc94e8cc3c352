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
// When the gate places requests on pods (a gate.PodReporter that reports
// pods: pool-headroom with dispatch "pods"), the limit is
// per pod: on each pod over its limit the youngest calls there are taken
// back, so the seats freed are on the pod that needs them.
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
	pods  gate.PodReporter // nil: the queue's limit only
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
	pod     string // the pod the gate placed it on ("": the gateway)
	// kept: taken back EvictLimit times already, it runs to its end (it
	// counts on its pod, but is never a victim)
	kept bool
}

func newEvictor(q *Queue, log *slog.Logger, suspended *prometheus.GaugeVec) *evictor {
	limit := q.EvictLimit
	if limit == 0 {
		limit = DefaultEvictLimit
	}
	e := &evictor{q: q, limit: limit, calls: map[*evictCall]struct{}{}, log: log,
		check: gate.EvictionCheckerOf(q.Gate.Gate()), pods: gate.PodReporterOf(q.Gate.Gate())}
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
// the queue's new limit (or over each pod's, see podVictims) that are not
// being evicted already.
func (e *evictor) SetBudgetMeasured(b float64, measured bool) {
	if !measured || !e.allowed() {
		return
	}
	var victims []*evictCall
	if limits := e.podLimits(); limits != nil {
		victims = e.podVictims(limits)
	} else {
		victims = e.queueVictims(b)
	}
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

// podLimits returns the gate's per-pod limits of its last reading, nil
// when it places nothing.
func (e *evictor) podLimits() map[string]int {
	if e.pods == nil {
		return nil
	}
	rs := e.pods.PodReadings()
	if rs == nil {
		return nil
	}
	out := make(map[string]int, len(rs))
	for _, r := range rs {
		out[r.Pod] = r.Limit
	}
	return out
}

// queueVictims marks and returns the youngest calls over the queue's limit
// at budget b.
func (e *evictor) queueVictims(b float64) []*evictCall {
	// The budget's own limit, not the credits' ramped one: the ramp paces
	// new claims after a rise, and a rise that is still ramping must not
	// read as a fall.
	inflight, _, _ := e.q.credits.Snapshot()
	limit := int(math.Ceil(float64(e.q.credits.Max()) * max(0, min(b, 1))))
	e.mu.Lock()
	defer e.mu.Unlock()
	excess := inflight - limit - e.pending
	if excess <= 0 {
		return nil
	}
	victims := make([]*evictCall, 0, len(e.calls))
	for c := range e.calls {
		if !c.evicted && !c.kept {
			victims = append(victims, c)
		}
	}
	return e.mark(victims, excess)
}

// podVictims marks and returns, on each pod whose calls (not taken back
// already) exceed its limit, the youngest calls there over it. A call on a
// pod the limits do not name (placed before the pods changed) is left
// alone.
func (e *evictor) podVictims(limits map[string]int) []*evictCall {
	e.mu.Lock()
	defer e.mu.Unlock()
	on := map[string][]*evictCall{}
	count := map[string]int{}
	for c := range e.calls {
		if c.evicted || c.pod == "" {
			continue
		}
		count[c.pod]++
		if !c.kept {
			on[c.pod] = append(on[c.pod], c)
		}
	}
	var victims []*evictCall
	for pod, n := range count {
		limit, ok := limits[pod]
		if !ok || n <= limit {
			continue
		}
		victims = append(victims, e.mark(on[pod], n-max(0, limit))...)
	}
	return victims
}

// mark sorts calls youngest first, marks the first n evicted and counts
// them pending; it returns them. e.mu is held.
func (e *evictor) mark(calls []*evictCall, n int) []*evictCall {
	slices.SortFunc(calls, func(a, b *evictCall) int { return b.started.Compare(a.started) })
	calls = calls[:min(n, len(calls))]
	for _, c := range calls {
		c.evicted = true
	}
	e.pending += len(calls)
	return calls
}

// track registers d's HTTP call, bounded by ctx, and returns the context
// to make it with and the func that ends the registration once the call
// returned. A request taken back EvictLimit times already runs to its
// end: registered as kept when it is on a pod (it counts there), not
// registered at all otherwise. An evicted delivery
// stays counted as pending until it is settled (d.afterSettle), so that
// the next budget does not take its seat back twice.
func (e *evictor) track(d *delivery, ctx context.Context) (context.Context, func()) {
	kept := e.limit >= 0 && evictions(d.Req) >= e.limit
	if kept && d.Pod == "" {
		return ctx, func() {} // never a victim, and on no pod to count on
	}
	ctx, cancel := context.WithCancelCause(ctx)
	c := &evictCall{started: time.Now(), cancel: cancel, pod: d.Pod, kept: kept}
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
