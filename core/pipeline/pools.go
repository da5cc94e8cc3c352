package pipeline

import (
	"fmt"
	"sync/atomic"

	"github.com/sluice-io/sluice/core/credit"
	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/metrics"
)

// Worker pools.
//
// A worker pool (upstream's) bounds the requests in flight of all its
// queues together: its credits are taken with each queue's own (credit.Both)
// before the claim loop claims, so a saturated pool leaves requests in the
// broker, in deadline order, instead of claiming and refusing them. Its gate,
// when it has one, decides per request after the queue's gate; a pool gate
// whose budget falls to 0 closes the pool's credits (upstream refuses every
// request then), and reopens them when it rises.

// Pool is one worker pool of the pipeline.
type Pool struct {
	// ID names the pool; queues name it in Queue.WorkerPool.
	ID string
	// Workers is the most requests of the pool's queues in flight at once.
	Workers int
	// Gate is the refresh loop of the pool's gate (nil: none).
	Gate *gate.Refresher

	credits  *credit.Pool // taken at claim (random-robin policy), through shared
	shared   *credit.Shared
	lanes    *lanes        // taken after the queue's gate (tier-priority policy)
	admitter gate.Admitter // Gate's per-request hook (nil: none)
	metrics  *metrics.Queue
	freed    *waker
}

// waker wakes every waiter at once: C returns a channel closed by the next
// Wake. Every request of a pool calls Wake when it ends, so Wake without
// waiters is one atomic load, no lock.
type waker struct {
	ch atomic.Pointer[chan struct{}]
}

// C returns the channel the next Wake closes.
func (w *waker) C() <-chan struct{} {
	for {
		if p := w.ch.Load(); p != nil {
			return *p
		}
		ch := make(chan struct{})
		if w.ch.CompareAndSwap(nil, &ch) {
			return ch
		}
	}
}

// Wake wakes the waiters of the current channel.
func (w *waker) Wake() {
	if w.ch.Load() == nil { // nobody waits: a read, no write to a shared line
		return
	}
	if p := w.ch.Swap(nil); p != nil {
		close(*p)
	}
}

// gateAdmitter returns r's gate's per-request decision, if it has one.
func gateAdmitter(r *gate.Refresher) (gate.Admitter, bool) {
	if r == nil {
		return nil, false
	}
	a, ok := r.Gate().(gate.Admitter)
	return a, ok
}

// poolFollower makes a pool's credits follow its gate as upstream's pool
// gate acts: open while the budget is above 0, closed at 0.
type poolFollower struct {
	credits *credit.Pool
	lanes   *lanes // nil without the tier-priority policy
	freed   *waker
}

// SetBudget opens or closes the pool and wakes its waiters.
func (f poolFollower) SetBudget(b float64) {
	if b > 0 {
		f.credits.SetBudget(1)
	} else {
		f.credits.SetBudget(0)
	}
	if f.lanes != nil {
		f.lanes.SetBudget(b)
	}
	f.freed.Wake()
}

// initPools builds the pools' credits and the metrics they export, and
// returns them by id.
func initPools(cfg *Config) (map[string]*Pool, error) {
	pools := map[string]*Pool{}
	for i := range cfg.Pools {
		p := cfg.Pools[i]
		switch {
		case p.ID == "":
			return nil, fmt.Errorf("pipeline: pool %d: empty id", i)
		case pools[p.ID] != nil:
			return nil, fmt.Errorf("pipeline: duplicate pool %q", p.ID)
		case p.Workers < 1:
			return nil, fmt.Errorf("pipeline: pool %q: %d workers < 1", p.ID, p.Workers)
		}
		p.credits = credit.NewPool(p.Workers, credit.Ramp{})
		p.shared = credit.NewShared(p.credits)
		p.freed = &waker{}
		if cfg.Priority != nil {
			p.lanes = newLanes(p.Workers, cfg.Priority)
		}
		p.metrics = cfg.Metrics.For(metrics.Labels{Pool: p.ID}) // upstream: pool gates count with empty queue labels
		switch adm, ok := gateAdmitter(p.Gate); {
		case ok:
			// A gate that decides per request owns the decision, budget
			// included (tier-priority-admission answers Wait or 429 while
			// saturated): the pool stays open, as upstream never reads a
			// pool gate's budget.
			p.admitter = adm
			p.credits.SetBudget(1)
		case p.Gate != nil:
			// A budget-only gate: upstream refuses every request while its
			// budget is 0; sluice stops claiming for the pool instead.
			p.Gate.Attach(poolFollower{p.credits, p.lanes, p.freed})
		default:
			p.credits.SetBudget(1)
		}
		cfg.Metrics.PoolWorkerLimit.WithLabelValues(p.ID).Set(float64(p.Workers))
		pools[p.ID] = &p
	}
	return pools, nil
}
