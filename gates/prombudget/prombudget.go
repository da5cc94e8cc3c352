// Package prombudget is the gate of type "prometheus-budget": the share of
// an inference pool that is free, from the endpoint picker's and the model
// servers' metrics in Prometheus, minus a baseline kept for interactive
// traffic.
//
// D is the first of these queries that returns a sample (P the pool, MC
// max_concurrency per ready pod):
//
//	1 - sum(inference_extension_flow_control_queue_size{inference_pool=P}) / (max(inference_pool_ready_pods{name=P}) * MC)
//	1 - avg(inference_pool_per_pod_queue_size{name=P}) / MC
//	1 - sum(vllm:num_requests_running{inference_pool=P}) / (max(inference_pool_ready_pods{name=P}) * MC)
//
// and budget = D − baseline when D > baseline, else 0, clamped to [0,1].
// Upstream writes the ready-pod count without max(); PromQL then matches
// the label-less sum against the labelled gauge and finds nothing, so the
// first and third queries never answer. max() (the endpoint picker's
// replicas all export the same count) makes them work.
//
// When no query returns a sample, or Prometheus fails, the gate fails
// closed (upstream's fallback D = 0 gives budget 0 too); failure_policy
// changes that, or fallback sets the D to assume (not both).
package prombudget

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/gates/internal/promquery"
)

// Type is the gate's registry name.
const Type = "prometheus-budget"

// Defaults of the gate's parameters.
const (
	DefaultMaxConcurrency = 100
	DefaultBaseline       = 0.05
)

// Metric names the queries read.
const (
	MetricQueueSize       = "inference_extension_flow_control_queue_size"
	MetricReadyPods       = "inference_pool_ready_pods"
	MetricPerPodQueueSize = "inference_pool_per_pod_queue_size"
	MetricRunning         = "vllm:num_requests_running"
)

// Config configures a Gate.
type Config struct {
	// Pool is the inference pool (required).
	Pool string
	// Namespace narrows every query to one namespace (optional).
	Namespace string
	// MaxConcurrency is how many requests one ready pod takes (default DefaultMaxConcurrency).
	MaxConcurrency float64
	// Baseline is the share kept free, in [0,1) (default DefaultBaseline).
	Baseline float64
	// Fallback is the D assumed on failure; nil hands failures to the
	// refresh loop's policy (closed by default).
	Fallback *float64
}

// Validate reports an unusable configuration.
func (c Config) Validate() error {
	var errs []error
	if c.Pool == "" {
		errs = append(errs, errors.New("inference_pool is required"))
	}
	if !(c.MaxConcurrency > 0) || math.IsInf(c.MaxConcurrency, 0) {
		errs = append(errs, fmt.Errorf("max_concurrency %v must be a positive number", c.MaxConcurrency))
	}
	if !(c.Baseline >= 0 && c.Baseline < 1) {
		errs = append(errs, fmt.Errorf("baseline %v outside [0,1)", c.Baseline))
	}
	if c.Fallback != nil && !(*c.Fallback >= 0 && *c.Fallback <= 1) {
		errs = append(errs, fmt.Errorf("fallback %v outside [0,1]", *c.Fallback))
	}
	return errors.Join(errs...)
}

// Queries returns the D queries of cfg, in the order they are tried.
func (c Config) Queries() []string {
	mc := strconv.FormatFloat(c.MaxConcurrency, 'g', -1, 64)
	ready := "max(" + promquery.Selector(MetricReadyPods, "name", c.Pool, "namespace", c.Namespace) + ")"
	return []string{
		"1 - sum(" + promquery.Selector(MetricQueueSize, "inference_pool", c.Pool, "namespace", c.Namespace) + ") / (" + ready + " * " + mc + ")",
		"1 - avg(" + promquery.Selector(MetricPerPodQueueSize, "name", c.Pool, "namespace", c.Namespace) + ") / " + mc,
		"1 - sum(" + promquery.Selector(MetricRunning, "inference_pool", c.Pool, "namespace", c.Namespace) + ") / (" + ready + " * " + mc + ")",
	}
}

