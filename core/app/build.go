package app

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/net/http/httpguts"

	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/dispatch"
	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/metrics"
	"github.com/sluice-io/sluice/core/pipeline"
	"github.com/sluice-io/sluice/core/status"
	"github.com/sluice-io/sluice/core/transform"
	"github.com/sluice-io/sluice/core/transport"
)

// build assembles a validated deployment, one named step at a time. What a
// step built is kept in a as soon as it exists, so that close can release
// it when a later step fails.
func (a *App) build(o Options) error {
	m, err := newMetrics(a.reg)
	if err != nil {
		return err
	}
	if a.client, err = newDispatcher(a.cfg); err != nil {
		return err
	}
	a.transport = o.Transport
	if a.transport == nil {
		if a.transport, err = newTransport(a.cfg, o.Adapters.Transports, a.log); err != nil {
			return err
		}
	}
	if err := registerTransportEvents(a.reg, a.cfg.Transport, a.transport); err != nil {
		return err
	}
	queues, err := a.newQueues(o.Adapters.Gates, m)
	if err != nil {
		return err
	}
	pools, err := a.newPools(o.Adapters.Gates, m)
	if err != nil {
		return err
	}
	tracer, err := a.newTracer(o.TracerProvider)
	if err != nil {
		return err
	}
	prio, err := priority(a.cfg, a.client)
	if err != nil {
		return err
	}
	if a.transform, err = transform.Load(a.cfg.TransformConfigFile, o.Adapters.Transforms, transform.Env{Logger: a.log}); err != nil {
		return fmt.Errorf("transform_config_file: %w", err)
	}
	var d pipeline.Dispatcher = a.client
	if o.Dispatcher != nil {
		d = o.Dispatcher
	}
	a.pipe, err = pipeline.New(pipeline.Config{
		Transport:           a.transport,
		Dispatcher:          d,
		Queues:              queues,
		Pools:               pools,
		Priority:            prio,
		Transforms:          a.transform,
		GateTimeout:         gateWaitTimeout(a.cfg),
		Retry:               a.cfg.RetryPolicy(),
		DrainTimeout:        a.cfg.DrainTimeout.D(),
		ResultWriteTimeout:  a.cfg.ResultWriteTimeout.D(),
		Limits:              a.cfg.Limits,
		ResultHandBackDelay: a.cfg.ResultHandBackDelay.D(),
		DepthInterval:       a.cfg.BacklogPollInterval.D(),
		Metrics:             m,
		Logger:              a.log,
		TracerProvider:      tracer,
	})
	return err
}

// newMetrics registers sluice's metrics in reg.
func newMetrics(reg *prometheus.Registry) (*metrics.Metrics, error) {
	m, err := metrics.New(reg)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	return m, nil
}

// newDispatcher builds the HTTP client to the gateways (its errors already
// say "dispatch: ").
func newDispatcher(cfg *config.Config) (*dispatch.Client, error) {
	dc, err := cfg.DispatchConfig()
	if err != nil {
		return nil, err
	}
	return dispatch.New(dc)
}

// priority is the tier-priority policy of cfg (nil for random-robin), its
// header checked as a header the client may send.
func priority(cfg *config.Config, c *dispatch.Client) (*pipeline.Priority, error) {
	if cfg.MergePolicy.Type != config.PolicyTierPriority {
		return nil, nil
	}
	p := &pipeline.Priority{Header: cfg.MergePolicy.Param("priority_header"), TierLabel: cfg.MergePolicy.Param("tier_label"),
		ObjectiveHeader: cfg.MergePolicy.Param("objective_header")}
	if p.Header != "" {
		if err := c.CheckHeaderName(p.Header); err != nil {
			return nil, fmt.Errorf("merge_policy: priority_header: %w", err)
		}
	}
	if p.ObjectiveHeader != "" {
		if err := c.CheckHeaderName(p.ObjectiveHeader); err != nil {
			return nil, fmt.Errorf("merge_policy: objective_header: %w", err)
		}
	}
	objectives, err := laneObjectives(cfg.MergePolicy.Parameters)
	if err != nil {
		return nil, fmt.Errorf("merge_policy: lane_objectives: %w", err)
	}
	p.LaneObjectives = objectives
	shares, err := laneMinShares(cfg.MergePolicy.Parameters)
	if err != nil {
		return nil, fmt.Errorf("merge_policy: lane_min_share: %w", err)
	}
	p.MinShare = shares
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("merge_policy: lane_min_share: %w", err)
	}
	return p, nil
}

