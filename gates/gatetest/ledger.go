package gatetest

import (
	"context"
	"sync"
	"time"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/wire"
)

// Ledger is a scripted per-request gate for testing gates that wrap others
// (composite, wait-on-refuse, tier-priority-admission): it answers every
// Admit with the decision and error a test set, reserves a slot with each
// answer that carries a Release, and counts what was given back, so a test
// can check that every reservation is given back exactly once. It is safe
// for concurrent use.
type Ledger struct {
	mu       sync.Mutex
	verdict  gate.Verdict
	delay    time.Duration
	reason   string
	result   *wire.Result
	err      error
	budget   float64
	leaky    bool
	held     int
	acquired int
	extra    int
	asked    int
}

// NewLedger returns a ledger that admits every request (with a Release)
// and reports budget 1.
func NewLedger() *Ledger { return &Ledger{budget: 1} }

// Set makes later Admit calls answer verdict (with the given delay and
// reason) and err. An Admit answer carries a Release; see Leaky for the others.
func (l *Ledger) Set(verdict gate.Verdict, delay time.Duration, reason string, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.verdict, l.delay, l.reason, l.err = verdict, delay, reason, err
}

// SetResult makes later Reject answers carry r.
func (l *Ledger) SetResult(r *wire.Result) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.result = r
}

// SetBudget sets what Budget reports.
func (l *Ledger) SetBudget(b float64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.budget = b
}

// Leaky makes every answer, errors and verdicts other than Admit included,
// carry a Release: a gate breaking the contract, which a gate wrapping it
// must still not leak.
func (l *Ledger) Leaky(on bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.leaky = on
}

// Held is how many reservations are not given back.
func (l *Ledger) Held() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.held
}

// Acquired is how many reservations were made.
func (l *Ledger) Acquired() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.acquired
}

// ExtraReleases is how many Release calls came after the first for the
// same reservation (a Ledger's Release is deliberately not idempotent, so
// that a wrapper calling it twice shows).
func (l *Ledger) ExtraReleases() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.extra
}

// Asked is how many times Admit was called.
func (l *Ledger) Asked() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.asked
}

// Factory returns a gate factory that hands out this ledger (for a test
// registry); it takes no parameters.
func (l *Ledger) Factory() gate.Factory {
	return func(p gate.Params, _ gate.Env) (gate.Gate, error) {
		if err := p.Unused(); err != nil {
			return nil, err
		}
		return l, nil
	}
}

// Budget reports the budget set with SetBudget.
func (l *Ledger) Budget(ctx context.Context) (float64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.budget, nil
}

// Admit answers as set.
func (l *Ledger) Admit(context.Context, *wire.Request) (gate.Decision, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.asked++
	d := gate.Decision{Verdict: l.verdict, Delay: l.delay, Reason: l.reason}
	if d.Verdict == gate.Reject {
		d.Result = l.result
	}
	if (d.Verdict == gate.Admit && l.err == nil) || l.leaky {
		l.held++
		l.acquired++
		released := false
		d.Release = func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			if released {
				l.extra++
				return
			}
			released = true
			l.held--
		}
	}
	return d, l.err
}

var (
	_ gate.Gate     = (*Ledger)(nil)
	_ gate.Admitter = (*Ledger)(nil)
)
