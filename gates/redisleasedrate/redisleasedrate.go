// Package redisleasedrate is the gate of type "redis-leased-rate"
// (upstream #424): a pool-wide token bucket in Redis whose rate an external
// controller leases by writing a control hash. It is meant as a pool gate
// inside wait-on-refuse.
//
//	{"gate_type":"wait-on-refuse","gate_params":{"gate":{"gate_type":"redis-leased-rate",
//	  "gate_params":{"address":"redis:6379","control_key":"dispatch-control:pool-a"}}}}
//
// The control hash, written by the controller:
//
//	api_version          must be llm-d.ai/v1alpha1
//	pool_id              must be the gate's pool
//	max_admission_rps    a finite rate ≥ 0; 0 pauses admission
//	valid_until_unix_ms  an integer after Redis' clock
//	decision_id          non-empty
//
// Each request runs one script on Redis' own clock (TIME): with a valid
// lease it refills the bucket (capacity max(1, rate × burst_seconds), a
// clock that steps back counts as no time passed), takes one token if there
// is one, and stores the bucket in the state hash (state_key, default
// <control_key>:state) with an expiry past the lease. A request that gets a
// token is admitted; any other answer is a deferral: no lease, a lease that
// is invalid, expired, for another pool or paused, an empty bucket, and
// also any Redis or script error. The gate fails closed and never ends a
// request with a result of its own.
//
// Budget is 1 while a valid lease with a rate above 0 exists (read with
// Redis' clock, HMGET and TIME in one MULTI/EXEC), else 0; a Redis error
// is an error (failure policy closed). Every evaluation records the lease
// in the gate's drain_limit gauges (registered on gate.Env.PoolMetrics,
// labelled pool_name), (0, invalid, none) at start.
package redisleasedrate

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/gates/internal/redisconn"
	"github.com/sluice-io/sluice/internal/redisclient"
)

// Type is the gate's registry name.
const Type = "redis-leased-rate"

// APIVersion is the control hash's api_version (upstream's
// api.DispatchRateLimitAPIVersion).
const APIVersion = "llm-d.ai/v1alpha1"

// DefaultBurstSeconds is burst_seconds' default: the bucket holds one
// second of the leased rate.
const DefaultBurstSeconds = 1.0

// Config configures a Gate.
type Config struct {
	// Address is the Redis server: host:port or a redis:// / rediss:// URL
	// (required).
	Address string
	// RedisMode is redisclient.Single ("" too), redisclient.Cluster or
	// redisclient.Sentinel (then New's conn gives the master name and any
	// more sentinels).
	RedisMode redisclient.Mode
	// ControlKey is the controller's hash (required).
	ControlKey string
	// StateKey is the bucket's hash (default ControlKey + ":state"). In
	// cluster mode it must share ControlKey's hash slot.
	StateKey string
	// PoolID is the pool the lease must name (default: the gate's worker
	// pool; required in the end).
	PoolID string
	// BurstSeconds sizes the bucket: max(1, rate × BurstSeconds) tokens
	// (default DefaultBurstSeconds; finite and > 0).
	BurstSeconds float64
	// Lease records each evaluation's lease (nil: not recorded; Factory
	// sets it to the drain_limit gauges).
	Lease LeaseRecorder
}

// LeaseRecorder records a rate lease: pool is the gate's pool_id, rps the
// granted rate (0 when paused or invalid), valid whether the lease is, and
// validUntil its end (zero when there is none).
type LeaseRecorder func(pool string, rps float64, valid bool, validUntil time.Time)

// The drain_limit gauges (upstream's names and help), labelled pool_name.
const (
	rpsName   = "llm_d_async_async_drain_limit_rps"
	validName = "llm_d_async_async_drain_limit_lease_valid"
	untilName = "llm_d_async_async_drain_limit_valid_until_seconds"
)

