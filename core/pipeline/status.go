package pipeline

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/metrics"
	"github.com/sluice-io/sluice/core/transport"
)

// The pipeline's figures for the status page (core/status): Snapshot reads
// what the metrics and the credits hold at the moment it is called, and the
// gauges sampler keeps a short history per queue (its gate budget and its
// result count, one sample per historyStep over HistorySpan) from which the
// page draws the budget chart and the throughput. Nothing runs per message
// for it: a sample costs the sampler one lock and a read of the queue's
// result counters.

const (
	// HistorySpan is how far back a queue's history goes.
	HistorySpan = 15 * time.Minute
	// historyStep is the least time between two samples of the history (the
	// sampler ticks every GaugeInterval, default 2s; faster ticks are thinned).
	historyStep = 2 * time.Second
	// RateWindow is the window of QueueSnapshot.Throughput.
	RateWindow = time.Minute

	historyLen = int(HistorySpan/historyStep) + 1
)

// Snapshot is the state of the pipeline at one moment.
type Snapshot struct {
	// At is when the snapshot was taken.
	At time.Time
	// Queues are the queues, in configuration order.
	Queues []QueueSnapshot
	// Pools are the worker pools, in configuration order.
	Pools []PoolSnapshot
}

// QueueSnapshot is one queue's figures.
type QueueSnapshot struct {
	ID, Name string
	// WorkerPool is the queue's worker pool.
	WorkerPool string
	// Gate is the refresh loop of the queue's gate (shared by queues of the
	// same gate definition).
	Gate *gate.Refresher
	// Waiting, Delayed and DeadLetterHeld are the broker's counts at the
	// last depth sample (broker_backlog, sluice_delayed_requests, and the
	// messages its dead-letter destination holds; -1: not known); DepthAt is
	// when that was, zero when no depth was read (the transport reports
	// none, the poll is off, or it has not run yet).
	Waiting, Delayed, DeadLetterHeld int64
	DepthAt                          time.Time
	// Claimed, Limit and Max are the queue's credits: requests claimed and
	// not yet settled, the in-flight limit now (ceil(Max × budget), ramped)
	// and at budget 1.
	Claimed, Limit, Max int
	// Calls are the gateway calls under way (inflight_requests).
	Calls int
	// Budget is the queue's gate budget in force.
	Budget float64
	// Results counts the results written, by code (every code of
	// metrics.ResultCodes, zeros included); Total is their sum.
	Results map[string]uint64
	Total   uint64
	// DeadLettered counts the messages sent to the dead-letter destination
	// (sluice_dead_lettered_total: since this process started).
	DeadLettered uint64
	// Throughput is the results written per second over the last RateWindow
	// (or since the oldest sample, when the history is younger).
	Throughput float64
	// BudgetHistory is the gate budget at each sample, oldest first, over
	// the last HistorySpan.
	BudgetHistory []BudgetSample
	// Evict is the state of the queue's eviction: "" (the queue does not
	// evict), "on" or "suspended" (its gate saw the pool not free the
	// calls taken back: see gate.EvictionChecker). EvictReason says what
	// the gate saw, EvictUntil when eviction is tried again.
	Evict       string
	EvictReason string
	EvictUntil  time.Time
}

// BudgetSample is a queue's budget at one sample.
type BudgetSample struct {
	At     time.Time
	Budget float64
}

// PoolSnapshot is one worker pool's figures.
type PoolSnapshot struct {
	ID string
	// Workers is the most requests of the pool's queues in flight at once.
	Workers int
	// InFlight is the workers taken now.
	InFlight int
	// Waiting are the requests waiting for a worker in the pool's lanes
	// (tier-priority policy; 0 otherwise: requests wait in the broker).
	Waiting int
	// Lanes is true under the tier-priority policy.
	Lanes bool
	// Gate is the refresh loop of the pool's gate (nil: none).
	Gate *gate.Refresher
}

// Snapshot returns the pipeline's figures now. It may be called at any
// time, from any goroutine, before, while and after Run runs.
func (p *Pipeline) Snapshot() Snapshot {
	now := time.Now()
	queues := p.current()
	s := Snapshot{At: now, Queues: make([]QueueSnapshot, 0, len(queues)), Pools: make([]PoolSnapshot, 0, len(p.cfg.Pools))}
	for _, q := range queues {
		s.Queues = append(s.Queues, q.snapshot(now))
	}
	for _, spec := range p.cfg.Pools {
		pl := p.pools[spec.ID]
		if pl == nil {
			continue
		}
		ps := PoolSnapshot{ID: pl.ID, Workers: pl.Workers, Gate: pl.Gate, Lanes: pl.lanes != nil}
		if pl.lanes != nil {
			pl.lanes.mu.Lock()
			ps.InFlight = pl.Workers - pl.lanes.free
			for i := range pl.lanes.queues {
				ps.Waiting += pl.lanes.queues[i].nwaiting
			}
			pl.lanes.mu.Unlock()
		} else {
			ps.InFlight, _, _ = pl.credits.Snapshot()
		}
		s.Pools = append(s.Pools, ps)
	}
	return s
}

