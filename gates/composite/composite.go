// Package composite is the gate of type "composite": the minimum of its
// inner gates' budgets, so that batch traffic yields to whichever signal is
// tightest (an operator's Redis key and the pool's saturation, say).
//
//	{"gate_type":"composite","gate_params":{"gates":[
//	  {"gate_type":"redis","gate_params":{"budget_key":"batch-budget"}},
//	  {"gate_type":"prometheus-saturation","gate_params":{"inference_pool":"pool-a"}}]}}
//
// Each inner gate keeps its own failure policy (and fallback): when one
// fails, the composite uses what that policy says for it (open 1, closed 0,
// keep-last its last good budget) and reports the failure as a
// *gate.FallbackError, so it is counted and logged. failure_policy on the
// composite itself is therefore an error: set it on the inner gates.
//
// gates is an array of gate configurations or, as upstream's own configs
// write it, a JSON string holding that array; each inner gate is built
// through the same registry (env.Build), so any type nests in either form,
// to any depth.
//
// Per request, the composite is an Admitter only when at least one inner
// gate is, and then only those inner gates take part: they are asked in
// order under gate.Chain (upstream's chain rule): the first error or
// decision other than Admit is returned as it is, after every reservation
// the earlier members made was given back; when all admit, one Release
// gives back every reservation, in reverse order. Inner gates that only
// report a budget act through the composite's budget, which scales the
// credits of the queue (or worker pool) using it; they are not asked again
// per request. Upstream applies those per message too (as "budget ≤ 0:
// refuse"), which differs only while the credits lag the budget by a
// refresh interval.
package composite

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/wire"
)

// Type is the gate's registry name.
const Type = "composite"

// Spec is one inner gate in gate_params.gates.
type Spec = gate.GateSpec

// Gate is the minimum of its inner gates. It is safe for concurrent use.
type Gate struct {
	inner    []gate.Gate
	policies []gate.FailurePolicy
	names    []string

	mu      sync.Mutex
	last    []float64
	hasLast []bool

	closeOnce sync.Once
	closeErr  error
}

// admitter is a Gate whose inner gates include per-request ones.
type admitter struct {
	*Gate
	adms []gate.Admitter
}

var (
	_ gate.Gate       = (*Gate)(nil)
	_ gate.Describer  = (*Gate)(nil)
	_ gate.Intervaler = (*Gate)(nil)
	_ gate.Validator  = (*Gate)(nil)
	_ gate.Admitter   = (*admitter)(nil)
)

// New returns the composite of inner (at least one); names label them in
// messages. It takes ownership of the inner gates (Close closes them).
func New(inner []gate.Gate, names []string) (gate.Gate, error) {
	if len(inner) == 0 {
		return nil, errors.New("a composite gate needs at least one inner gate")
	}
	g := &Gate{inner: inner, last: make([]float64, len(inner)), hasLast: make([]bool, len(inner))}
	var adms []gate.Admitter
	for i, in := range inner {
		g.policies = append(g.policies, gate.PolicyOf(in))
		name := fmt.Sprintf("gates[%d]", i)
		if i < len(names) && names[i] != "" {
			name += " (" + names[i] + ")"
		}
		g.names = append(g.names, name)
		if a, ok := in.(gate.Admitter); ok {
			adms = append(adms, a)
		}
	}
	if len(adms) > 0 {
		return &admitter{Gate: g, adms: adms}, nil
	}
	return g, nil
}