// LeaseGauges registers the drain_limit gauges of pool on reg
// (gate.Env.PoolMetrics) and returns the recorder that sets them; nil reg:
// nil. A second gate of the same pool shares the gauges the first one
// registered (one series per pool, as the names say).
func LeaseGauges(reg prometheus.Registerer, pool string) (LeaseRecorder, error) {
	if reg == nil {
		return nil, nil
	}
	gauge := func(name, help string) (prometheus.Gauge, error) {
		g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: prometheus.Labels{"pool_name": pool}})
		if err := reg.Register(g); err != nil {
			are := prometheus.AlreadyRegisteredError{}
			if !errors.As(err, &are) {
				return nil, err
			}
			existing, ok := are.ExistingCollector.(prometheus.Gauge)
			if !ok {
				return nil, err
			}
			return existing, nil
		}
		return g, nil
	}
	rps, err := gauge(rpsName, "The admission rate a redis-leased-rate gate's lease grants (0 when paused or invalid).")
	if err != nil {
		return nil, err
	}
	valid, err := gauge(validName, "1 while a redis-leased-rate gate holds a valid lease.")
	if err != nil {
		return nil, err
	}
	until, err := gauge(untilName, "When a redis-leased-rate gate's lease ends, in Unix seconds (0: none).")
	if err != nil {
		return nil, err
	}
	return func(_ string, r float64, ok bool, u time.Time) {
		v, us := 0.0, 0.0
		if ok {
			v = 1
		}
		if !u.IsZero() {
			us = float64(u.UnixMilli()) / 1000
		}
		rps.Set(r)
		valid.Set(v)
		until.Set(us)
	}, nil
}

func (c *Config) setDefaults() {
	if c.StateKey == "" && c.ControlKey != "" {
		c.StateKey = c.ControlKey + ":state"
	}
	if c.BurstSeconds == 0 {
		c.BurstSeconds = DefaultBurstSeconds
	}
}

// Validate reports an unusable configuration, naming the parameter.
func (c Config) Validate() error {
	var errs []error
	if c.Address == "" {
		errs = append(errs, errors.New("gate_params.address is required: the Redis server (host:port or redis:// URL)"))
	}
	if c.ControlKey == "" {
		errs = append(errs, errors.New("gate_params.control_key is required: the controller's hash"))
	}
	if c.PoolID == "" {
		errs = append(errs, errors.New("gate_params.pool_id is empty and the gate belongs to no worker pool: set pool_id"))
	}
	if !(c.BurstSeconds > 0) || math.IsInf(c.BurstSeconds, 0) {
		errs = append(errs, fmt.Errorf("gate_params.burst_seconds: %v must be a finite number > 0", c.BurstSeconds))
	}
	if c.RedisMode == redisclient.Cluster && c.ControlKey != "" && redisclient.Slot(c.ControlKey) != redisclient.Slot(c.StateKey) {
		errs = append(errs, fmt.Errorf("gate_params.state_key %q and control_key %q are in different hash slots: give both one hash tag, e.g. {%s}",
			c.StateKey, c.ControlKey, c.ControlKey))
	}
	return errors.Join(errs...)
}

// Gate is the leased-rate gate. It is safe for concurrent use.
type Gate struct {
	cfg    Config
	client redis.UniversalClient
	where  string
}

var (
	_ gate.Gate           = (*Gate)(nil)
	_ gate.Admitter       = (*Gate)(nil)
	_ gate.Describer      = (*Gate)(nil)
	_ gate.PolicyReporter = (*Gate)(nil)
)

