package gate

import (
	"context"
	"fmt"
	"time"

	"github.com/sluice-io/sluice/core/wire"
)

// Parameters every gate accepts, handled by Registry.New before the gate's
// factory runs (a factory may look at them with Params.Has):
const (
	// ParamFailurePolicy overrides the gate's failure policy: open, closed or keep-last.
	ParamFailurePolicy = "failure_policy"
	// ParamRefreshInterval overrides how often the gate's budget is refreshed
	// ("250ms", or a number of seconds).
	ParamRefreshInterval = "refresh_interval"
)

// FallbackError is returned by a gate that could not query its source but
// knows what budget to use instead (a configured fallback value, or a
// composite that applied its inner gates' policies). The Refresher uses
// Budget, bypassing its failure policy, and still counts and logs the failure.
type FallbackError struct {
	// Budget is the budget to use, in [0,1].
	Budget float64
	// Err is what failed.
	Err error
}

// Error describes the failure and the budget used instead.
func (e *FallbackError) Error() string {
	return fmt.Sprintf("%v (using fallback budget %g)", e.Err, e.Budget)
}

// Unwrap returns the failure.
func (e *FallbackError) Unwrap() error { return e.Err }

// Fallback returns the budget a failed query stands for under policy p:
// 1 for open, 0 for closed, last for keep-last (0 when hasLast is false).
func (p FailurePolicy) Fallback(last float64, hasLast bool) float64 {
	switch p {
	case FailOpen:
		return 1
	case FailKeepLast:
		if hasLast {
			return last
		}
	}
	return 0
}

// PolicyOf returns g's failure policy: its PolicyReporter's answer, else closed.
func PolicyOf(g Gate) FailurePolicy {
	if pr, ok := g.(PolicyReporter); ok && pr.FailurePolicy() != "" {
		return pr.FailurePolicy()
	}
	return FailClosed
}

// IntervalOf returns g's refresh interval, or 0 when it has no preference.
func IntervalOf(g Gate) time.Duration {
	if iv, ok := g.(Intervaler); ok {
		return iv.RefreshInterval()
	}
	return 0
}

// genericParams reads the parameters every gate accepts.
func genericParams(p Params) (FailurePolicy, time.Duration, error) {
	var policy FailurePolicy
	if s := p.String(ParamFailurePolicy, ""); s != "" {
		var err error
		if policy, err = ParseFailurePolicy(s); err != nil {
			return "", 0, fmt.Errorf("gate_params.%s: %w", ParamFailurePolicy, err)
		}
	}
	iv, err := p.Duration(ParamRefreshInterval, 0)
	if err != nil {
		return "", 0, err
	}
	if p.Has(ParamRefreshInterval) && iv < time.Millisecond {
		return "", 0, fmt.Errorf("gate_params.%s: %v is below 1ms", ParamRefreshInterval, iv)
	}
	return policy, iv, nil
}

// configured wraps a gate whose generic parameters override its own
// failure policy or refresh interval. It forwards every optional interface
// of the gate it wraps except Admitter (see configuredAdmitter).
type configured struct {
	Gate
	policy   FailurePolicy
	interval time.Duration
}

// configuredAdmitter is configured for a gate that also admits per request.
type configuredAdmitter struct {
	*configured
	adm Admitter
}

var (
	_ PolicyReporter = (*configured)(nil)
	_ Intervaler     = (*configured)(nil)
	_ Describer      = (*configured)(nil)
	_ Admitter       = (*configuredAdmitter)(nil)
)

// wrapConfigured applies the generic overrides to g (g itself when there are none).
func wrapConfigured(g Gate, policy FailurePolicy, interval time.Duration) Gate {
	if policy == "" && interval == 0 {
		return g
	}
	c := &configured{Gate: g, policy: policy, interval: interval}
	if a, ok := g.(Admitter); ok {
		return &configuredAdmitter{configured: c, adm: a}
	}
	return c
}

// FailurePolicy returns the configured policy, else the wrapped gate's.
func (c *configured) FailurePolicy() FailurePolicy {
	if c.policy != "" {
		return c.policy
	}
	return PolicyOf(c.Gate)
}

// RefreshInterval returns the configured interval, else the wrapped gate's.
func (c *configured) RefreshInterval() time.Duration {
	if c.interval > 0 {
		return c.interval
	}
	return IntervalOf(c.Gate)
}

// Describe forwards to the wrapped gate.
func (c *configured) Describe() string {
	if d, ok := c.Gate.(Describer); ok {
		return d.Describe()
	}
	return ""
}

// Close closes the wrapped gate when it holds resources.
func (c *configured) Close() error {
	if cl, ok := c.Gate.(interface{ Close() error }); ok {
		return cl.Close()
	}
	return nil
}

// Unwrap returns the wrapped gate.
func (c *configured) Unwrap() Gate { return c.Gate }

// Admit forwards to the wrapped gate.
func (c *configuredAdmitter) Admit(ctx context.Context, req *wire.Request) (Decision, error) {
	return c.adm.Admit(ctx, req)
}
