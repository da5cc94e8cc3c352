// Package redisquota is the gate of type "redis-quota": a per-tenant quota
// kept in Redis, upstream's redis-quota gate. The tenant is the value of one
// request metadata key (attribute, default "userid"); requests without it
// are not limited. In rate-limit mode a tenant gets limit admissions per
// sliding window; in concurrency mode limit requests at a time.
//
// The gate decides per request (gate.Admitter); its budget is always 1. An
// admitted request is classified "reserved", one over quota "overflow"; in
// blocking mode (the default) an over-quota request is deferred, in
// classifying mode it is admitted anyway and later gates or the merge
// lanes read its classification.
//
// Keys and scripts are upstream's (see scripts.go), so sluice and upstream
// replicas sharing a Redis count one quota. Differences:
//
//   - concurrency mode gives a dead holder's slot back: besides upstream's
//     counter, each sluice holder keeps a lease (tenant key + LeaseSuffix, a
//     sorted set scored by expiry) that it renews while it runs; the scripts
//     reap expired leases, decrementing the counter for each. Upstream leaks
//     the slot until the counter's TTL runs out, which every acquire
//     refreshes;
//   - two admissions in one nanosecond stay two entries (upstream's member is
//     the bare nanosecond, so they collapse into one);
//   - the clock is Redis' (TIME), not each replica's;
//   - an over-quota request is deferred until a slot can free: in rate-limit
//     mode until the oldest admission leaves the window, in concurrency mode
//     for defer_delay;
//   - unknown mode or gating_mode values, and a window ≤ 0, are errors
//     (upstream admits everything, or classifies without blocking);
//   - concurrent requests share Redis round trips: their scripts go out in
//     one pipeline (see conn);
//   - redis_mode cluster runs the quota on a Redis Cluster: tenants spread
//     over the masters by their keys' hash slots. The tenant keys keep
//     upstream's names; the lease set of a counter is renamed so that it
//     shares the counter's slot (see keys.go).
package redisquota

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/gates/internal/redisconn"
	"github.com/sluice-io/sluice/internal/mutant"
	"github.com/sluice-io/sluice/internal/redisclient"
)

// Type is the gate's registry name.
const Type = "redis-quota"

// Mode is what the quota counts.
type Mode string

// Modes.
const (
	// RateLimit admits at most Limit requests per tenant in any Window.
	RateLimit Mode = "rate-limit"
	// Concurrency admits at most Limit requests per tenant at a time.
	Concurrency Mode = "concurrency"
)

// GatingMode says what happens to a request over quota.
type GatingMode string

// Gating modes.
const (
	// Blocking defers a request over quota.
	Blocking GatingMode = "blocking"
	// Classifying admits every request; only the classification differs.
	Classifying GatingMode = "classifying"
)

// Defaults of the gate's parameters.
const (
	DefaultAttribute  = "userid"
	DefaultMode       = RateLimit
	DefaultWindow     = time.Minute
	DefaultPrefix     = "quota:"
	DefaultGatingMode = Blocking
	// DefaultLeaseTTL bounds how long a dead holder keeps a concurrency slot.
	DefaultLeaseTTL = 30 * time.Second
	// DefaultDeferDelay is how long a request over a concurrency quota waits
	// before it is asked again.
	DefaultDeferDelay = time.Second
	// MinLeaseTTL is the shortest lease TTL accepted: leases are renewed
	// every third of it, which must stay well above a Redis round trip.
	MinLeaseTTL = time.Second
)

// LeaseSuffix ends the name of a tenant key's lease set (concurrency mode):
// quota:userid:alice's leases are in quota:userid:alice:sluice-leases on a
// single node, and in {quota:userid:alice}:sluice-leases in a cluster (see
// Gate.LeaseSetKey).
const LeaseSuffix = ":sluice-leases"

