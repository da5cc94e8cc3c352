package gate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/sluice-io/sluice/core/credit"
)

// RefresherConfig configures a Refresher.
type RefresherConfig struct {
	// Name identifies the gate in logs and metrics.
	Name string
	// Interval between budget queries (default 100ms, or the gate's own RefreshInterval).
	Interval time.Duration
	// Timeout bounds one query (default: the interval, at least 1s).
	Timeout time.Duration
	// Policy overrides the gate's failure policy (empty: the gate's PolicyReporter, else closed).
	Policy FailurePolicy
	// Logger receives the start-up line and one line per failure-state change.
	Logger *slog.Logger
	// Observe, when set, is called after every query with the budget in force
	// and the query's error (nil on success).
	Observe func(budget float64, err error)
	// OnClose, when set, runs once when Close has closed the gate: the
	// owner unregisters the gate's metrics there (see Env.Metrics).
	OnClose func()
}

// Refresher is the one loop that asks a gate for its budget and hands the
// answer to every queue's Credits that use the gate. It applies the failure
// policy, so a failing gate never leaves the budget undefined.
type Refresher struct {
	cfg  RefresherConfig
	gate Gate

	mu       sync.Mutex
	credits  []Follower
	budget   float64
	lastGood float64
	hasGood  bool
	failing  bool
	started  bool
	stop     context.CancelFunc
	done     chan struct{}
	closeErr error
	once     sync.Once
}

// NewRefresher returns a refresher for g; Start begins the loop.
func NewRefresher(g Gate, cfg RefresherConfig) *Refresher {
	if cfg.Interval <= 0 {
		if iv, ok := g.(Intervaler); ok && iv.RefreshInterval() > 0 {
			cfg.Interval = iv.RefreshInterval()
		} else {
			cfg.Interval = 100 * time.Millisecond
		}
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = max(cfg.Interval, time.Second)
	}
	if cfg.Policy == "" {
		cfg.Policy = PolicyOf(g)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Refresher{cfg: cfg, gate: g, done: make(chan struct{})}
}

// Name returns the gate's name in logs and metrics.
func (r *Refresher) Name() string { return r.cfg.Name }

// Gate returns the gate being refreshed.
func (r *Refresher) Gate() Gate { return r.gate }

// Follower is told each budget the refresher hands out (*credit.Pool is one).
type Follower interface {
	SetBudget(b float64)
}

var _ Follower = (*credit.Pool)(nil)

// MeasuredFollower is a Follower that also learns whether each budget was
// measured (the gate answered) or chosen for a failure (the failure policy,
// or the gate's own fallback). The refresher calls SetBudgetMeasured instead
// of SetBudget on it. The pipeline's evictor takes requests back only on a
// measured fall: a gate that cannot read its backend must not abort work
// already running.
type MeasuredFollower interface {
	Follower
	SetBudgetMeasured(b float64, measured bool)
}

// Attach makes c follow this gate's budget. Attach before Start, or c gets
// the budget at the next refresh.
func (r *Refresher) Attach(c Follower) {
	r.mu.Lock()
	r.credits = append(r.credits, c)
	has := r.started
	b := r.budget
	r.mu.Unlock()
	if has {
		c.SetBudget(b)
	}
}

// Detach stops c from following this gate's budget (a queue removed while
// the gate keeps serving others). c must be a value Attach was given; a c
// never attached is ignored.
func (r *Refresher) Detach(c Follower) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, x := range r.credits {
		if x == c {
			r.credits = append(r.credits[:i:i], r.credits[i+1:]...)
			return
		}
	}
}

// Budget returns the budget in force.
func (r *Refresher) Budget() float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.budget
}

// Start queries the gate once (so queues start with a real budget), logs
// where the gate closes, and starts the loop. It returns at once; the loop
// ends on Close or when ctx ends.
func (r *Refresher) Start(ctx context.Context) {
	desc := ""
	if d, ok := r.gate.(Describer); ok {
		desc = d.Describe()
	}
	r.refresh(ctx)
	r.cfg.Logger.Info("gate started", "gate", r.cfg.Name, "closes", desc,
		"on_failure", string(r.cfg.Policy), "refresh", r.cfg.Interval.String(), "budget", r.Budget())
	loopCtx, cancel := context.WithCancel(ctx)
	r.mu.Lock()
	r.stop = cancel
	r.mu.Unlock()
	go r.loop(loopCtx)
}

func (r *Refresher) loop(ctx context.Context) {
	defer close(r.done)
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.refresh(ctx)
		}
	}
}

func (r *Refresher) refresh(ctx context.Context) {
	qctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	b, err := r.gate.Budget(qctx)
	cancel()
	if err == nil && (math.IsNaN(b) || b < 0 || b > 1) {
		err = fmt.Errorf("budget %v outside [0,1]", b)
	}
	if err != nil && ctx.Err() != nil {
		return // shutting down: not a gate failure
	}
	var fb *FallbackError
	if errors.As(err, &fb) && !(fb.Budget >= 0 && fb.Budget <= 1) {
		fb = nil // an unusable fallback is an ordinary failure
	}
	r.mu.Lock()
	switch {
	case fb != nil:
		// The gate applied its own fallback: use it, but it is still a failure.
		r.budget = fb.Budget
		if !r.failing {
			r.failing = true
			r.cfg.Logger.Warn("gate query failing", "gate", r.cfg.Name, "policy", "gate fallback", "budget", fb.Budget, "err", fb.Err)
		}
	case err == nil:
		r.budget = b
		r.lastGood = b
		r.hasGood = true
		if r.failing {
			r.failing = false
			r.cfg.Logger.Info("gate recovered", "gate", r.cfg.Name, "budget", b)
		}
	default:
		if !r.failing {
			r.failing = true
			r.cfg.Logger.Warn("gate query failing", "gate", r.cfg.Name, "policy", string(r.cfg.Policy), "err", err)
		}
		r.budget = r.cfg.Policy.Fallback(r.lastGood, r.hasGood)
	}
	r.started = true
	budget := r.budget
	credits := r.credits
	r.mu.Unlock()
	for _, c := range credits {
		if m, ok := c.(MeasuredFollower); ok {
			m.SetBudgetMeasured(budget, err == nil)
			continue
		}
		c.SetBudget(budget)
	}
	if r.cfg.Observe != nil {
		r.cfg.Observe(budget, err)
	}
}

// Close stops the loop and closes the gate if it is an io.Closer. It is idempotent.
func (r *Refresher) Close() error {
	r.once.Do(func() {
		r.mu.Lock()
		stop := r.stop
		r.mu.Unlock()
		if stop != nil {
			stop()
			<-r.done
		}
		if c, ok := r.gate.(interface{ Close() error }); ok {
			if err := c.Close(); err != nil {
				r.closeErr = fmt.Errorf("close gate %s: %w", r.cfg.Name, err)
			}
		}
		if r.cfg.OnClose != nil {
			r.cfg.OnClose()
		}
	})
	return r.closeErr
}

// ErrGateClosed may be returned by gates used after Close.
var ErrGateClosed = errors.New("gate closed")
