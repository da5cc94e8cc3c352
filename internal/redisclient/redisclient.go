// Package redisclient builds the go-redis client of a Redis URL in one of
// three modes: a single server (or a proxy in front of many), a Redis
// Cluster, or a master found through Redis Sentinel. It is the one place
// where sluice's Redis users — the Redis transports, the sorted-set
// producer library, the CLI and the Redis gates — turn "URL + topology"
// into a client, so that every one of them reads the topology the same way.
//
// The topology (Topology) is upstream's (llm-d-async after #491): mode
// standalone (sluice's single), cluster or sentinel; addrs, more cluster
// seed nodes or sentinel addresses beside the URL's host; master_name, the
// master the sentinels monitor. The URL carries the credentials, TLS and
// database in every mode.
//
// A cluster URL may also be go-redis's: redis://[user:password@]host:port?addr=host2:port2&addr=host3:port3
// (rediss:// for TLS). Any node is enough to find the others; listing more
// lets the client start while one of them is down.
//
// In sentinel mode the URL's host is a sentinel (as upstream), and its
// user and password are the master's (and its replicas'): the sentinels
// themselves are asked without AUTH, as upstream does. The URL may carry
// addr= and master_name= parameters (go-redis's failover URL form); they
// are merged with addrs and must agree with master_name.
package redisclient

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	neturl "net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/sluice-io/sluice/internal/redistopology"
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

// Mode is how a Redis URL is reached (internal/redistopology's).
type Mode = redistopology.Mode

// Modes.
const (
	// Single is one server (default): every key on one node.
	Single = redistopology.Single
	// Cluster is a Redis Cluster: keys spread over the nodes by hash slot;
	// the client follows MOVED/ASK redirections and failovers.
	Cluster = redistopology.Cluster
	// Sentinel is one master with replicas watched by Redis Sentinel: the
	// client asks the sentinels for the master of Topology.MasterName and
	// follows it when they promote a replica. Keys are as in Single.
	Sentinel = redistopology.Sentinel
)

// ParseMode reads a mode; "" is Single, and "standalone" (upstream's name)
// is accepted for it (redistopology.ParseMode).
func ParseMode(s string) (Mode, error) { return redistopology.ParseMode(s) }

// Topology is how a Redis URL is reached, beyond the URL itself: upstream's
// mode, addrs and master_name. The zero value is a single server.
type Topology struct {
	// Mode is Single ("" too), Cluster or Sentinel.
	Mode Mode
	// Addrs are host:port addresses beside the URL's host: more seed nodes
	// of a cluster, or more sentinels. Only with Cluster or Sentinel.
	Addrs []string
	// MasterName is the name the sentinels monitor the master under:
	// required with Sentinel, refused otherwise.
	MasterName string
}

// ParseTopology reads a topology as configuration gives it: mode as text
// (see ParseMode), addrs and master_name. It validates the result.
func ParseTopology(mode string, addrs []string, masterName string) (Topology, error) {
	m, err := ParseMode(mode)
	if err != nil {
		return Topology{}, err
	}
	t := Topology{Mode: m, Addrs: addrs, MasterName: strings.TrimSpace(masterName)}
	return t, t.Validate()
}

// Or returns t, or def when t says nothing (no mode, addrs or master name):
// a component that names no topology of its own takes the deployment's as
// a whole, never a mix of both.
func (t Topology) Or(def Topology) Topology {
	if t.Mode == "" && len(t.Addrs) == 0 && t.MasterName == "" {
		return def
	}
	return t
}

// Validate checks the fields against each other with internal/redistopology's
// rules (upstream's): addrs need cluster or sentinel,
// master_name needs sentinel, sentinel needs master_name, and every
// address is host:port.
func (t Topology) Validate() error {
	_, err := t.check()
	return err
}