// Config configures a Gate.
type Config struct {
	// Redis is the connection (Redis.Address is required: host:port, or a
	// redis:// or rediss:// URL; in cluster mode one node's host:port or a
	// cluster URL, redis://host:port?addr=host2:port2).
	Redis redisconn.Config

	// Attribute is the metadata key naming the tenant (default DefaultAttribute).
	Attribute string
	// Mode is what is counted (default DefaultMode).
	Mode Mode
	// Limit is the quota per tenant: admissions per Window, or requests at a
	// time (required, > 0).
	Limit int
	// Window is the rate-limit window (default DefaultWindow); in
	// concurrency mode it is the counter's TTL, as upstream's.
	Window time.Duration
	// Prefix starts every key (default DefaultPrefix).
	Prefix string
	// GatingMode says what happens over quota (default DefaultGatingMode).
	GatingMode GatingMode
	// LeaseTTL bounds how long a concurrency slot outlives a holder that
	// died (default DefaultLeaseTTL, at least MinLeaseTTL). A live holder
	// renews its lease every LeaseTTL/3, up to its request's deadline.
	LeaseTTL time.Duration
	// DeferDelay is how long a request over a concurrency quota is deferred
	// in blocking mode (default DefaultDeferDelay).
	DeferDelay time.Duration
	// Logger receives release and renewal failures (default slog.Default()).
	Logger *slog.Logger
}

