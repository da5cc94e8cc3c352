// Package redisbudget is the gate of type "redis": the budget is a number an
// operator (or a controller) keeps in a Redis key.
//
// Semantics follow upstream's redis gate: GET budget_key; a missing key
// means 1 (open), a value that is not a number means 1, numbers are clamped
// to [0,1]. A Redis error is a failed query: by default the gate closes
// (budget 0, upstream's behaviour); failure_policy changes that.
//
// Unlike upstream, the address may carry credentials and TLS: a
// redis://[user:password@]host:port/db or rediss://... URL, or host:port
// with the password, username, db and tls parameters. With redis_mode
// cluster it is a Redis Cluster: host:port of one node, or go-redis'
// cluster URL redis://host:port?addr=host2:port2 (the key is read from the
// master of its slot, following MOVED and failovers).
package redisbudget

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/gates/internal/redisconn"
	"github.com/sluice-io/sluice/internal/redisclient"
)

// Type is the gate's registry name.
const Type = "redis"

// Defaults of the gate's parameters.
const (
	DefaultBudgetKey       = "dispatch-gate-budget"
	DefaultRefreshInterval = 50 * time.Millisecond
)

// Config configures a Gate.
type Config struct {
	// Redis is the connection (Redis.Address is required: host:port, or a
	// redis:// or rediss:// URL; in cluster mode one node's host:port or a
	// cluster URL).
	Redis redisconn.Config
	// BudgetKey is the key holding the budget (default DefaultBudgetKey).
	BudgetKey string
	// RefreshInterval is how often the key is read (default DefaultRefreshInterval).
	RefreshInterval time.Duration
}

func (c *Config) setDefaults() {
	if c.BudgetKey == "" {
		c.BudgetKey = DefaultBudgetKey
	}
	if c.RefreshInterval <= 0 {
		c.RefreshInterval = DefaultRefreshInterval
	}
}

// options validates c and returns the client options it stands for.
func (c Config) options() (*redisclient.Options, error) {
	if c.Redis.Address == "" {
		return nil, errors.New("no Redis address (set gate_params.address or REDIS_URL)")
	}
	o, err := c.Redis.Options()
	if err != nil {
		return nil, err
	}
	// One query at a time (per node in a cluster), bounded by the caller's
	// context; the refresh loop asks again soon. A cluster client follows
	// MOVED and ASK (up to go-redis' default 3 redirections) and may send
	// the GET again after a network error: GET is idempotent.
	o.Tune(func(c *redisclient.Common) { c.PoolSize = 2 })
	return o, nil
}

// Gate reads its budget from a Redis key. It is safe for concurrent use.
type Gate struct {
	cfg    Config
	client redis.UniversalClient
	where  string // address without credentials, for messages
	once   sync.Once
}

var (
	_ gate.Gate           = (*Gate)(nil)
	_ gate.Describer      = (*Gate)(nil)
	_ gate.PolicyReporter = (*Gate)(nil)
	_ gate.Intervaler     = (*Gate)(nil)
)

// New validates cfg and returns the gate; it does not connect yet.
func New(cfg Config) (*Gate, error) {
	cfg.setDefaults()
	o, err := cfg.options()
	if err != nil {
		return nil, err
	}
	return &Gate{cfg: cfg, client: o.New(), where: redisconn.Where(o)}, nil
}

// Factory builds the gate from gate_params: address (default: the
// deployment's Redis URL), redis_mode (default: the deployment's
// redis_mode), budget_key, username, password, db, tls, tls_ca_cert,
// tls_cert, tls_key, tls_insecure_skip_verify.
func Factory(p gate.Params, env gate.Env) (gate.Gate, error) {
	conn, err := redisconn.FromParams(p, env.RedisURL, env)
	if err != nil {
		return nil, err
	}
	cfg := Config{Redis: conn, BudgetKey: p.String("budget_key", DefaultBudgetKey)}
	if err := p.Unused(); err != nil {
		return nil, err
	}
	return New(cfg)
}

// Budget reads the key: missing or not a number means 1; numbers are
// clamped to [0,1]; a Redis error is returned.
func (g *Gate) Budget(ctx context.Context) (float64, error) {
	s, err := g.client.Get(ctx, g.cfg.BudgetKey).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return 1, nil
	case errors.Is(err, redis.ErrClosed):
		return 0, gate.ErrGateClosed
	case err != nil:
		return 0, fmt.Errorf("redis GET %s at %s: %w", g.cfg.BudgetKey, g.where, err)
	}
	return parse(s), nil
}

// parse turns the key's value into a budget the way upstream does.
func parse(s string) float64 {
	b, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || math.IsNaN(b) {
		return 1
	}
	return min(1, max(0, b))
}

// Describe says when the gate closes.
func (g *Gate) Describe() string {
	return fmt.Sprintf("when GET %s at %s is ≤ 0 (missing or unparsable: open; limit = ceil(max_concurrency × value))",
		g.cfg.BudgetKey, g.where)
}

// FailurePolicy is closed: a Redis error stops dispatching, as upstream.
func (g *Gate) FailurePolicy() gate.FailurePolicy { return gate.FailClosed }

// RefreshInterval is how often the key is read.
func (g *Gate) RefreshInterval() time.Duration { return g.cfg.RefreshInterval }

// Close closes the Redis client; it is idempotent.
func (g *Gate) Close() error {
	var err error
	g.once.Do(func() {
		if cerr := g.client.Close(); cerr != nil {
			err = fmt.Errorf("close redis gate client: %w", cerr)
		}
	})
	return err
}
