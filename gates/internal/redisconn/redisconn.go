// Package redisconn turns the Redis connection parameters the Redis-backed
// gates share (address as host:port or a redis:// / rediss:// URL,
// redis_mode, redis_addrs, redis_master_name, username, password, db, tls,
// tls_ca_cert, tls_cert, tls_key, tls_insecure_skip_verify) into go-redis
// options, through internal/redisclient so that a gate reads a cluster or
// sentinel topology as the rest of sluice does. Each gate then sets its own
// pool and retry policy.
package redisconn

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/internal/redisclient"
)

// Config is a Redis connection as the gates' parameters give it.
type Config struct {
	// Address is host:port, or a redis:// or rediss:// URL carrying its own
	// credentials, db and TLS. In cluster mode host:port is one node (the
	// client finds the others), and the URL may list more nodes with
	// addr= parameters: redis://host:port?addr=host2:port2.
	Address string
	// Mode is how Address is reached: redisclient.Single ("" too),
	// redisclient.Cluster or redisclient.Sentinel (Address is a sentinel).
	Mode redisclient.Mode
	// Addrs are more cluster nodes or sentinels beside Address
	// (redis_addrs).
	Addrs []string
	// MasterName is the master the sentinels monitor (redis_master_name;
	// sentinel mode only, required there).
	MasterName string
	// Username, Password, DB and TLS apply when Address is host:port.
	// DB must be 0 in cluster mode; in sentinel mode they are the master's.
	Username string
	Password string
	DB       int
	TLS      bool
	// TLSCACert is a PEM file of CAs to trust (TLS or rediss:// only).
	TLSCACert string
	// TLSCert and TLSKey are a client certificate and its key, PEM files,
	// for servers that require one (TLS or rediss:// only; both or neither).
	TLSCert, TLSKey string
	// TLSInsecureSkipVerify disables certificate checks (TLS or rediss:// only).
	TLSInsecureSkipVerify bool
}

// FromParams reads the connection parameters from p: address
// (default defaultAddress), redis_mode, redis_addrs and redis_master_name
// (default, when none of them is set: the deployment's redis_mode,
// redis_addrs and redis_master_name in env), username, password, db, tls,
// tls_ca_cert, tls_cert, tls_key and tls_insecure_skip_verify. Errors name
// the parameter.
func FromParams(p gate.Params, defaultAddress string, env gate.Env) (Config, error) {
	top, err := TopologyFromParams(p, env)
	if err != nil {
		return Config{}, err
	}
	c := Config{
		Address:    p.String("address", defaultAddress),
		Mode:       top.Mode,
		Addrs:      top.Addrs,
		MasterName: top.MasterName,
		Username:   p.String("username", ""),
		Password:   p.String("password", ""),
		TLSCACert:  p.String("tls_ca_cert", ""),
		TLSCert:    p.String("tls_cert", ""),
		TLSKey:     p.String("tls_key", ""),
	}
	if c.DB, err = p.Int("db", 0); err != nil {
		return Config{}, err
	}
	if c.TLS, err = boolParam(p, "tls"); err != nil {
		return Config{}, err
	}
	if c.TLSInsecureSkipVerify, err = boolParam(p, "tls_insecure_skip_verify"); err != nil {
		return Config{}, err
	}
	return c, nil
}

// TopologyFromParams reads redis_mode, redis_addrs (a JSON array of
// host:port, or a string of them separated by commas) and
// redis_master_name; when none is set, the deployment's (env) apply as a
// whole. Errors name the parameters.
func TopologyFromParams(p gate.Params, env gate.Env) (redisclient.Topology, error) {
	if !p.Has("redis_mode") && !p.Has("redis_addrs") && !p.Has("redis_master_name") {
		t, err := redisclient.ParseTopology(env.RedisMode, env.RedisAddrs, env.RedisMasterName)
		if err != nil {
			return t, fmt.Errorf("the deployment's redis_mode, redis_addrs, redis_master_name: %w", err)
		}
		return t, nil
	}
	var addrs []string
	if raw := p.Raw("redis_addrs"); raw != nil {
		if err := json.Unmarshal(raw, &addrs); err != nil {
			return redisclient.Topology{}, fmt.Errorf("gate_params.redis_addrs: want an array of host:port strings: %w", err)
		}
	} else {
		for a := range strings.SplitSeq(p.String("redis_addrs", ""), ",") {
			if a = strings.TrimSpace(a); a != "" {
				addrs = append(addrs, a)
			}
		}
	}
	t, err := redisclient.ParseTopology(p.String("redis_mode", ""), addrs, p.String("redis_master_name", ""))
	if err != nil {
		return t, fmt.Errorf("gate_params.redis_mode, redis_addrs, redis_master_name: %w", err)
	}
	return t, nil
}

func boolParam(p gate.Params, key string) (bool, error) {
	s := p.String(key, "false")
	b, err := strconv.ParseBool(strings.TrimSpace(s))
	if err != nil {
		return false, fmt.Errorf("gate_params.%s: %q is not a boolean", key, s)
	}
	return b, nil
}

