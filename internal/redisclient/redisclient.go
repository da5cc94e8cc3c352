// Package redisclient builds the go-redis client of a Redis URL in one of
// two modes: a single server (or a proxy in front of many), or a Redis
// Cluster. It is the one place where sluice's Redis users — the
// redis-sortedset transport, its producer library, the CLI and the Redis
// gates — turn "URL + mode" into a client, so that every one of them takes
// the cluster form of the URL the same way.
//
// A cluster URL is go-redis's: redis://[user:password@]host:port?addr=host2:port2&addr=host3:port3
// (rediss:// for TLS). Any node is enough to find the others; listing more
// lets the client start while one of them is down.
package redisclient

import (
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// DefaultURL is the Redis a transport uses when neither its options nor
// the deployment (REDIS_URL) name one.
const DefaultURL = "redis://localhost:6379/0"

// URL returns the first of own (a component's option) and deployment (the
// deployment's REDIS_URL) that is set, else DefaultURL.
func URL(own, deployment string) string {
	switch {
	case own != "":
		return own
	case deployment != "":
		return deployment
	}
	return DefaultURL
}

// Mode is how a Redis URL is reached.
type Mode string

// Modes.
const (
	// Single is one server (default): every key on one node.
	Single Mode = "single"
	// Cluster is a Redis Cluster: keys spread over the nodes by hash slot;
	// the client follows MOVED/ASK redirections and failovers.
	Cluster Mode = "cluster"
)

// ParseMode reads a mode; "" is Single, and "standalone" is accepted for it.
func ParseMode(s string) (Mode, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "single", "standalone":
		return Single, nil
	case "cluster":
		return Cluster, nil
	}
	return "", fmt.Errorf("redis mode %q: want single or cluster", s)
}

// ClusterStateReload is how often a cluster client re-reads the slot map
// when nothing tells it earlier. go-redis's default (60 s) would leave a
// client writing to a dead master for a minute after a failover; a MOVED
// reply or a connection error also triggers a reload.
const ClusterStateReload = time.Second

// Common are the client settings both modes share; Options.Tune edits them.
type Common struct {
	// TLSConfig is the URL's TLS (nil for redis://).
	TLSConfig *tls.Config
	// PoolSize is per node in cluster mode.
	PoolSize, MinIdleConns, MaxRetries     int
	DialTimeout, ReadTimeout, WriteTimeout time.Duration
	ContextTimeoutEnabled, DisableIdentity bool
	MaintNotifications                     *maintnotifications.Config
}

// Options are the parsed options of one client; exactly one of Single and
// Cluster is set.
type Options struct {
	Single  *redis.Options
	Cluster *redis.ClusterOptions
}

// Parse parses url in mode. A URL with addr= parameters in single mode is
// refused with a hint, since go-redis would otherwise reject it with a
// message that does not say why.
func Parse(url string, mode Mode) (*Options, error) {
	if url == "" {
		return nil, errors.New("no Redis URL")
	}
	switch mode {
	case Cluster:
		co, err := redis.ParseClusterURL(url)
		if err != nil {
			return nil, fmt.Errorf("redis cluster url: %w", err)
		}
		co.ClusterStateReloadInterval = ClusterStateReload
		return &Options{Cluster: co}, nil
	case Single, "":
		o, err := redis.ParseURL(url)
		if err != nil {
			if strings.Contains(url, "addr=") {
				return nil, fmt.Errorf("redis url: %w (addr= lists the nodes of a cluster: set the redis mode to cluster)", err)
			}
			return nil, fmt.Errorf("redis url: %w", err)
		}
		return &Options{Single: o}, nil
	}
	return nil, fmt.Errorf("redis mode %q: want single or cluster", mode)
}

// FromAddr returns options for a bare host:port in mode (the gates accept
// one); username, password and db apply to both modes (db must be 0 in a
// cluster).
func FromAddr(addr, username, password string, db int, mode Mode) (*Options, error) {
	if mode == Cluster {
		if db != 0 {
			return nil, errors.New("db must be 0 with a Redis Cluster (a cluster has one database)")
		}
		return &Options{Cluster: &redis.ClusterOptions{Addrs: []string{addr}, Username: username, Password: password,
			ClusterStateReloadInterval: ClusterStateReload}}, nil
	}
	return &Options{Single: &redis.Options{Addr: addr, Username: username, Password: password, DB: db}}, nil
}

// Tune lets f edit the settings both modes share.
func (o *Options) Tune(f func(c *Common)) {
	if x := o.Cluster; x != nil {
		tune(f, &x.TLSConfig, &x.PoolSize, &x.MinIdleConns, &x.MaxRetries, &x.DialTimeout, &x.ReadTimeout, &x.WriteTimeout,
			&x.ContextTimeoutEnabled, &x.DisableIdentity, &x.MaintNotificationsConfig)
		return
	}
	x := o.Single
	tune(f, &x.TLSConfig, &x.PoolSize, &x.MinIdleConns, &x.MaxRetries, &x.DialTimeout, &x.ReadTimeout, &x.WriteTimeout,
		&x.ContextTimeoutEnabled, &x.DisableIdentity, &x.MaintNotificationsConfig)
}

// tune copies the fields one options struct shares with Common out, lets f
// edit them, and copies them back.
func tune(f func(*Common), tc **tls.Config, pool, minIdle, retries *int, dial, read, write *time.Duration,
	ctxTimeout, noIdentity *bool, maint **maintnotifications.Config) {
	c := Common{*tc, *pool, *minIdle, *retries, *dial, *read, *write, *ctxTimeout, *noIdentity, *maint}
	f(&c)
	*tc, *pool, *minIdle, *retries = c.TLSConfig, c.PoolSize, c.MinIdleConns, c.MaxRetries
	*dial, *read, *write = c.DialTimeout, c.ReadTimeout, c.WriteTimeout
	*ctxTimeout, *noIdentity, *maint = c.ContextTimeoutEnabled, c.DisableIdentity, c.MaintNotifications
}

// DB is the database the options select (always 0 in a cluster).
func (o *Options) DB() int {
	if o.Single != nil {
		return o.Single.DB
	}
	return 0
}

// Mode reports the options' mode.
func (o *Options) Mode() Mode {
	if o.Cluster != nil {
		return Cluster
	}
	return Single
}

// New returns the client of o.
func (o *Options) New() redis.UniversalClient {
	if o.Cluster != nil {
		return redis.NewClusterClient(o.Cluster)
	}
	return redis.NewClient(o.Single)
}

// New parses url in mode and returns its client.
func New(url string, mode Mode) (redis.UniversalClient, error) {
	o, err := Parse(url, mode)
	if err != nil {
		return nil, err
	}
	return o.New(), nil
}