func (c *Config) setDefaults() {
	if c.Attribute == "" {
		c.Attribute = DefaultAttribute
	}
	if c.Mode == "" {
		c.Mode = DefaultMode
	}
	if c.Window == 0 {
		c.Window = DefaultWindow
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if c.GatingMode == "" {
		c.GatingMode = DefaultGatingMode
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = DefaultLeaseTTL
	}
	if c.DeferDelay == 0 {
		c.DeferDelay = DefaultDeferDelay
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Validate reports an unusable configuration (after defaults), except the
// connection settings, which New checks.
func (c Config) Validate() error {
	switch {
	case c.Mode != RateLimit && c.Mode != Concurrency:
		return fmt.Errorf("gate_params.mode %q: want %s or %s (upstream silently admits every request)",
			c.Mode, RateLimit, Concurrency)
	case c.GatingMode != Blocking && c.GatingMode != Classifying:
		return fmt.Errorf("gate_params.gating_mode %q: want %s or %s (upstream silently treats it as classifying)",
			c.GatingMode, Blocking, Classifying)
	case c.Limit <= 0:
		return fmt.Errorf("gate_params.limit %d: want an integer > 0", c.Limit)
	case c.Window <= 0:
		return fmt.Errorf("gate_params.window %v: want a duration > 0", c.Window)
	case c.LeaseTTL < MinLeaseTTL:
		return fmt.Errorf("gate_params.lease_ttl %v: want at least %v", c.LeaseTTL, MinLeaseTTL)
	case c.DeferDelay < 0:
		return fmt.Errorf("gate_params.defer_delay %v: want a duration ≥ 0", c.DeferDelay)
	}
	return nil
}

// Gate is a per-tenant quota in Redis. It is safe for concurrent use.
type Gate struct {
	cfg       Config
	c         *conn
	put       func(*conn) error // gives the connection back (closing it after the last gate)
	keyPrefix string            // prefix + attribute + ":"
	keys      *keySpace         // lease set names
	what      string            // "5 requests per 1m0s", for reasons
	// script arguments fixed by the configuration
	ttlSecs      int64 // concurrency: the counter's TTL; rate-limit: the set's
	windowUS     int64
	windowNSRest int64

	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error
}

var (
	_ gate.Gate      = (*Gate)(nil)
	_ gate.Admitter  = (*Gate)(nil)
	_ gate.Describer = (*Gate)(nil)
)

// New validates cfg and returns a gate with its own connection; it does
// not connect yet. Gates built by one NewFactory share connections instead.
func New(cfg Config) (*Gate, error) {
	return newGate(cfg, nil)
}

func newGate(cfg Config, shared *clients) (*Gate, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	o, where, err := cfg.options()
	if err != nil {
		return nil, err
	}
	if shared == nil {
		shared = &clients{}
	}
	g := &Gate{
		cfg:          cfg,
		c:            shared.get(cfg, o, where),
		put:          shared.put,
		keyPrefix:    cfg.Prefix + cfg.Attribute + ":",
		keys:         &keySpace{cluster: o.Mode() == redisclient.Cluster},
		windowUS:     int64(cfg.Window / time.Microsecond),
		windowNSRest: int64(cfg.Window % time.Microsecond),
	}
	// Upstream's TTLs: concurrency, the window in whole seconds or 300;
	// rate-limit, twice the window in whole seconds or 3600.
	if cfg.Mode == Concurrency {
		g.ttlSecs = int64(cfg.Window / time.Second)
		if g.ttlSecs <= 0 {
			g.ttlSecs = 300
		}
		g.what = strconv.Itoa(cfg.Limit) + " concurrent requests"
		g.c.useLeaseTTL(cfg.LeaseTTL)
	} else {
		g.ttlSecs = int64(2 * cfg.Window / time.Second)
		if g.ttlSecs <= 0 {
			g.ttlSecs = 3600
		}
		g.what = strconv.Itoa(cfg.Limit) + " requests per " + cfg.Window.String()
	}
	return g, nil
}

// NewFactory returns a factory for the registry. The gates it builds share
// one Redis connection per distinct connection setting (address,
// credentials, db, TLS), as upstream shares one client per address, so the
// scripts of all of them go out in common pipelines; the last gate using a
// connection closes it.
//
// Parameters: address (required), attribute, mode, limit (required),
// window, prefix, gating_mode (upstream's); lease_ttl, defer_delay,
// redis_mode (default: the deployment's redis_mode), and username,
// password, db, tls, tls_ca_cert, tls_cert, tls_key,
// tls_insecure_skip_verify (sluice's).
func NewFactory() gate.Factory {
	shared := &clients{}
	return func(p gate.Params, env gate.Env) (gate.Gate, error) {
		cfg, err := configFrom(p, env)
		if err != nil {
			return nil, err
		}
		return newGate(cfg, shared)
	}
}

// configFrom reads gate_params as upstream reads them.
func configFrom(p gate.Params, env gate.Env) (Config, error) {
	conn, err := redisconn.FromParams(p, "", env)
	if err != nil {
		return Config{}, err
	}
	cfg := Config{
		Redis:      conn,
		Attribute:  p.String("attribute", DefaultAttribute),
		Mode:       Mode(p.String("mode", string(DefaultMode))),
		Prefix:     p.String("prefix", DefaultPrefix),
		GatingMode: GatingMode(p.String("gating_mode", string(DefaultGatingMode))),
	}
	if !p.Has("limit") {
		p.String("limit", "") // marks it read
		return Config{}, errors.New("gate_params.limit: required (an integer > 0)")
	}
	if cfg.Limit, err = p.Int("limit", 0); err != nil {
		return Config{}, err
	}
	// Upstream's duration reader: a Go duration string; a bare number (no
	// unit) is an error, unlike sluice's own duration parameters.
	if s := p.String("window", ""); s != "" {
		if cfg.Window, err = time.ParseDuration(strings.TrimSpace(s)); err != nil {
			return Config{}, fmt.Errorf("gate_params.window: %q is not a duration (want a Go duration such as \"1m\"; a bare number has no unit)", s)
		}
		if cfg.Window <= 0 {
			return Config{}, fmt.Errorf("gate_params.window %q: want a duration > 0 (upstream admits every request in rate-limit mode)", s)
		}
	}
	if cfg.LeaseTTL, err = p.Duration("lease_ttl", 0); err != nil {
		return Config{}, err
	}
	if p.Has("lease_ttl") && cfg.LeaseTTL <= 0 {
		return Config{}, fmt.Errorf("gate_params.lease_ttl %v: want at least %v", cfg.LeaseTTL, MinLeaseTTL)
	}
	if cfg.DeferDelay, err = p.Duration("defer_delay", 0); err != nil {
		return Config{}, err
	}
	if p.Has("defer_delay") && cfg.DeferDelay <= 0 {
		return Config{}, fmt.Errorf("gate_params.defer_delay %v: want a duration > 0", cfg.DeferDelay)
	}
	if err := p.Unused(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// Budget is always 1: the quota acts per request.
func (g *Gate) Budget(context.Context) (float64, error) { return 1, nil }

// Key returns the Redis key of a tenant: prefix + attribute + ":" + value
// (upstream's), in both Redis modes.
func (g *Gate) Key(value string) string { return g.keyPrefix + value }

// LeaseSetKey returns the lease set of a tenant (concurrency mode): Key +
// LeaseSuffix on a single node; in a cluster a name in Key's hash slot, so
// that a script can touch both (see keys.go): {Key}:sluice-leases, or Key +
// LeaseSuffix when Key has a hash tag of its own.
func (g *Gate) LeaseSetKey(value string) string { return g.keys.leaseSet(g.Key(value)) }

// Admit counts the request against its tenant's quota (one script, in a
// pipeline shared with concurrent requests). A request without the
// attribute is admitted as it is. Otherwise it is classified reserved
// (admitted; in concurrency mode with a Release giving the slot back) or
// overflow (deferred in blocking mode, admitted in classifying mode). A
// Redis error is returned as it is, the classification untouched.
func (g *Gate) Admit(ctx context.Context, req *wire.Request) (gate.Decision, error) {
	v, ok := req.Metadata[g.cfg.Attribute]
	if !ok {
		return gate.Admitted, nil
	}
	if g.closed.Load() {
		return gate.Decision{}, gate.ErrGateClosed
	}
	key := g.Key(v)
	o := &op{keys: []string{key}}
	if g.cfg.Mode == Concurrency {
		l := &lease{id: g.c.newID(), keys: []string{key, g.keys.leaseSet(key)}, ttlSecs: g.ttlSecs,
			leaseTTL: g.cfg.LeaseTTL, deadline: req.Deadline}
		now := time.Now()
		l.renewAfter = now.Add(l.leaseTTL / 3)
		o.script, o.keys, o.lease = acquireScript, l.keys, l
		o.args = []any{g.cfg.Limit, g.ttlSecs, l.id, l.span(now).Milliseconds()}
	} else {
		o.script = rateLimitScript
		o.args = []any{g.cfg.Limit, g.windowUS, g.windowNSRest, g.ttlSecs, g.c.newID()}
	}
	r, err := g.c.do(ctx, o)
	if err != nil {
		return gate.Decision{}, fmt.Errorf("redis-quota %s: %w", key, err)
	}
	if r.admitted {
		req.SetClassification(wire.ClassReserved)
		d := gate.Admitted
		if o.lease != nil {
			l := o.lease
			d.Release = sync.OnceFunc(func() { g.c.release(l) })
			if mutant.On(mutant.QuotaReleaseTwice) {
				d.Release = func() { g.c.release(l) } // planted: not once-only
			}
		}
		return d, nil
	}
	req.SetClassification(wire.ClassOverflow)
	if g.cfg.GatingMode == Classifying {
		return gate.Admitted, nil
	}
	delay := g.cfg.DeferDelay
	if g.cfg.Mode == RateLimit {
		delay = r.wait
	}
	return gate.Decision{Verdict: gate.Defer, Delay: delay,
		Reason: fmt.Sprintf("%s %q over its quota of %s", g.cfg.Attribute, v, g.what)}, nil
}

// Describe says what the gate limits.
func (g *Gate) Describe() string {
	over := "defer"
	if g.cfg.GatingMode == Classifying {
		over = "admit as overflow"
	}
	return fmt.Sprintf("per %s (metadata), %s at %s (keys %s<value>); over quota: %s",
		g.cfg.Attribute, g.what, g.c.where, g.keyPrefix, over)
}

// Close gives the gate's connection back (the last gate using it closes
// it, after writing queued releases); it is idempotent. Afterwards Admit
// fails with gate.ErrGateClosed for requests it would count, and a Release
// still owed is sent while another gate keeps the connection open, or else
// dropped (logged; its lease expires on its own).
func (g *Gate) Close() error {
	g.closeOnce.Do(func() {
		g.closed.Store(true)
		g.closeErr = g.put(g.c)
	})
	return g.closeErr
}

// pipelines returns the number of pipelines (round trips) and scripts the
// gate's connection sent, for the benchmark.
func (g *Gate) pipelines() (pipelines, scripts int64) {
	return g.c.pipelines.Load(), g.c.scripts.Load()
}