// laneMinShares reads the tier-priority parameter lane_min_share (sluice's,
// not upstream's): an object from lane key to the lane's minimum share of
// the pool's worker grants, a number in [0,1], the shares summing to at
// most 1 (pipeline.Priority.MinShare). An unknown key or another value is
// an error; absent or null: strict priority, as upstream.
func laneMinShares(params json.RawMessage) ([pipeline.NumLanes]float64, error) {
	return laneParam[float64](params, "lane_min_share", "a share in [0,1]", nil)
}

// laneObjectives reads the tier-priority parameter lane_objectives: an
// object from lane key ("reserved-interactive" … "overflow-batch", see
// pipeline.LaneKey) to an InferenceObjective name. An unknown key, or a
// value that is not a string a header may carry, is an error.
func laneObjectives(params json.RawMessage) ([pipeline.NumLanes]string, error) {
	return laneParam(params, "lane_objectives", "objective name", func(k, v string) error {
		if !httpguts.ValidHeaderFieldValue(v) {
			return fmt.Errorf("lane %q: %q is not a valid header value", k, v)
		}
		return nil
	})
}

// laneParam reads the merge-policy parameter name, an object from lane key
// (pipeline.LaneKey) to a T described as want, into an array by lane;
// check (nil: none) vets each value. Absent or null: all zero. An unknown
// key or a value of another type is an error.
func laneParam[T any](params json.RawMessage, name, want string, check func(key string, v T) error) (out [pipeline.NumLanes]T, err error) {
	var obj map[string]json.RawMessage
	if len(params) == 0 || json.Unmarshal(params, &obj) != nil || obj[name] == nil {
		return out, nil
	}
	raw := obj[name]
	if string(bytes.TrimSpace(raw)) == "null" {
		return out, nil
	}
	var m map[string]T
	if err := json.Unmarshal(raw, &m); err != nil {
		return out, fmt.Errorf("want an object of lane key to %s: %v", want, err)
	}
	keys := make([]string, pipeline.NumLanes)
	for i := range keys {
		keys[i] = pipeline.LaneKey(i)
	}
	for k, v := range m {
		i := slices.Index(keys, k)
		if i < 0 {
			return out, fmt.Errorf("unknown lane %q (lanes: %s)", k, strings.Join(keys, ", "))
		}
		if check != nil {
			if err := check(k, v); err != nil {
				return out, err
			}
		}
		out[i] = v
	}
	return out, nil
}

// newTransport builds the config's transport from the registry (a nil log
// discards the transport's logs).
func newTransport(cfg *config.Config, transports *transport.Registry, log *slog.Logger) (transport.Transport, error) {
	env, err := TransportEnv(cfg, log)
	if err != nil {
		return nil, err
	}
	return transports.New(cfg.Transport, cfg.TransportConfig.Options, env)
}

// TransportEnv is what the config's transport is built with besides its
// own options (the deployment's Redis URL, topology and TLS, log): also
// what a producer beside the dispatcher needs to reach the same broker the
// same way.
func TransportEnv(cfg *config.Config, log *slog.Logger) (transport.Env, error) {
	env := transport.Env{Logger: log, RedisURL: cfg.RedisURL, RedisMode: cfg.RedisMode,
		RedisAddrs: cfg.RedisAddrs, RedisMasterName: cfg.RedisMasterName}
	if t := cfg.RedisTLS; t != (config.TLS{}) {
		tc, err := dispatch.TLSConfig{CACert: t.CACert, Cert: t.Cert, Key: t.Key, InsecureSkipVerify: t.InsecureSkipVerify}.Build()
		if err != nil {
			return env, fmt.Errorf("redis_tls: %w", err)
		}
		env.RedisTLS = tc
	}
	return env, nil
}

// registerTransportEvents exports what a transport counts on its own.
func registerTransportEvents(reg *prometheus.Registry, name string, tp transport.Transport) error {
	ec, ok := tp.(transport.EventCounter)
	if !ok {
		return nil
	}
	if err := reg.Register(metrics.NewEventsCollector(name, ec.Events)); err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	return nil
}

