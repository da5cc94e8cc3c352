package redisquota

import (
	"errors"

	"github.com/sluice-io/sluice/gates/internal/redisconn"
	"github.com/sluice-io/sluice/internal/redisclient"
)

// options validates the connection part of c and returns the client
// options it stands for, and the address without credentials (for messages).
func (c Config) options() (*redisclient.Options, string, error) {
	if c.Redis.Address == "" {
		return nil, "", errors.New("gate_params.address: required (host:port or a redis:// URL)")
	}
	o, err := c.Redis.Options()
	if err != nil {
		return nil, "", err
	}
	// One pipeline in flight per lane (see conn), each on a connection of
	// its own (per node in a cluster). No retries of dials or commands: a
	// script that may have run must not run twice (an acquire is not
	// idempotent); the caller's error path re-asks. A cluster client keeps
	// go-redis' default of 3 redirections: it follows MOVED and ASK (a
	// redirected script did not run), and the scripts are sent as commands
	// that go-redis never re-sends after a network error (see noRetryCmd).
	o.Tune(func(c *redisclient.Common) { c.PoolSize = lanes })
	switch {
	case o.Cluster != nil:
		o.Cluster.DialerRetries = 1
	case o.Failover != nil:
		o.Failover.DialerRetries = 1
	default:
		o.Single.DialerRetries = 1 // a refused connection is an error now, not after 5 tries
	}
	return o, redisconn.Where(o), nil
}

// shareKey identifies the connection settings: gates whose settings are
// equal share one connection (and one pipeline).
func (c Config) shareKey() string {
	return c.Redis.Key()
}
