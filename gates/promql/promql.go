// Package promql is the gate of type "prometheus-query": any PromQL
// expression, used verbatim, whose first sample is the budget, as
// upstream's.
//
//	{"gate_type":"prometheus-query","gate_params":{"pool":"p",
//	  "query":"clamp(1 - inference_extension_flow_control_pool_saturation{inference_pool=\"p\"}/0.5, 0, 1)"}}
//
// With v the first sample (samples in label order) and threshold T = 0:
//
//	budget = 0 if v ≤ 0, else min(1, v)
//
// When the query fails, returns no sample, or its first sample is NaN or
// ±Inf, the gate uses the fallback budget (default 0: closed), clamped to
// [0,1], and reports the failure as a *gate.FallbackError. Setting
// failure_policy instead hands failures to the refresh loop's policy;
// setting both is an error.
package promql

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/gates/internal/promquery"
)

// Type is the gate's registry name.
const Type = "prometheus-query"

// Threshold is what the sample is compared with (upstream's T for this gate).
const Threshold = 0.0

// Config configures a Gate.
type Config struct {
	// Query is the PromQL expression, used verbatim (required).
	Query string
	// Pool names the inference pool the query is about; it only labels the
	// gate's readings (the inference_pool label of the gate gauges).
	Pool string
	// Fallback is the budget used on failure, clamped to [0,1]; nil hands
	// failures to the refresh loop's policy.
	Fallback *float64
}

func (c *Config) setDefaults() {
	if c.Fallback != nil {
		f := clamp(*c.Fallback)
		c.Fallback = &f
	}
}

// Validate reports an unusable configuration, naming the parameter.
func (c Config) Validate() error {
	if c.Query == "" {
		return errors.New("gate_params.query is required: a PromQL expression")
	}
	if c.Fallback != nil && math.IsNaN(*c.Fallback) {
		return errors.New("gate_params.fallback: NaN is not a budget")
	}
	return nil
}

// Gate reads its budget from a PromQL query. It is safe for concurrent use.
type Gate struct {
	cfg    Config
	client *promquery.Client

	readings gate.ReadingRecorder
}

var (
	_ gate.Gate      = (*Gate)(nil)
	_ gate.Describer = (*Gate)(nil)
	_ gate.Reader    = (*Gate)(nil)
)

// New returns the gate; it takes ownership of client (Close closes it).
func New(cfg Config, client *promquery.Client) (*Gate, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		_ = client.Close()
		return nil, err
	}
	return &Gate{cfg: cfg, client: client}, nil
}

// Factory builds the gate from gate_params: query (required), fallback
// (default 0), pool (alias inference_pool; descriptive), prometheus_url and
// cache_ttl (default --prometheus-url and --prometheus-cache-ttl).
func Factory(p gate.Params, env gate.Env) (gate.Gate, error) {
	cfg := Config{Query: p.String("query", "")}
	var err error
	if cfg.Pool, err = pool(p); err != nil {
		return nil, err
	}
	zero := 0.0 // upstream's default fallback: closed
	if cfg.Fallback, err = promquery.Fallback(p, &zero); err != nil {
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return promquery.Finish(p, env, func(c *promquery.Client) (*Gate, error) { return New(cfg, c) })
}

// pool reads gate_params.pool or its alias inference_pool (optional).
func pool(p gate.Params) (string, error) {
	a, b := p.String("pool", ""), p.String("inference_pool", "")
	if a != "" && b != "" && a != b {
		return "", fmt.Errorf("gate_params.pool %q and inference_pool %q disagree", a, b)
	}
	if a != "" {
		return a, nil
	}
	return b, nil
}

// Budget runs the query and returns its first sample, clamped to [0,1].
func (g *Gate) Budget(ctx context.Context) (float64, error) {
	vals, err := g.client.Values(ctx, g.cfg.Query)
	if err == nil {
		if v := vals[0]; !math.IsNaN(v) && !math.IsInf(v, 0) {
			g.readings.Record(g.cfg.Pool, v, Threshold)
			return Budget(v), nil
		}
		err = fmt.Errorf("query %s: first sample is %v: %w", g.cfg.Query, vals[0], promquery.ErrNoData)
	}
	g.readings.Fail(g.cfg.Pool)
	if g.cfg.Fallback != nil {
		return 0, &gate.FallbackError{Budget: *g.cfg.Fallback, Err: err}
	}
	return 0, err
}

// Budget is the gate's formula: 0 when v ≤ 0 (or NaN), else min(1, v).
func Budget(v float64) float64 {
	if math.IsNaN(v) || v <= Threshold {
		return 0
	}
	return min(1, v-Threshold)
}

func clamp(f float64) float64 {
	if math.IsNaN(f) {
		return f
	}
	return min(1, max(0, f))
}

// Describe says when the gate closes.
func (g *Gate) Describe() string {
	s := fmt.Sprintf("when %s ≤ 0 (budget = its first sample, clamped to [0,1])", g.cfg.Query)
	if g.cfg.Fallback != nil {
		s += fmt.Sprintf("; on a failed query, no sample or NaN: budget %g", *g.cfg.Fallback)
	}
	return s
}

// Readings returns the last sample against the threshold 0.
func (g *Gate) Readings() []gate.Reading { return g.readings.Readings() }

// Close releases the Prometheus client; it is idempotent.
func (g *Gate) Close() error { return g.client.Close() }