// Gate is the budget gate. It is safe for concurrent use.
type Gate struct {
	cfg     Config
	queries []string
	client  *promquery.Client

	readings gate.ReadingRecorder
}

var (
	_ gate.Gate           = (*Gate)(nil)
	_ gate.Describer      = (*Gate)(nil)
	_ gate.PolicyReporter = (*Gate)(nil)
	_ gate.Reader         = (*Gate)(nil)
)

// New returns the gate; it takes ownership of client (Close closes it).
func New(cfg Config, client *promquery.Client) (*Gate, error) {
	if err := cfg.Validate(); err != nil {
		_ = client.Close()
		return nil, err
	}
	return &Gate{cfg: cfg, queries: cfg.Queries(), client: client}, nil
}

// Factory builds the gate from gate_params: inference_pool (or pool),
// namespace, max_concurrency, baseline, fallback, prometheus_url, cache_ttl.
func Factory(p gate.Params, env gate.Env) (gate.Gate, error) {
	var cfg Config
	var err error
	if cfg.Pool, err = promquery.Pool(p); err != nil {
		return nil, err
	}
	cfg.Namespace = p.String("namespace", "")
	if cfg.MaxConcurrency, err = p.Float("max_concurrency", DefaultMaxConcurrency); err != nil {
		return nil, err
	}
	if cfg.Baseline, err = p.Float("baseline", DefaultBaseline); err != nil {
		return nil, err
	}
	if cfg.Fallback, err = promquery.Fallback(p, nil); err != nil {
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return promquery.Finish(p, env, func(c *promquery.Client) (*Gate, error) { return New(cfg, c) })
}

// Budget returns D − baseline for the first query that answers.
func (g *Gate) Budget(ctx context.Context) (float64, error) {
	d, err := g.free(ctx)
	if err == nil {
		g.readings.Record(g.cfg.Pool, d, g.cfg.Baseline)
		return g.budget(d), nil
	}
	g.readings.Fail(g.cfg.Pool)
	if g.cfg.Fallback != nil {
		return 0, &gate.FallbackError{Budget: g.budget(*g.cfg.Fallback), Err: err}
	}
	return 0, err
}

// free returns D from the first query with a usable sample.
func (g *Gate) free(ctx context.Context) (float64, error) {
	for _, q := range g.queries {
		vals, err := g.client.Values(ctx, q)
		switch {
		case errors.Is(err, promquery.ErrNoData):
			continue
		case err != nil:
			return 0, err
		}
		// A NaN (0/0: no ready pod and no queue) says nothing; try the next.
		if d, ok := promquery.Max(vals); ok {
			return d, nil
		}
	}
	return 0, fmt.Errorf("no sample for pool %q from any of %d queries: %w", g.cfg.Pool, len(g.queries), promquery.ErrNoData)
}

func (g *Gate) budget(d float64) float64 {
	if math.IsNaN(d) || d <= g.cfg.Baseline {
		return 0
	}
	return min(1, max(0, d-g.cfg.Baseline))
}

// Describe says when the gate closes.
func (g *Gate) Describe() string {
	s := fmt.Sprintf("when free share D ≤ baseline %g (budget = D − %g); D from the first answering of: %s",
		g.cfg.Baseline, g.cfg.Baseline, strings.Join(g.queries, " | "))
	if g.cfg.Fallback != nil {
		s += fmt.Sprintf("; on failure D = %g (budget %g)", *g.cfg.Fallback, g.budget(*g.cfg.Fallback))
	}
	return s
}

// FailurePolicy is closed, as upstream's default fallback (D = 0).
func (g *Gate) FailurePolicy() gate.FailurePolicy { return gate.FailClosed }

// Readings returns the last free-share reading D against the baseline.
func (g *Gate) Readings() []gate.Reading { return g.readings.Readings() }

// Close releases the Prometheus client; it is idempotent.
func (g *Gate) Close() error { return g.client.Close() }
