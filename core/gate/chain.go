package gate

import (
	"context"
	"errors"
	"sync"

	"github.com/sluice-io/sluice/core/wire"
)

// Chain asks admitters in order, as upstream's gate chain: the first error
// or decision other than Admit is returned as it is, after what the earlier
// members reserved was given back (in reverse order); when all admit, the
// decision is Admit with one Release giving back every reservation, in
// reverse order of acquisition. Labels members set are kept either way.
func Chain(ctx context.Context, req *wire.Request, admitters ...Admitter) (Decision, error) {
	var releases []func()
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
	}
	return Decision{Verdict: Admit, Release: JoinReleases(releases...)}, nil
}

// JoinReleases returns one release running fs in reverse order, at most
// once however often it is called; nil when there is nothing to release.
func JoinReleases(fs ...func()) func() {
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
// otherwise. Budget is asked each time (gates cache their sources).
type BudgetAdmitter struct{ Gate Gate }

// Admit defers while the budget is 0; a failed budget query is an error.
func (b BudgetAdmitter) Admit(ctx context.Context, _ *wire.Request) (Decision, error) {
	v, err := b.Gate.Budget(ctx)
	if err != nil {
		var fb *FallbackError
		if !errors.As(err, &fb) {
			return Decision{}, err
		}
		v = fb.Budget
	}
	if v <= 0 {
		return Decision{Verdict: Defer, Reason: "gate closed"}, nil
	}
	return Admitted, nil
}

// AdmitterOf returns g's per-request decision: g itself when it decides per
// request (looking through wrappers), else its BudgetAdmitter.
func AdmitterOf(g Gate) Admitter {
	if a, ok := g.(Admitter); ok {
		return a
	}
	return BudgetAdmitter{Gate: g}
}
