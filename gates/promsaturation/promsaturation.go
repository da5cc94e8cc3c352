// Package promsaturation is the gate of type "prometheus-saturation": it
// reads the flow-control saturation of an inference pool from Prometheus
// (the endpoint picker exports it) and stays open while it is below a
// threshold.
//
//	saturation = max over series of llm_d_epp_flow_control_pool_saturation{inference_pool="<pool>"[,namespace="<ns>"]}
//	budget     = threshold − saturation   when saturation < threshold, else 0
//
// The endpoint picker renamed the gauge (upstream v0.10 reads the new name
// only); where the new name has no sample, the gate reads the old one,
// inference_extension_flow_control_pool_saturation, and says so once in the
// log, so a pool whose endpoint picker is older keeps its gate.
//
// On a missing metric or a failed query the gate uses the fallback
// saturation (default 0, so the budget is the threshold: it fails open, as
// upstream does). Setting failure_policy instead hands failures to the
// refresh loop's policy (open, closed, keep-last); setting both is an error.
package promsaturation

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync/atomic"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/gates/internal/promquery"
)

// Type is the gate's registry name.
const Type = "prometheus-saturation"

// Metric is the saturation gauge the gate reads.
const Metric = "llm_d_epp_flow_control_pool_saturation"

// LegacyMetric is the gauge's name before the endpoint picker renamed it;
// it is read where Metric has no sample.
const LegacyMetric = "inference_extension_flow_control_pool_saturation"

// DefaultThreshold is the saturation at which the gate closes.
const DefaultThreshold = 0.8

// Config configures a Gate.
type Config struct {
	// Pool is the inference pool (required).
	Pool string
	// Namespace narrows the query to one namespace (optional).
	Namespace string
	// Threshold is where the gate closes, in (0,1] (default DefaultThreshold).
	Threshold float64
	// Fallback is the saturation assumed on failure; nil hands failures to
	// the refresh loop's policy.
	Fallback *float64
}

// Validate reports an unusable configuration.
func (c Config) Validate() error {
	var errs []error
	if c.Pool == "" {
		errs = append(errs, errors.New("inference_pool is required"))
	}
	if !(c.Threshold > 0 && c.Threshold <= 1) {
		errs = append(errs, fmt.Errorf("threshold %v outside (0,1]", c.Threshold))
	}
	if c.Fallback != nil && !(*c.Fallback >= 0 && *c.Fallback <= 1) {
		errs = append(errs, fmt.Errorf("fallback %v outside [0,1]", *c.Fallback))
	}
	return errors.Join(errs...)
}

// Gate is the saturation gate. It is safe for concurrent use.
type Gate struct {
	cfg    Config
	query  string
	legacy string // the same selector on LegacyMetric
	client *promquery.Client
	log    *slog.Logger
	warned atomic.Bool // the fallback to LegacyMetric was logged

	readings gate.ReadingRecorder
}

var (
	_ gate.Gate           = (*Gate)(nil)
	_ gate.Describer      = (*Gate)(nil)
	_ gate.PolicyReporter = (*Gate)(nil)
	_ gate.Reader         = (*Gate)(nil)
)

// New returns the gate; it takes ownership of client (Close closes it).
// log receives the one line about a fallback to LegacyMetric (nil:
// slog.Default()).
func New(cfg Config, client *promquery.Client, log *slog.Logger) (*Gate, error) {
	if err := cfg.Validate(); err != nil {
		_ = client.Close()
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	return &Gate{
		cfg: cfg, client: client, log: log,
		query:  promquery.Selector(Metric, "inference_pool", cfg.Pool, "namespace", cfg.Namespace),
		legacy: promquery.Selector(LegacyMetric, "inference_pool", cfg.Pool, "namespace", cfg.Namespace),
	}, nil
}

// Factory builds the gate from gate_params: inference_pool (or pool),
// namespace, threshold, fallback, prometheus_url, cache_ttl.
func Factory(p gate.Params, env gate.Env) (gate.Gate, error) {
	var cfg Config
	var err error
	if cfg.Pool, err = promquery.Pool(p); err != nil {
		return nil, err
	}
	cfg.Namespace = p.String("namespace", "")
	if cfg.Threshold, err = p.Float("threshold", DefaultThreshold); err != nil {
		return nil, err
	}
	zero := 0.0 // upstream's default: fail open at the threshold
	if cfg.Fallback, err = promquery.Fallback(p, &zero); err != nil {
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return promquery.Finish(p, env, func(c *promquery.Client) (*Gate, error) { return New(cfg, c, env.Log()) })
}

// Budget queries the saturation and returns threshold − saturation.
func (g *Gate) Budget(ctx context.Context) (float64, error) {
	vals, err := g.values(ctx)
	if err == nil {
		if sat, ok := promquery.Max(vals); ok {
			// Upstream's reading: 1 − saturation against 1 − threshold.
			g.readings.Record(g.cfg.Pool, 1-sat, 1-g.cfg.Threshold)
			return g.budget(sat), nil
		}
		err = fmt.Errorf("query %s: only NaN samples: %w", g.query, promquery.ErrNoData)
	}
	g.readings.Fail(g.cfg.Pool)
	if g.cfg.Fallback != nil {
		return 0, &gate.FallbackError{Budget: g.budget(*g.cfg.Fallback), Err: err}
	}
	return 0, err
}

// values reads Metric, or LegacyMetric where Metric has no sample; a
// failed query of Metric is not retried on the old name.
func (g *Gate) values(ctx context.Context) ([]float64, error) {
	vals, err := g.client.Values(ctx, g.query)
	if !errors.Is(err, promquery.ErrNoData) {
		return vals, err
	}
	old, oldErr := g.client.Values(ctx, g.legacy)
	if oldErr != nil {
		return nil, err // the new name's "no data" is what the operator should see
	}
	if !g.warned.Swap(true) {
		g.log.Warn("prometheus-saturation: "+Metric+" has no sample; reading the deprecated "+LegacyMetric+
			" (an endpoint picker older than the rename); said once", "pool", g.cfg.Pool, "query", g.legacy)
	}
	return old, nil
}

func (g *Gate) budget(sat float64) float64 {
	if math.IsNaN(sat) || sat >= g.cfg.Threshold {
		return 0
	}
	return min(1, max(0, g.cfg.Threshold-math.Max(sat, 0)))
}

// Describe says when the gate closes.
func (g *Gate) Describe() string {
	s := fmt.Sprintf("when %s ≥ %g (budget = %g − saturation; %s where it has no sample)", g.query, g.cfg.Threshold, g.cfg.Threshold, LegacyMetric)
	if g.cfg.Fallback != nil {
		s += fmt.Sprintf("; on a missing metric or failed query: saturation %g (budget %g)", *g.cfg.Fallback, g.budget(*g.cfg.Fallback))
	}
	return s
}

// FailurePolicy is open: with the default fallback a failure leaves the
// gate open (at the threshold), as upstream.
func (g *Gate) FailurePolicy() gate.FailurePolicy { return gate.FailOpen }

// Readings returns the last saturation reading, as 1 − saturation against
// 1 − threshold (upstream's gauges).
func (g *Gate) Readings() []gate.Reading { return g.readings.Readings() }

// Close releases the Prometheus client; it is idempotent.
func (g *Gate) Close() error { return g.client.Close() }