// check validates t and returns its mode read as ParseMode does (so that
// "" and "standalone" are Single).
func (t Topology) check() (Mode, error) {
	if _, err := ParseMode(string(t.Mode)); err != nil {
		return "", err
	}
	m, ps := redistopology.Check(redistopology.Options, string(t.Mode), t.Addrs, t.MasterName)
	errs := make([]error, len(ps))
	for i, p := range ps {
		errs[i] = errors.New(p.String())
	}
	return m, errors.Join(errs...)
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

// Options are the parsed options of one client; exactly one of Single,
// Cluster and Failover is set.
type Options struct {
	Single   *redis.Options
	Cluster  *redis.ClusterOptions
	Failover *redis.FailoverOptions
}

// Parse parses url in mode (a topology with no addrs or master name; see
// Topology.Parse).
func Parse(url string, mode Mode) (*Options, error) {
	return Topology{Mode: mode}.Parse(url)
}

// Parse validates t and parses url in it. A URL with addr= parameters in
// single mode is refused with a hint, since go-redis would otherwise reject
// it with a message that does not say why.
func (t Topology) Parse(url string) (*Options, error) {
	if url == "" {
		return nil, errors.New("no Redis URL")
	}
	m, err := t.check()
	if err != nil {
		return nil, err
	}
	switch m {
	case Cluster:
		co, err := redis.ParseClusterURL(url)
		if err != nil {
			return nil, fmt.Errorf("redis cluster url: %w", err)
		}
		co.Addrs = union(co.Addrs, t.Addrs)
		co.ClusterStateReloadInterval = ClusterStateReload
		return &Options{Cluster: co}, nil
	case Sentinel:
		return t.parseSentinel(url)
	}
	o, err := redis.ParseURL(url)
	if err != nil {
		if strings.Contains(url, "addr=") {
			return nil, fmt.Errorf("redis url: %w (addr= lists the nodes of a cluster or the sentinels: set the redis mode to cluster or sentinel)", err)
		}
		if strings.Contains(url, "master_name=") {
			return nil, fmt.Errorf("redis url: %w (master_name= names a sentinel-monitored master: set the redis mode to sentinel)", err)
		}
		return nil, fmt.Errorf("redis url: %w", err)
	}
	return &Options{Single: o}, nil
}

// parseSentinel reads url as upstream does in sentinel mode (its host is a
// sentinel; credentials, TLS and db are the master's), after taking out the
// addr= and master_name= parameters of go-redis's failover form, which must
// agree with t.
func (t Topology) parseSentinel(raw string) (*Options, error) {
	u, err := neturl.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("redis url: %w", err)
	}
	q := u.Query()
	extra, names := q["addr"], q["master_name"]
	q.Del("addr")
	q.Del("master_name")
	u.RawQuery = q.Encode()
	for _, n := range names {
		if n != t.MasterName {
			return nil, fmt.Errorf("redis url: master_name=%s disagrees with master_name %q: give it once", n, t.MasterName)
		}
	}
	o, err := redis.ParseURL(u.String())
	if err != nil {
		return nil, fmt.Errorf("redis url: %w", err)
	}
	for _, a := range extra {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return nil, fmt.Errorf("redis url: addr=%s is not host:port", a)
		}
	}
	return &Options{Failover: &redis.FailoverOptions{
		MasterName:    t.MasterName,
		SentinelAddrs: union(union([]string{o.Addr}, extra), t.Addrs),
		ClientName:    o.ClientName, Protocol: o.Protocol,
		Username: o.Username, Password: o.Password, DB: o.DB,
		MaxRetries: o.MaxRetries, MinRetryBackoff: o.MinRetryBackoff, MaxRetryBackoff: o.MaxRetryBackoff,
		DialTimeout: o.DialTimeout, ReadTimeout: o.ReadTimeout, WriteTimeout: o.WriteTimeout,
		PoolFIFO: o.PoolFIFO, PoolSize: o.PoolSize, PoolTimeout: o.PoolTimeout,
		MinIdleConns: o.MinIdleConns, MaxIdleConns: o.MaxIdleConns, MaxActiveConns: o.MaxActiveConns,
		ConnMaxIdleTime: o.ConnMaxIdleTime, ConnMaxLifetime: o.ConnMaxLifetime,
		TLSConfig: o.TLSConfig,
	}}, nil
}

// union is a followed by the elements of b it lacks.
func union(a, b []string) []string {
	out := append([]string(nil), a...)
	for _, x := range b {
		if !slices.Contains(out, x) {
			out = append(out, x)
		}
	}
	return out
}

// FromAddr returns options for a bare host:port in mode (the gates accept
// one); see Topology.FromAddr.
func FromAddr(addr, username, password string, db int, mode Mode) (*Options, error) {
	return Topology{Mode: mode}.FromAddr(addr, username, password, db)
}

