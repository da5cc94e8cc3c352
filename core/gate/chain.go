package gate

import (
	"context"
	"errors"
	"slices"
	"sync"

	"github.com/sluice-io/sluice/core/wire"
)

// Chain asks admitters in order, as upstream's gate chain: the first error
// or decision other than Admit is returned as it is, after what the earlier
// members reserved was given back (in reverse order); when all admit, the
// decision is Admit with one Release giving back every reservation, in
// reverse order of acquisition, and one Observe handing the gateway's
// answer to every member that observes (JoinObservers). Labels members set
// are kept either way.
func Chain(ctx context.Context, req *wire.Request, admitters ...Admitter) (Decision, error) {
	var releases []func()
	var observers []func(Feedback)
	pod := ""
	for _, a := range admitters {
		d, err := a.Admit(ctx, req)
		if err != nil || d.Verdict != Admit {
			if d.Release != nil { // a member broke the contract; nothing may leak
				releases = append(releases, d.Release)
			}
			runReverse(releases)
			d.Release = nil
			return d, err
		}
		if d.Release != nil {
			releases = append(releases, d.Release)
		}
		if d.Observe != nil {
			observers = append(observers, d.Observe)
		}
		if pod == "" {
			pod = d.Pod // the first member that places the request decides
		}
	}
	return Decision{Verdict: Admit, Release: JoinReleases(releases...), Observe: JoinObservers(observers...), Pod: pod}, nil
}

// JoinReleases returns one release running fs in reverse order, at most
// once however often it is called; nil when there is nothing to release.
// A nil member holds nothing and is skipped.
func JoinReleases(fs ...func()) func() {
	isNil := func(f func()) bool { return f == nil }
	if slices.ContainsFunc(fs, isNil) {
		fs = slices.DeleteFunc(slices.Clone(fs), isNil) // fs may be the caller's slice
	}
	switch len(fs) {
	case 0:
		return nil
	case 1:
		return sync.OnceFunc(fs[0])
	}
	return sync.OnceFunc(func() { runReverse(fs) })
}

func runReverse(fs []func()) {
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
}

// BudgetAdmitter is upstream's adapter for a gate without a per-request
// decision: it defers a request while the gate's budget is 0 and admits it
// otherwise. Budget is asked each time (gates cache their sources); a failed
// query counts as the gate's failure policy says (as the refresh loop
// counts it), so a gate configured to fail open keeps admitting.
type BudgetAdmitter struct {
	gate   Gate
	policy FailurePolicy

	mu      sync.Mutex
	last    float64
	hasLast bool
}

// NewBudgetAdmitter returns the adapter of g, with g's failure policy.
func NewBudgetAdmitter(g Gate) *BudgetAdmitter {
	return &BudgetAdmitter{gate: g, policy: PolicyOf(g)}
}

// Admit defers while the budget is 0.
func (b *BudgetAdmitter) Admit(ctx context.Context, _ *wire.Request) (Decision, error) {
	v, err := b.gate.Budget(ctx)
	var fb *FallbackError
	switch {
	case err == nil && v >= 0 && v <= 1:
		b.mu.Lock()
		b.last, b.hasLast = v, true
		b.mu.Unlock()
	case errors.As(err, &fb) && fb.Budget >= 0 && fb.Budget <= 1:
		v = fb.Budget
	case ctx.Err() != nil:
		return Decision{}, err // the request's own deadline, not the gate's failure
	default:
		b.mu.Lock()
		v = b.policy.Fallback(b.last, b.hasLast)
		b.mu.Unlock()
	}
	if v <= 0 {
		return Decision{Verdict: Defer, Reason: "gate closed"}, nil
	}
	return Admitted, nil
}

// AdmitterOf returns g's per-request decision: g itself when it decides per
// request (looking through wrappers), else a BudgetAdmitter.
func AdmitterOf(g Gate) Admitter {
	if a, ok := g.(Admitter); ok {
		return a
	}
	return NewBudgetAdmitter(g)
}