// gateDefinition reads queue q's gate parameters, and a key that is equal
// for equal definitions however their parameters were written.
func gateDefinition(q config.Queue) (gate.Params, string, error) {
	params, err := gate.ParseParams(q.GateParams)
	if err != nil {
		return gate.Params{}, "", err
	}
	return params, q.GateType + "\x00" + params.Canonical(), nil
}

// newGate builds queue q's gate of params from the registry, named name in
// metrics (log: what the gate says on its own; nil: slog.Default()). The
// gate registers its own collectors on reg through the returned
// gateMetrics, which unregisters them when the gate's loop closes it; a
// gate that fails to build leaves none.
func newGate(gates *gate.Registry, cfg *config.Config, q config.Queue, params gate.Params, log *slog.Logger,
	reg prometheus.Registerer, name string) (gate.Gate, *gateMetrics, error) {
	env := gateEnv(cfg, q.MaxConcurrency)
	env.Logger, env.Pool = log, q.WorkerPoolID
	gm := withGateMetrics(&env, reg, name)
	g, err := gates.New(q.GateType, params, env)
	if err != nil && gm != nil {
		gm.unregisterAll()
	}
	return g, gm, err
}

// gateEnv is what a gate factory gets from the deployment.
func gateEnv(cfg *config.Config, maxConcurrency int) gate.Env {
	return gate.Env{
		PrometheusURL: cfg.Prometheus.URL, PrometheusCacheTTL: cfg.Prometheus.CacheTTL.D(),
		RedisURL: cfg.RedisURL, RedisMode: cfg.RedisMode, MaxConcurrency: maxConcurrency,
		RedisAddrs: cfg.RedisAddrs, RedisMasterName: cfg.RedisMasterName,
	}
}

// newQueues builds the pipeline's queues and their gates: one gate, and one
// refresh loop, per distinct gate definition, shared by the queues that
// have it. The loops are kept in a.gates.
func (a *App) newQueues(gates *gate.Registry, m *metrics.Metrics) ([]pipeline.Queue, error) {
	a.gateReg, a.metrics = gates, m
	queues, _, err := a.buildQueues(a.cfg.TransportConfig.Queues, nil)
	if err != nil {
		return nil, err
	}
	a.specs = map[string]queueSpec{}
	for i, q := range a.cfg.TransportConfig.Queues {
		a.specs[q.ID] = queueSpec{cfg: q, queue: queues[i]}
	}
	a.live = a.cfg.TransportConfig.Queues
	return queues, nil
}

// queueSpec is a running queue: its config and what the pipeline was given.
type queueSpec struct {
	cfg   config.Queue
	queue pipeline.Queue
}

// buildQueues builds the pipeline's queues of qs. A queue for which reuse
// returns true is the pipeline queue it returns (an unchanged queue on a
// reload keeps its gate); the others get new gates, one per distinct
// definition among them (see newQueues), appended to a.gates and returned
// in built (the caller closes them if the queues are not used).
func (a *App) buildQueues(qs []config.Queue, reuse func(config.Queue) (pipeline.Queue, bool)) (queues []pipeline.Queue, built []*gate.Refresher, err error) {
	byDef := map[string]*gate.Refresher{}
	queues = make([]pipeline.Queue, 0, len(qs))
	defer func() {
		if err != nil {
			for _, r := range built {
				_ = r.Close()
			}
			built = nil
		}
	}()
	for i, q := range qs {
		if reuse != nil {
			if pq, ok := reuse(q); ok {
				queues = append(queues, pq)
				continue
			}
		}
		params, def, err := gateDefinition(q)
		if err != nil {
			return nil, built, fmt.Errorf("queues[%d]: %w", i, err)
		}
		// Queues with the same definition share a budget-only gate (one
		// refresh loop, one backend query); a gate that decides per request
		// may keep state per instance (local-max-concurrency's count), so
		// each queue gets its own, as upstream.
		r, ok := byDef[def]
		if ok {
			if _, admits := r.Gate().(gate.Admitter); admits {
				ok = false
			}
		}
		if !ok {
			name := q.GateType
			if a.nGates > 0 {
				name += "#" + strconv.Itoa(a.nGates)
			}
			g, gm, err := newGate(a.gateReg, a.cfg, q, params, a.log, a.reg, name)
			if err != nil {
				return nil, built, fmt.Errorf("queues[%d] (%s): %w", i, q.ID, err)
			}
			a.nGates++
			r = newRefresher(g, name, q.GateType, a.log, a.metrics, a.gateState, gm.onClose())
			byDef[def] = r
			built = append(built, r)
			a.mu.Lock()
			a.gates = append(a.gates, r)
			a.mu.Unlock()
		}
		queues = append(queues, pipeline.Queue{
			Queue:      q.Queue,
			Target:     dispatch.Target{BaseURL: q.IGWBaseURL, Path: q.RequestPathURL, InferenceObjective: q.InferenceObjective},
			Gate:       r,
			WorkerPool: q.WorkerPoolID,
			Labels:     q.Labels,
			Evict:      q.Evict,
			EvictLimit: q.EvictLimit,
			Resume:     q.Resume,
		})
	}
	return queues, built, nil
}

