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