// Key identifies the connection settings: configs with equal keys may
// share one client.
func (c Config) Key() string {
	return strings.Join([]string{c.Address, string(c.Mode), strings.Join(c.Addrs, ","), c.MasterName, c.Username, c.Password, strconv.Itoa(c.DB),
		strconv.FormatBool(c.TLS), c.TLSCACert, c.TLSCert, c.TLSKey, strconv.FormatBool(c.TLSInsecureSkipVerify)}, "\x00")
}

// IsURL reports whether addr is a redis:// or rediss:// URL.
func IsURL(addr string) bool {
	return strings.HasPrefix(addr, "redis://") || strings.HasPrefix(addr, "rediss://")
}

// Options validates c (Address must be set) and returns the client options
// it stands for, in either mode, with what every gate wants: no retries
// (MaxRetries -1: a gate's caller asks again), a short dial timeout, the
// caller's context bounding each command, no client identity (CLIENT
// SETINFO) and no maintenance notifications. Errors name the parameter.
func (c Config) Options() (*redisclient.Options, error) {
	mode := c.Mode
	if mode == "" {
		mode = redisclient.Single
	}
	top := redisclient.Topology{Mode: mode, Addrs: c.Addrs, MasterName: c.MasterName}
	if err := top.Validate(); err != nil {
		return nil, fmt.Errorf("gate_params.redis_mode, redis_addrs, redis_master_name: %w", err)
	}
	var o *redisclient.Options
	var serverName string // host:port with tls: the name to check
	if IsURL(c.Address) {
		if c.Username != "" || c.Password != "" || c.DB != 0 || c.TLS {
			return nil, errors.New("username, password, db and tls go in the address URL when address is a URL")
		}
		if mode == redisclient.Cluster {
			if err := clusterURLDB(c.Address); err != nil {
				return nil, err
			}
		}
		var err error
		if o, err = top.Parse(c.Address); err != nil {
			return nil, fmt.Errorf("gate_params.address: %w", err)
		}
	} else {
		if _, _, err := net.SplitHostPort(c.Address); err != nil {
			return nil, fmt.Errorf("gate_params.address %q: want host:port or a redis:// or rediss:// URL", c.Address)
		}
		if c.DB < 0 {
			return nil, fmt.Errorf("gate_params.db %d is negative", c.DB)
		}
		var err error
		if o, err = top.FromAddr(c.Address, c.Username, c.Password, c.DB); err != nil {
			return nil, fmt.Errorf("gate_params.db: %w", err)
		}
		if c.TLS {
			serverName = hostOf(c.Address)
		}
	}
	var terr error
	o.Tune(func(cm *redisclient.Common) {
		if serverName != "" {
			cm.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName}
		}
		terr = c.tlsExtras(cm.TLSConfig)
		cm.MinIdleConns = 0
		cm.MaxRetries = -1
		cm.DialTimeout = 2 * time.Second
		cm.ContextTimeoutEnabled = true
		cm.DisableIdentity = true
		cm.MaintNotifications = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	})
	if terr != nil {
		return nil, terr
	}
	return o, nil
}

// tlsExtras applies the CA, client certificate and skip-verify parameters
// to tc (nil: no TLS, and then none of them may be set).
func (c Config) tlsExtras(tc *tls.Config) error {
	if c.TLSCACert == "" && c.TLSCert == "" && c.TLSKey == "" && !c.TLSInsecureSkipVerify {
		return nil
	}
	if tc == nil {
		return errors.New("tls_ca_cert, tls_cert, tls_key and tls_insecure_skip_verify need tls=true or a rediss:// address")
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		return errors.New("tls_cert and tls_key go together")
	}
	if c.TLSCert != "" {
		pair, err := tls.LoadX509KeyPair(c.TLSCert, c.TLSKey)
		if err != nil {
			return fmt.Errorf("tls_cert/tls_key: %w", err)
		}
		tc.Certificates = []tls.Certificate{pair}
	}
	tc.InsecureSkipVerify = c.TLSInsecureSkipVerify
	if c.TLSCACert != "" {
		pem, err := os.ReadFile(c.TLSCACert)
		if err != nil {
			return fmt.Errorf("tls_ca_cert: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("tls_ca_cert %s: no PEM certificate", c.TLSCACert)
		}
		tc.RootCAs = pool
	}
	return nil
}

// clusterURLDB refuses a cluster URL that selects a database other than 0:
// go-redis ignores the path of a cluster URL, and a cluster has only db 0.
func clusterURLDB(addr string) error {
	u, err := url.Parse(addr)
	if err != nil {
		return fmt.Errorf("gate_params.address: %w", err)
	}
	if p := strings.Trim(u.Path, "/"); p != "" && p != "0" {
		return fmt.Errorf("gate_params.address: db %q: a Redis Cluster has only db 0 (drop the /%s)", p, p)
	}
	return nil
}

// Where describes the server(s) of o without credentials, for messages
// (redisclient.Options.Where).
func Where(o *redisclient.Options) string { return o.Where() }

func hostOf(addr string) string {
	h, _, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	return h
}