// newPools builds the worker pools and their gates (one instance per pool).
func (a *App) newPools(gates *gate.Registry, m *metrics.Metrics) ([]pipeline.Pool, error) {
	pools := make([]pipeline.Pool, 0, len(a.cfg.WorkerPools))
	for i, wp := range a.cfg.WorkerPools {
		p := pipeline.Pool{ID: wp.ID, Workers: wp.Workers}
		if wp.GateType != "" {
			params, err := gate.ParseParams(wp.GateParams)
			if err != nil {
				return nil, fmt.Errorf("worker_pools[%d] (%s): %w", i, wp.ID, err)
			}
			env := gateEnv(a.cfg, wp.Workers)
			env.Logger, env.Pool = a.log, wp.ID
			name := "pool:" + wp.ID
			gm := withGateMetrics(&env, a.reg, name)
			g, err := gates.New(wp.GateType, params, env)
			if err != nil {
				if gm != nil {
					gm.unregisterAll()
				}
				return nil, fmt.Errorf("worker_pools[%d] (%s): gate: %w", i, wp.ID, err)
			}
			p.Gate = newRefresher(g, name, wp.GateType, a.log, m, a.gateState, gm.onClose())
			a.mu.Lock()
			a.gates = append(a.gates, p.Gate)
			a.mu.Unlock()
		}
		pools = append(pools, p)
	}
	return pools, nil
}

// newRefresher starts the refresh loop of gate g, named name in metrics,
// of type typ; its state is recorded in gs for the status page. onClose
// (nil: none) runs when the loop closes the gate.
func newRefresher(g gate.Gate, name, typ string, log *slog.Logger, m *metrics.Metrics, gs *status.Gates, onClose func()) *gate.Refresher {
	st := gs.Add(name, typ)
	r := gate.NewRefresher(g, gate.RefresherConfig{
		Name: name, Logger: log, OnClose: onClose,
		Observe: func(b float64, err error) {
			st.Observe(b, err)
			m.GateBudget.WithLabelValues(name).Set(b)
			if err != nil {
				m.GateFailures.WithLabelValues(name).Inc()
				m.GateFailing.WithLabelValues(name).Set(1)
			} else {
				m.GateFailing.WithLabelValues(name).Set(0)
			}
		},
	})
	st.SetRefresher(r)
	return r
}

// newTracer returns the tracer provider of the deployment: the one given,
// or one built from the config's tracing section (kept in a.tracing, shut
// down by Run), or nil: tracing off.
func (a *App) newTracer(given trace.TracerProvider) (trace.TracerProvider, error) {
	if given != nil || !tracingEnabled(a.cfg.Tracing) {
		return given, nil
	}
	tp, err := newTracerProvider(a.cfg.Tracing)
	if err != nil {
		return nil, err
	}
	a.tracing = tp
	return tp, nil
}

// gateWaitTimeout is the pipeline's GateTimeout for cfg: unset → the
// pipeline's default (5m), 0 → the deadline only.
func gateWaitTimeout(cfg *config.Config) time.Duration {
	switch {
	case cfg.GateWaitTimeout == nil:
		return 0
	case *cfg.GateWaitTimeout == 0:
		return -1
	}
	return cfg.GateWaitTimeout.D()
}
