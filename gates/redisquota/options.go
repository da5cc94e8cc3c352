package redisquota

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// The Redis connection options follow gates/redisbudget (adapters do not
// import each other): host:port with username, password, db and tls, or a
// redis:// or rediss:// URL carrying its own.

func isURL(addr string) bool {
	return strings.HasPrefix(addr, "redis://") || strings.HasPrefix(addr, "rediss://")
}

// options validates the connection part of c and returns the go-redis
// options it stands for, and the address without credentials (for messages).
func (c Config) options() (*redis.Options, string, error) {
	if c.Address == "" {
		return nil, "", errors.New("gate_params.address: required (host:port or a redis:// URL)")
	}
	var o *redis.Options
	if isURL(c.Address) {
		if c.Username != "" || c.Password != "" || c.DB != 0 || c.TLS {
			return nil, "", errors.New("username, password, db and tls go in the address URL when address is a URL")
		}
		var err error
		if o, err = redis.ParseURL(c.Address); err != nil {
			return nil, "", fmt.Errorf("gate_params.address: %w", err)
		}
	} else {
		if _, _, err := net.SplitHostPort(c.Address); err != nil {
			return nil, "", fmt.Errorf("gate_params.address %q: want host:port or a redis:// or rediss:// URL", c.Address)
		}
		if c.DB < 0 {
			return nil, "", fmt.Errorf("gate_params.db %d is negative", c.DB)
		}
		o = &redis.Options{Addr: c.Address, Username: c.Username, Password: c.Password, DB: c.DB}
		if c.TLS {
			o.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, ServerName: hostOf(c.Address)}
		}
	}
	if c.TLSCACert != "" || c.TLSInsecureSkipVerify {
		if o.TLSConfig == nil {
			return nil, "", errors.New("tls_ca_cert and tls_insecure_skip_verify need tls=true or a rediss:// address")
		}
		o.TLSConfig.InsecureSkipVerify = c.TLSInsecureSkipVerify
		if c.TLSCACert != "" {
			pem, err := os.ReadFile(c.TLSCACert)
			if err != nil {
				return nil, "", fmt.Errorf("tls_ca_cert: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, "", fmt.Errorf("tls_ca_cert %s: no PEM certificate", c.TLSCACert)
			}
			o.TLSConfig.RootCAs = pool
		}
	}
	// One pipeline in flight per lane (see conn), each on a connection of
	// its own. No retries of dials or commands: a script that may have run
	// must not run twice (an acquire is not idempotent); the caller's error
	// path re-asks.
	o.PoolSize = lanes
	o.MinIdleConns = 0
	o.MaxRetries = -1
	o.DialTimeout = 2 * time.Second
	o.DialerRetries = 1 // a refused connection is an error now, not after 5 tries
	o.ContextTimeoutEnabled = true
	o.DisableIdentity = true
	o.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	where := o.Addr
	if o.DB != 0 {
		where += "/" + strconv.Itoa(o.DB)
	}
	return o, where, nil
}

// shareKey identifies the connection settings: gates whose settings are
// equal share one connection (and one pipeline).
func (c Config) shareKey() string {
	return strings.Join([]string{c.Address, c.Username, c.Password, strconv.Itoa(c.DB),
		strconv.FormatBool(c.TLS), c.TLSCACert, strconv.FormatBool(c.TLSInsecureSkipVerify)}, "\x00")
}

func hostOf(addr string) string {
	h, _, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	return h
}