func (q *Queue) snapshot(now time.Time) QueueSnapshot {
	qm := q.metrics
	claimed, limit, _ := q.credits.Snapshot()
	qs := QueueSnapshot{
		ID: q.ID, Name: q.Name, WorkerPool: q.WorkerPool, Gate: q.Gate,
		Claimed: claimed, Limit: limit, Max: q.credits.Max(),
		Budget:  q.Gate.Budget(),
		Results: make(map[string]uint64, len(metrics.ResultCodes)),
	}
	qm.eachView(func(v *metrics.Queue) {
		for _, code := range metrics.ResultCodes {
			qs.Results[code] += uint64(counterValue(v.Result(code)))
		}
		qs.DeadLettered += uint64(counterValue(v.DeadLettered))
		qs.Calls += int(gaugeValue(v.Inflight))
	})
	for _, n := range qs.Results {
		qs.Total += n
	}
	qm.history.read(now, &qs)
	if q.evictor != nil {
		qs.Evict = "on"
		if st := q.evictor.State(); st.Suspended && now.Before(st.Until) {
			qs.Evict, qs.EvictReason, qs.EvictUntil = "suspended", st.Reason, st.Until
		}
	}
	return qs
}

// eachView calls f with the queue's own metrics view and every view of the
// label sets its requests named (see queueMetrics.of).
func (qm *queueMetrics) eachView(f func(*metrics.Queue)) {
	f(qm.own)
	qm.views.Range(func(_, v any) bool {
		if v != qm.own {
			f(v.(*metrics.Queue))
		}
		return true
	})
}

// resultTotal is the number of results the queue wrote, over all its views.
func (qm *queueMetrics) resultTotal() uint64 {
	var n uint64
	qm.eachView(func(v *metrics.Queue) {
		for _, code := range metrics.ResultCodes {
			n += uint64(counterValue(v.Result(code)))
		}
	})
	return n
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if c.Write(&m) != nil {
		return 0
	}
	return m.GetCounter().GetValue()
}

func gaugeValue(g prometheus.Gauge) float64 {
	var m dto.Metric
	if g.Write(&m) != nil {
		return 0
	}
	return m.GetGauge().GetValue()
}

// queueHistory is what the sampler keeps of one queue for Snapshot: a ring
// of samples, and the last depth read from the broker.
type queueHistory struct {
	mu      sync.Mutex
	ring    [historyLen]historySample
	next, n int // the slot of the next sample; samples held
	depth   transport.Depth
	depthAt time.Time
}

type historySample struct {
	at      time.Time
	budget  float64
	results uint64
}

// observeDepth records a depth the sampler read from the broker.
func (h *queueHistory) observeDepth(now time.Time, d transport.Depth) {
	h.mu.Lock()
	h.depth, h.depthAt = d, now
	h.mu.Unlock()
}

// sample records the budget and the result count at now, unless the last
// sample is younger than historyStep (with a tenth of slack for a ticker's
// jitter).
func (h *queueHistory) sample(now time.Time, budget float64, results uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n > 0 && now.Sub(h.ring[(h.next+historyLen-1)%historyLen].at) < historyStep*9/10 {
		return
	}
	h.ring[h.next] = historySample{at: now, budget: budget, results: results}
	h.next = (h.next + 1) % historyLen
	h.n = min(h.n+1, historyLen)
}

// read fills qs's depth, budget history and throughput (qs.Total must be
// set: the results now).
func (h *queueHistory) read(now time.Time, qs *QueueSnapshot) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.depthAt.IsZero() {
		qs.Waiting, qs.Delayed, qs.DeadLetterHeld, qs.DepthAt = h.depth.Waiting, h.depth.Delayed, h.depth.DeadLettered, h.depthAt
	}
	qs.BudgetHistory = make([]BudgetSample, 0, h.n)
	var base *historySample // the oldest sample within the rate window
	for i := 0; i < h.n; i++ {
		s := &h.ring[(h.next-h.n+i+historyLen)%historyLen]
		age := now.Sub(s.at)
		if age > HistorySpan {
			continue
		}
		qs.BudgetHistory = append(qs.BudgetHistory, BudgetSample{At: s.at, Budget: s.budget})
		if base == nil && age <= RateWindow {
			base = s
		}
	}
	if base != nil && qs.Total >= base.results {
		if secs := now.Sub(base.at).Seconds(); secs > 0 {
			qs.Throughput = float64(qs.Total-base.results) / secs
		}
	}
}
