// Package constant is the gate that always reports the same budget: 1 (open)
// unless gate_params sets "budget".
package constant

import (
	"context"
	"fmt"

	"github.com/sluice-io/sluice/core/gate"
)

// Type is the gate's registry name.
const Type = "constant"

// Gate reports a fixed budget.
type Gate struct{ budget float64 }

var (
	_ gate.Gate      = (*Gate)(nil)
	_ gate.Describer = (*Gate)(nil)
)

// New returns a gate with the given budget, which must be in [0,1].
func New(budget float64) (*Gate, error) {
	if budget < 0 || budget > 1 || budget != budget {
		return nil, fmt.Errorf("budget %v outside [0,1]", budget)
	}
	return &Gate{budget: budget}, nil
}

// Factory builds the gate from gate_params: optional "budget" (default 1).
func Factory(p gate.Params, _ gate.Env) (gate.Gate, error) {
	b, err := p.Float("budget", 1)
	if err != nil {
		return nil, err
	}
	if err := p.Unused(); err != nil {
		return nil, err
	}
	return New(b)
}

// Budget returns the fixed budget.
func (g *Gate) Budget(ctx context.Context) (float64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	return g.budget, nil
}

// Describe says when the gate closes.
func (g *Gate) Describe() string {
	if g.budget == 0 {
		return "always closed (budget 0)"
	}
	return fmt.Sprintf("never (constant budget %g)", g.budget)
}
