package gate

import (
	"context"
	"time"
)

// Wrapper is embedded by a gate built around one inner gate (wait-on-refuse,
// tier-priority-admission): it forwards the budget, the refresh interval,
// the failure policy and Close to the inner gate, and unwraps to it, so
// ReadingsOf sees through the wrapper. The embedding gate adds
// its own Admit and Describe.
type Wrapper struct {
	// Inner is the wrapped gate.
	Inner Gate
	// InnerType is its gate_type, for descriptions.
	InnerType string
}

// Budget is the inner gate's.
func (w Wrapper) Budget(ctx context.Context) (float64, error) { return w.Inner.Budget(ctx) }

// RefreshInterval is the inner gate's.
func (w Wrapper) RefreshInterval() time.Duration { return IntervalOf(w.Inner) }

// FailurePolicy is the inner gate's.
func (w Wrapper) FailurePolicy() FailurePolicy { return PolicyOf(w.Inner) }

// Unwrap returns the inner gate.
func (w Wrapper) Unwrap() Gate { return w.Inner }

// Close closes the inner gate when it holds resources.
func (w Wrapper) Close() error {
	if c, ok := w.Inner.(interface{ Close() error }); ok {
		return c.Close()
	}
	return nil
}

// InnerDescription is the inner gate's Describe, or "(no description)".
func (w Wrapper) InnerDescription() string {
	if ds, ok := w.Inner.(Describer); ok {
		return ds.Describe()
	}
	return "(no description)"
}