// FromAddr validates t and returns options for a bare host:port in it (the
// gates accept one): a node of a cluster, or a sentinel. username, password
// and db apply to every mode (db must be 0 in a cluster); in sentinel mode
// they are the master's.
func (t Topology) FromAddr(addr, username, password string, db int) (*Options, error) {
	m, err := t.check()
	if err != nil {
		return nil, err
	}
	switch m {
	case Cluster:
		if db != 0 {
			return nil, errors.New("db must be 0 with a Redis Cluster (a cluster has one database)")
		}
		return &Options{Cluster: &redis.ClusterOptions{Addrs: union([]string{addr}, t.Addrs), Username: username, Password: password,
			ClusterStateReloadInterval: ClusterStateReload}}, nil
	case Sentinel:
		return &Options{Failover: &redis.FailoverOptions{MasterName: t.MasterName, SentinelAddrs: union([]string{addr}, t.Addrs),
			Username: username, Password: password, DB: db}}, nil
	}
	return &Options{Single: &redis.Options{Addr: addr, Username: username, Password: password, DB: db}}, nil
}

// Tune lets f edit the settings every mode shares. A failover client has
// no maintenance notifications (go-redis does not support them there):
// f's MaintNotifications is ignored in sentinel mode.
func (o *Options) Tune(f func(c *Common)) {
	if x := o.Cluster; x != nil {
		tune(f, &x.TLSConfig, &x.PoolSize, &x.MinIdleConns, &x.MaxRetries, &x.DialTimeout, &x.ReadTimeout, &x.WriteTimeout,
			&x.ContextTimeoutEnabled, &x.DisableIdentity, &x.MaintNotificationsConfig)
		return
	}
	if x := o.Failover; x != nil {
		var maint *maintnotifications.Config
		tune(f, &x.TLSConfig, &x.PoolSize, &x.MinIdleConns, &x.MaxRetries, &x.DialTimeout, &x.ReadTimeout, &x.WriteTimeout,
			&x.ContextTimeoutEnabled, &x.DisableIdentity, &maint)
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
	switch {
	case o.Single != nil:
		return o.Single.DB
	case o.Failover != nil:
		return o.Failover.DB
	}
	return 0
}

// Mode reports the options' mode.
func (o *Options) Mode() Mode {
	switch {
	case o.Cluster != nil:
		return Cluster
	case o.Failover != nil:
		return Sentinel
	}
	return Single
}

// Where describes the server(s) of o without credentials, for messages:
// host:port[/db] in single mode, "cluster host:port,host2:port2" in
// cluster mode, "sentinel master <name> via host:port,…[/db]" in sentinel
// mode.
func (o *Options) Where() string {
	switch {
	case o.Cluster != nil:
		return "cluster " + strings.Join(o.Cluster.Addrs, ",")
	case o.Failover != nil:
		return "sentinel master " + o.Failover.MasterName + " via " + strings.Join(o.Failover.SentinelAddrs, ",") + db(o.Failover.DB)
	}
	return o.Single.Addr + db(o.Single.DB)
}

func db(n int) string {
	if n == 0 {
		return ""
	}
	return "/" + strconv.Itoa(n)
}

// New returns the client of o.
func (o *Options) New() redis.UniversalClient {
	switch {
	case o.Cluster != nil:
		return redis.NewClusterClient(o.Cluster)
	case o.Failover != nil:
		return redis.NewFailoverClient(o.Failover)
	}
	return redis.NewClient(o.Single)
}

// NewClient returns the client of o for users that need a *redis.Client
// (one server: single or sentinel mode); in cluster mode it is an error.
func (o *Options) NewClient() (*redis.Client, error) {
	switch {
	case o.Cluster != nil:
		return nil, errors.New("a Redis Cluster has no single-server client")
	case o.Failover != nil:
		return redis.NewFailoverClient(o.Failover), nil
	}
	return redis.NewClient(o.Single), nil
}

// New parses url in mode and returns its client.
func New(url string, mode Mode) (redis.UniversalClient, error) {
	o, err := Parse(url, mode)
	if err != nil {
		return nil, err
	}
	return o.New(), nil
}
