// Package tieradmission is the gate of type "tier-priority-admission": a
// three-way decision from an inner saturation gate, the request's tier and
// its classification (set earlier by a quota gate: redis-quota in
// classifying mode, or an earlier member of a composite), as upstream's.
//
//	{"gate_type":"tier-priority-admission","gate_params":{
//	  "saturation_gate":"prometheus-saturation",
//	  "saturation_gate_params":{"inference_pool":"pool-a","threshold":0.8},
//	  "tier_label":"tier"}}
//
// Budget is the inner gate's budget. Admit asks the inner gate's per-request
// decision (gate.AdmitterOf: its own Admit, or, for a budget-only gate,
// Defer while its budget is 0):
//
//   - an error: the error "saturation gate failed: …";
//   - anything but Defer (the pool has room): Admit, carrying whatever the
//     inner gate reserved and its Observe (an inner Wait or Reject also
//     becomes Admit, as upstream);
//   - Defer (saturated) and classification reserved: Wait;
//   - saturated, tier interactive and classification overflow: Reject with
//     the result {"error": "Too Many Requests", "code": 429} (no status code,
//     no error code; the pipeline sets its id and metadata);
//   - otherwise saturated: Defer (unclassified requests and every other tier).
package tieradmission

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/wire"
)

// Type is the gate's registry name.
const Type = "tier-priority-admission"

// TooManyRequests is the payload of the result of a rejected interactive
// overflow request, byte for byte upstream's.
const TooManyRequests = `{"error": "Too Many Requests", "code": 429}`

// Config configures a Gate.
type Config struct {
	// TierLabel is the request label holding the tier (default wire.DefaultTierLabel).
	TierLabel string
}

func (c *Config) setDefaults() {
	if c.TierLabel == "" {
		c.TierLabel = wire.DefaultTierLabel
	}
}

// Gate decides by tier and classification while its inner gate is
// saturated. It is safe for concurrent use when the inner gate is.
type Gate struct {
	cfg Config
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

// New wraps the saturation gate inner (named innerType in messages); it
// takes ownership of inner (Close closes it).
func New(cfg Config, inner gate.Gate, innerType string) (*Gate, error) {
	if inner == nil {
		return nil, errors.New("tier-priority-admission: no saturation gate")
	}
	cfg.setDefaults()
	return &Gate{cfg: cfg, Wrapper: gate.Wrapper{Inner: inner, InnerType: innerType}, adm: gate.AdmitterOf(inner)}, nil
}

// Factory builds the gate from gate_params: saturation_gate (a gate type,
// required), saturation_gate_params (an object or a JSON string holding
// one), tier_label (default "tier"). The saturation gate is built with
// env.Build.
func Factory(p gate.Params, env gate.Env) (gate.Gate, error) {
	typ := p.String("saturation_gate", "")
	if typ == "" {
		return nil, errors.New("gate_params.saturation_gate is required: the inner gate's type")
	}
	params, err := objectParams(p, "saturation_gate_params")
	if err != nil {
		return nil, err
	}
	cfg := Config{TierLabel: p.String("tier_label", wire.DefaultTierLabel)}
	if err := p.Unused(); err != nil {
		return nil, err
	}
	if env.Build == nil {
		return nil, errors.New("tier-priority-admission: no builder for the saturation gate")
	}
	inner, err := env.Build(typ, params)
	if err != nil {
		return nil, fmt.Errorf("gate_params.saturation_gate: %w", err)
	}
	return New(cfg, inner, typ)
}

// objectParams reads key as a gate's parameters: an object, or a JSON
// string holding one (upstream's object reader); absent reads as none.
func objectParams(p gate.Params, key string) (gate.Params, error) {
	raw := p.Raw(key)
	if raw == nil {
		if p.Has(key) {
			return gate.Params{}, fmt.Errorf("gate_params.%s: want an object or a JSON string holding one", key)
		}
		return gate.ParseParams(nil)
	}
	var obj map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(raw))
	if err := dec.Decode(&obj); err != nil {
		return gate.Params{}, fmt.Errorf("gate_params.%s: want an object: %w", key, err)
	}
	params, err := gate.ParseParams(obj)
	if err != nil {
		return gate.Params{}, fmt.Errorf("gate_params.%s: %w", key, err)
	}
	return params, nil
}

// Admit decides by the saturation gate, then by classification and tier.
func (g *Gate) Admit(ctx context.Context, req *wire.Request) (gate.Decision, error) {
	d, err := g.adm.Admit(ctx, req)
	if err != nil {
		giveBack(&d)
		return gate.Decision{}, fmt.Errorf("saturation gate failed: %w", err)
	}
	if d.Verdict != gate.Defer {
		// The pool has room. Whatever the inner gate reserved goes with the
		// admission (an inner Wait or Reject should hold nothing; if one
		// did, the pipeline still gives it back), given back at most once.
		return gate.Decision{Verdict: gate.Admit, Release: gate.JoinReleases(d.Release), Observe: d.Observe}, nil
	}
	giveBack(&d)
	class := req.Classification()
	switch {
	case class == wire.ClassReserved:
		return gate.Decision{Verdict: gate.Wait, Delay: d.Delay, Reason: "saturated; reserved request waits"}, nil
	case class == wire.ClassOverflow && req.Label(g.cfg.TierLabel) == wire.TierInteractive:
		return gate.Decision{
			Verdict: gate.Reject,
			Reason:  "saturated; interactive overflow request rejected (429)",
			Result:  &wire.Result{ID: req.ID, Payload: TooManyRequests},
		}, nil
	}
	return gate.Decision{Verdict: gate.Defer, Delay: d.Delay, Reason: "saturated: " + reason(d, class)}, nil
}

func reason(d gate.Decision, class string) string {
	r := d.Reason
	if r == "" {
		r = "saturation gate refused"
	}
	if class == "" {
		return r + " (unclassified)"
	}
	return r + " (" + class + ")"
}

// giveBack runs and clears a release that came with a decision that does
// not admit.
func giveBack(d *gate.Decision) {
	if d.Release != nil {
		d.Release()
		d.Release = nil
	}
}

// Describe says how the gate decides.
func (g *Gate) Describe() string {
	inner := g.InnerDescription()
	return fmt.Sprintf("when its %s saturation gate refuses (%s): reserved requests wait, %s=%s overflow requests get 429, others are deferred",
		g.InnerType, inner, g.cfg.TierLabel, wire.TierInteractive)
}
