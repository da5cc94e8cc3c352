package gate

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-io/sluice/core/registry"
)

// Env is what a gate factory may need beyond its own parameters: settings
// shared by every gate of a deployment.
type Env struct {
	// PrometheusURL is --prometheus-url; gates that query Prometheus use it
	// unless their params name their own.
	PrometheusURL string
	// PrometheusCacheTTL is --prometheus-cache-ttl: how long gates reuse a
	// Prometheus answer unless their params say otherwise (0: each gate's
	// own default).
	PrometheusCacheTTL time.Duration
	// RedisURL is the deployment's Redis URL (REDIS_URL), for gates that keep
	// their budget in Redis and name no address of their own.
	RedisURL string
	// RedisMode is the deployment's redis_mode ("single", "cluster" or
	// "sentinel"; "" is single): how RedisURL is reached.
	RedisMode string
	// RedisAddrs are the deployment's redis_addrs: more cluster nodes or
	// sentinels beside RedisURL's host.
	RedisAddrs []string
	// RedisMasterName is the deployment's redis_master_name: the master the
	// sentinels monitor (sentinel mode).
	RedisMasterName string
	// MaxConcurrency is the queue's concurrency (credits at budget 1).
	MaxConcurrency int
	// Build builds an inner gate, for gates that compose others.
	Build func(typ string, params Params) (Gate, error)
	// Logger receives what a gate says on its own (a deprecated metric it
	// fell back to, ...); nil: slog.Default().
	Logger *slog.Logger
	// Pool is the worker pool the gate belongs to: the pool's id for a pool
	// gate, the queue's worker_pool_id for a queue gate ("": unknown).
	Pool string
	// Metrics, when set, is where the gate registers the collectors of
	// the series it exports about itself (with Register, or the shared
	// EventsCollector, CallsCollector and WindowsCollector). It is a
	// labelled registerer: it adds the label every such series carries,
	// gate="<the gate's name>" (the name in sluice_gate_budget), so a
	// collector describes its series without it and several gates of one
	// type export one metric name, one child per gate. The refresh loop
	// that runs the gate unregisters what was registered when it closes
	// the gate. Inner gates a composite builds with Build register on the
	// same registerer. nil: the gate exports nothing.
	//
	// core/gate names prometheus.Registerer rather than an interface of
	// its own: every gate that exports series builds prometheus
	// collectors anyway, and every importer of this package links
	// client_golang already.
	Metrics prometheus.Registerer
	// PoolMetrics is Metrics without the gate label, for series labelled
	// by worker pool instead (redis-leased-rate's drain_limit gauges,
	// labelled pool_name by the gate itself); unregistered with Metrics.
	PoolMetrics prometheus.Registerer
}

// Log returns e.Logger, or slog.Default() when it is nil.
func (e Env) Log() *slog.Logger {
	if e.Logger == nil {
		return slog.Default()
	}
	return e.Logger
}

// Factory builds a gate from its parameters. It must report every parameter
// it does not know (Params.Unused helps) and every invalid value.
type Factory func(params Params, env Env) (Gate, error)

// Registry maps gate type names to factories: the "gate type" namespace of
// the generic registry (Register, Lookup, Has, Names: a duplicate type is an
// error, an unknown one an error naming the known ones), plus New, which
// builds a gate with the parameters every gate accepts.
type Registry struct {
	*registry.Registry[Factory]
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{registry.New[Factory]("gate type")} }

// New builds a gate of type typ. It reads the generic parameters
// (failure_policy, refresh_interval) itself and gives the factory an
// env.Build that builds inner gates from this registry.
func (r *Registry) New(typ string, params Params, env Env) (Gate, error) {
	f, err := r.Lookup(typ)
	if err != nil {
		return nil, err
	}
	if env.Build == nil {
		env.Build = func(t string, p Params) (Gate, error) { return r.New(t, p, env) }
	}
	if params.used == nil {
		params = NewParams(nil)
	}
	policy, interval, err := genericParams(params)
	if err != nil {
		return nil, fmt.Errorf("gate %s: %w", typ, err)
	}
	g, err := f(params, env)
	if err != nil {
		return nil, fmt.Errorf("gate %s: %w", typ, err)
	}
	return wrapConfigured(g, policy, interval), nil
}
