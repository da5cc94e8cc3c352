// Package waitonrefuse is the gate of type "wait-on-refuse": it wraps one
// inner gate and turns the inner gate's Defer into Wait, so a request the
// inner gate refuses stays in flight (its credit held) and is asked again
// when capacity frees, instead of being re-queued.
//
//	{"gate_type":"wait-on-refuse","gate_params":{"gate":
//	  {"gate_type":"local-max-concurrency","gate_params":{"limit":50}}}}
//
// "gate" may also be a JSON string holding that object, as upstream's own
// configs write it. The inner gate is built through the same registry, so
// any type nests, to any depth.
//
// Budget is the inner gate's budget. Admit asks the inner gate's per-request
// decision (gate.AdmitterOf: its own Admit, or, for a budget-only gate,
// Defer while its budget is 0): Defer becomes Wait (keeping its Delay and
// reason), an error is wrapped, and every other decision — Admit with its
// Release (made safe to call twice) and its Observe, Reject with its
// Result — passes through unchanged.
//
// Upstream's Wait only acts in a pool gate (at queue level it dispatches);
// sluice's pipeline acts on Wait wherever the gate runs.
package waitonrefuse

import (
	"context"
	"errors"
	"fmt"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/wire"
)

// Type is the gate's registry name.
const Type = "wait-on-refuse"

// Gate waits where its inner gate refuses. It is safe for concurrent use
// when the inner gate is.
type Gate struct {
	gate.Wrapper
	adm gate.Admitter
}

var (
	_ gate.Gate           = (*Gate)(nil)
	_ gate.Admitter       = (*Gate)(nil)
	_ gate.Describer      = (*Gate)(nil)
	_ gate.Intervaler     = (*Gate)(nil)
	_ gate.PolicyReporter = (*Gate)(nil)
)

// New wraps inner (named innerType in messages); it takes ownership of inner
// (Close closes it).
func New(inner gate.Gate, innerType string) (*Gate, error) {
	if inner == nil {
		return nil, errors.New("wait-on-refuse: no inner gate")
	}
	return &Gate{Wrapper: gate.Wrapper{Inner: inner, InnerType: innerType}, adm: gate.AdmitterOf(inner)}, nil
}

// Factory builds the gate from gate_params.gate (required): one gate
// configuration, an object or a JSON string holding one, built with env.Build.
func Factory(p gate.Params, env gate.Env) (gate.Gate, error) {
	typ, params, err := p.Gate("gate")
	if err != nil {
		return nil, err
	}
	if err := p.Unused(); err != nil {
		return nil, err
	}
	if env.Build == nil {
		return nil, errors.New("wait-on-refuse: no builder for the inner gate")
	}
	inner, err := env.Build(typ, params)
	if err != nil {
		return nil, fmt.Errorf("gate_params.gate: %w", err)
	}
	return New(inner, typ)
}

// Admit asks the inner gate; its Defer becomes Wait.
func (g *Gate) Admit(ctx context.Context, req *wire.Request) (gate.Decision, error) {
	d, err := g.adm.Admit(ctx, req)
	if err != nil {
		giveBack(&d)
		return gate.Decision{}, fmt.Errorf("wait-on-refuse: inner gate %s: %w", g.InnerType, err)
	}
	if d.Verdict == gate.Defer {
		giveBack(&d) // a refusal holds nothing; nothing may leak if it did
		d.Verdict = gate.Wait
		if d.Reason == "" {
			d.Reason = "inner gate " + g.InnerType + " refused"
		}
	}
	if d.Release != nil {
		d.Release = gate.JoinReleases(d.Release) // given back at most once
	}
	return d, nil
}

// giveBack runs and clears a release that came with a decision that does
// not admit.
func giveBack(d *gate.Decision) {
	if d.Release != nil {
		d.Release()
		d.Release = nil
	}
}

// Describe says when the gate waits.
func (g *Gate) Describe() string {
	inner := g.InnerDescription()
	return fmt.Sprintf("waits (instead of deferring) when its inner %s gate refuses: %s", g.InnerType, inner)
}