// New validates cfg and returns the gate; it does not connect yet. conn
// gives the credentials and db, and in sentinel mode the master name and
// more sentinels (Addrs); its Address and Mode are cfg's.
func New(cfg Config, conn redisconn.Config) (*Gate, error) {
	cfg.setDefaults()
	conn.Address, conn.Mode = cfg.Address, cfg.RedisMode
	var errs []error
	if err := cfg.Validate(); err != nil {
		errs = append(errs, err)
	}
	var o *redisclient.Options
	if cfg.Address != "" {
		var err error
		if o, err = conn.Options(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	o.Tune(func(c *redisclient.Common) { c.PoolSize = 8 })
	g := &Gate{cfg: cfg, client: o.New(), where: redisconn.Where(o)}
	g.record(lease{}) // (0, invalid, none) until the first evaluation
	return g, nil
}

// Factory builds the gate from gate_params: address (default: the
// deployment's Redis URL), redis_mode, redis_addrs, redis_master_name
// (default: the deployment's), control_key, state_key, pool_id (default:
// the gate's worker pool), burst_seconds, and the connection parameters
// username, password, db.
func Factory(p gate.Params, env gate.Env) (gate.Gate, error) {
	top, err := redisconn.TopologyFromParams(p, env)
	if err != nil {
		return nil, err
	}
	cfg := Config{
		Address: p.String("address", env.RedisURL), RedisMode: top.Mode,
		ControlKey: p.String("control_key", ""), StateKey: p.String("state_key", ""),
		PoolID: p.String("pool_id", env.Pool),
	}
	if cfg.BurstSeconds, err = p.Float("burst_seconds", DefaultBurstSeconds); err != nil {
		return nil, err
	}
	if p.Has("burst_seconds") && cfg.BurstSeconds == 0 {
		return nil, errors.New("gate_params.burst_seconds: 0 must be a finite number > 0")
	}
	conn := redisconn.Config{Username: p.String("username", ""), Password: p.String("password", ""),
		Addrs: top.Addrs, MasterName: top.MasterName}
	if conn.DB, err = p.Int("db", 0); err != nil {
		return nil, err
	}
	if err := p.Unused(); err != nil {
		return nil, err
	}
	if cfg.PoolID != "" {
		if cfg.Lease, err = LeaseGauges(env.PoolMetrics, cfg.PoolID); err != nil {
			return nil, fmt.Errorf("metrics: %w", err)
		}
	}
	g, err := New(cfg, conn)
	if err != nil {
		return nil, err // not g: a nil *Gate would make a non-nil gate.Gate
	}
	return g, nil
}

// acquireScript takes one token from the leased bucket. KEYS: control,
// state. ARGV: api_version, pool_id, burst_seconds. It returns {allowed,
// lease valid, rate as a string, valid_until_unix_ms}; an invalid lease is
// {0, 0, "0", 0}, a paused one {0, 1, "0", until}.
var acquireScript = redis.NewScript(`
local c = redis.call('HMGET', KEYS[1], 'api_version', 'pool_id', 'max_admission_rps', 'valid_until_unix_ms', 'decision_id')
for i = 1, 5 do
  if not c[i] or c[i] == '' then return {0, 0, '0', 0} end
end
if c[1] ~= ARGV[1] or c[2] ~= ARGV[2] then return {0, 0, '0', 0} end
local t = redis.call('TIME')
local wall = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now = wall
local rate = tonumber(c[3])
local burst = tonumber(ARGV[3])
if not string.match(c[4], '^%d+$') then return {0, 0, '0', 0} end
local untilms = tonumber(c[4])
if rate == nil or rate ~= rate or rate == math.huge or rate < 0 then return {0, 0, '0', 0} end
if untilms <= now then return {0, 0, '0', 0} end
if burst == nil or burst ~= burst or burst == math.huge or burst <= 0 then return {0, 0, '0', 0} end
if rate == 0 then return {0, 1, '0', untilms} end
local cap = math.max(1, rate * burst)
local s = redis.call('HMGET', KEYS[2], 'tokens', 'last_ms')
local tokens, last = tonumber(s[1]), tonumber(s[2])
if tokens == nil or last == nil then
  tokens = cap
else
  if now < last then now = last end
  tokens = math.min(cap, tokens + (now - last) / 1000 * rate)
end
local allowed = 0
if tokens >= 1 then
  allowed = 1
  tokens = tokens - 1
end
redis.call('HSET', KEYS[2], 'tokens', tostring(tokens), 'last_ms', tostring(now))
redis.call('PEXPIRE', KEYS[2], math.max(1000, untilms - wall + 1000))
return {allowed, 1, tostring(rate), untilms}
`)

// lease is one evaluation's view of the control hash.
type lease struct {
	valid bool
	rps   float64
	until time.Time
}

func (g *Gate) record(l lease) {
	if g.cfg.Lease != nil {
		g.cfg.Lease(g.cfg.PoolID, l.rps, l.valid, l.until)
	}
}

// Admit takes a token: Admit when there was one, Defer otherwise (no
// valid lease, paused, empty bucket, or a Redis error: fail closed).
func (g *Gate) Admit(ctx context.Context, _ *wire.Request) (gate.Decision, error) {
	res, err := acquireScript.Run(ctx, g.client, []string{g.cfg.ControlKey, g.cfg.StateKey},
		APIVersion, g.cfg.PoolID, strconv.FormatFloat(g.cfg.BurstSeconds, 'g', -1, 64)).Slice()
	if err != nil || len(res) != 4 {
		if ctx.Err() != nil {
			return gate.Decision{}, ctx.Err() // the caller gave up: no decision was made
		}
		g.record(lease{})
		reason := "redis-leased-rate: no answer from " + g.where
		if err != nil {
			reason += ": " + err.Error()
		}
		return gate.Decision{Verdict: gate.Defer, Delay: time.Second, Reason: reason}, nil
	}
	allowed, _ := res[0].(int64)
	valid, _ := res[1].(int64)
	rateS, _ := res[2].(string)
	untilMs, _ := res[3].(int64)
	rps, perr := strconv.ParseFloat(rateS, 64)
	l := lease{valid: valid == 1 && perr == nil, rps: rps}
	if l.valid {
		l.until = time.UnixMilli(untilMs)
	} else {
		l.rps = 0
	}
	g.record(l)
	switch {
	case allowed == 1 && l.valid:
		return gate.Admitted, nil
	case !l.valid:
		return gate.Decision{Verdict: gate.Defer, Delay: time.Second, Reason: "redis-leased-rate: no valid lease in " + g.cfg.ControlKey}, nil
	case l.rps <= 0:
		return gate.Decision{Verdict: gate.Defer, Delay: time.Second, Reason: "redis-leased-rate: admission paused by the lease"}, nil
	}
	// An empty bucket: the next token is 1/rate away.
	delay := time.Duration(float64(time.Second) / l.rps)
	return gate.Decision{Verdict: gate.Defer, Delay: min(time.Second, max(time.Millisecond, delay)),
		Reason: "redis-leased-rate: rate " + rateS + "/s reached"}, nil
}

// Budget is 1 while a valid lease with a rate above 0 exists, else 0; a
// Redis error is returned.
func (g *Gate) Budget(ctx context.Context) (float64, error) {
	var hm *redis.SliceCmd
	var now *redis.TimeCmd
	_, err := g.client.TxPipelined(ctx, func(p redis.Pipeliner) error {
		hm = p.HMGet(ctx, g.cfg.ControlKey, "api_version", "pool_id", "max_admission_rps", "valid_until_unix_ms", "decision_id")
		now = p.Time(ctx)
		return nil
	})
	if err != nil {
		g.record(lease{})
		if errors.Is(err, redis.ErrClosed) {
			return 0, gate.ErrGateClosed
		}
		return 0, fmt.Errorf("redis-leased-rate: read %s at %s: %w", g.cfg.ControlKey, g.where, err)
	}
	l := g.parse(hm.Val(), now.Val())
	g.record(l)
	if l.valid && l.rps > 0 {
		return 1, nil
	}
	return 0, nil
}

// parse checks the control hash's fields against the gate and Redis' clock.
func (g *Gate) parse(f []any, now time.Time) lease {
	s := make([]string, 5)
	for i := range s {
		v, ok := f[i].(string)
		if !ok || v == "" {
			return lease{}
		}
		s[i] = v
	}
	if s[0] != APIVersion || s[1] != g.cfg.PoolID {
		return lease{}
	}
	rps, err := strconv.ParseFloat(s[2], 64)
	if err != nil || math.IsNaN(rps) || math.IsInf(rps, 0) || rps < 0 {
		return lease{}
	}
	if strings.TrimLeft(s[3], "0123456789") != "" {
		return lease{}
	}
	until, err := strconv.ParseInt(s[3], 10, 64)
	if err != nil || until <= now.UnixMilli() {
		return lease{}
	}
	return lease{valid: true, rps: rps, until: time.UnixMilli(until)}
}

// Describe says when the gate closes.
func (g *Gate) Describe() string {
	return fmt.Sprintf("without a valid %s lease for pool %q in %s at %s (token bucket in %s, burst %gs of the rate; fails closed)",
		APIVersion, g.cfg.PoolID, g.cfg.ControlKey, g.where, g.cfg.StateKey, g.cfg.BurstSeconds)
}

// FailurePolicy is closed: without Redis nothing is admitted.
func (g *Gate) FailurePolicy() gate.FailurePolicy { return gate.FailClosed }

// Close releases the Redis client; it is idempotent.
func (g *Gate) Close() error {
	if err := g.client.Close(); err != nil && !errors.Is(err, redis.ErrClosed) {
		return err
	}
	return nil
}
