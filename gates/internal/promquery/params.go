package promquery

import (
	"errors"
	"fmt"

	"github.com/sluice-io/sluice/core/gate"
)

// FromParams builds the client of a Prometheus gate: gate_params
// prometheus_url and cache_ttl, defaulting to --prometheus-url and
// --prometheus-cache-ttl.
func FromParams(p gate.Params, env gate.Env) (*Client, error) {
	ttl, err := p.Duration("cache_ttl", env.PrometheusCacheTTL)
	if err != nil {
		return nil, err
	}
	if ttl < 0 {
		return nil, fmt.Errorf("gate_params.cache_ttl: %v is negative", ttl)
	}
	if ttl == 0 {
		ttl = DefaultTTL
	}
	return New(Config{URL: p.String("prometheus_url", env.PrometheusURL), TTL: ttl})
}

// Pool reads the inference pool's name: gate_params inference_pool, or its
// alias pool. It is required.
func Pool(p gate.Params) (string, error) {
	a, b := p.String("inference_pool", ""), p.String("pool", "")
	switch {
	case a != "" && b != "" && a != b:
		return "", fmt.Errorf("gate_params.inference_pool %q and pool %q disagree", a, b)
	case a != "":
		return a, nil
	case b != "":
		return b, nil
	}
	return "", errors.New("gate_params.inference_pool is required")
}

// Fallback reads gate_params.fallback: the value a gate assumes for its
// query when the query fails. It excludes failure_policy; def applies when
// neither is set.
func Fallback(p gate.Params, def *float64) (*float64, error) {
	switch {
	case p.Has("fallback") && p.Has(gate.ParamFailurePolicy):
		return nil, errors.New("gate_params: set fallback or failure_policy, not both")
	case p.Has("fallback"):
		f, err := p.Float("fallback", 0)
		if err != nil {
			return nil, err
		}
		return &f, nil
	case p.Has(gate.ParamFailurePolicy):
		return nil, nil
	}
	return def, nil
}

// Finish ends a Prometheus gate's factory once its own parameters are read
// and checked: it makes the client (FromParams), refuses parameters nobody
// read, and hands the client to build, which owns it from then on.
func Finish[G gate.Gate](p gate.Params, env gate.Env, build func(*Client) (G, error)) (gate.Gate, error) {
	client, err := FromParams(p, env)
	if err != nil {
		return nil, err
	}
	if err := p.Unused(); err != nil {
		_ = client.Close()
		return nil, err
	}
	g, err := build(client)
	if err != nil {
		return nil, err // not g: a nil *Gate would make a non-nil gate.Gate
	}
	return g, nil
}