// Factory builds the composite from gate_params.gates, a JSON array of
// {"gate_type":..., "gate_params":{...}} or a JSON string holding one,
// building each with env.Build.
func Factory(p gate.Params, env gate.Env) (gate.Gate, error) {
	if p.Has(gate.ParamFailurePolicy) {
		return nil, errors.New("gate_params.failure_policy: set it on the inner gates; a composite applies theirs")
	}
	raw := p.Raw("gates")
	if err := p.Unused(); err != nil {
		return nil, err
	}
	if raw == nil {
		return nil, errors.New("gate_params.gates is required: a list of {\"gate_type\":...,\"gate_params\":{...}}")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var specs []Spec
	if err := dec.Decode(&specs); err != nil {
		return nil, fmt.Errorf("gate_params.gates: %w", err)
	}
	if env.Build == nil {
		return nil, errors.New("composite gate: no builder for inner gates")
	}
	var inner []gate.Gate
	var names []string
	fail := func(err error) (gate.Gate, error) {
		for _, g := range inner {
			closeGate(g)
		}
		return nil, err
	}
	for i, s := range specs {
		if s.GateType == "" {
			return fail(fmt.Errorf("gate_params.gates[%d]: gate_type is required", i))
		}
		params, err := gate.ParseParams(s.GateParams)
		if err != nil {
			return fail(fmt.Errorf("gate_params.gates[%d]: %w", i, err))
		}
		g, err := env.Build(s.GateType, params)
		if err != nil {
			return fail(fmt.Errorf("gate_params.gates[%d]: %w", i, err))
		}
		inner = append(inner, g)
		names = append(names, s.GateType)
	}
	g, err := New(inner, names)
	if err != nil {
		return fail(err)
	}
	return g, nil
}

// Validate returns what every inner gate's Validator reports, each named.
func (g *Gate) Validate() error {
	var errs []error
	for i, in := range g.inner {
		if err := gate.ValidateGate(in); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", g.names[i], err))
		}
	}
	return errors.Join(errs...)
}

// Readings returns the readings of the inner gates that read a metric.
func (g *Gate) Readings() []gate.Reading {
	var out []gate.Reading
	for _, in := range g.inner {
		out = append(out, gate.ReadingsOf(in)...)
	}
	return out
}

// Budget returns the smallest inner budget. A failing inner gate counts
// with what its failure policy says, and the failure is returned as a
// *gate.FallbackError carrying the resulting minimum.
func (g *Gate) Budget(ctx context.Context) (float64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	budget := 1.0
	var errs []error
	for i, in := range g.inner {
		b, err := in.Budget(ctx)
		var fb *gate.FallbackError
		switch {
		case errors.As(err, &fb) && fb.Budget >= 0 && fb.Budget <= 1:
			b = fb.Budget
			errs = append(errs, fmt.Errorf("%s: %w", g.names[i], err))
		case err == nil && b >= 0 && b <= 1:
			g.mu.Lock()
			g.last[i], g.hasLast[i] = b, true
			g.mu.Unlock()
		default:
			if err == nil {
				err = fmt.Errorf("budget %v outside [0,1]", b)
			}
			g.mu.Lock()
			b = g.policies[i].Fallback(g.last[i], g.hasLast[i])
			g.mu.Unlock()
			errs = append(errs, fmt.Errorf("%s (%s): %w", g.names[i], g.policies[i], err))
		}
		budget = min(budget, b)
	}
	if len(errs) > 0 {
		return 0, &gate.FallbackError{Budget: budget, Err: errors.Join(errs...)}
	}
	return budget, nil
}

// Describe lists where each inner gate closes.
func (g *Gate) Describe() string {
	parts := make([]string, len(g.inner))
	for i, in := range g.inner {
		d := "(no description)"
		if ds, ok := in.(gate.Describer); ok {
			d = ds.Describe()
		}
		parts[i] = fmt.Sprintf("%s %s, on failure %s", g.names[i], d, g.policies[i])
	}
	return "when any inner gate closes (budget = min): " + strings.Join(parts, "; ")
}

// RefreshInterval is the shortest interval an inner gate asks for.
func (g *Gate) RefreshInterval() time.Duration {
	var iv time.Duration
	for _, in := range g.inner {
		if d := gate.IntervalOf(in); d > 0 && (iv == 0 || d < iv) {
			iv = d
		}
	}
	return iv
}

// Close closes every inner gate; it is idempotent.
func (g *Gate) Close() error {
	g.closeOnce.Do(func() {
		var errs []error
		for _, in := range g.inner {
			errs = append(errs, closeGate(in))
		}
		g.closeErr = errors.Join(errs...)
	})
	return g.closeErr
}

func closeGate(g gate.Gate) error {
	if c, ok := g.(interface{ Close() error }); ok {
		return c.Close()
	}
	return nil
}

// Admit asks the per-request inner gates in order, all or nothing
// (gate.Chain): the first error or decision other than Admit decides, and
// what the earlier ones reserved is given back; when all admit, the
// decision's Release gives back every reservation.
func (a *admitter) Admit(ctx context.Context, req *wire.Request) (gate.Decision, error) {
	return gate.Chain(ctx, req, a.adms...)
}
