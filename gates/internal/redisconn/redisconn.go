// Package redisconn turns the Redis connection parameters the Redis-backed
// gates share (address as host:port or a redis:// / rediss:// URL,
// username, password, db, tls, tls_ca_cert, tls_cert, tls_key,
// tls_insecure_skip_verify) into
// go-redis options. Each gate then sets its own pool and retry policy.
package redisconn

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// Config is a Redis connection as the gates' parameters give it.
type Config struct {
	// Address is host:port, or a redis:// or rediss:// URL carrying its own
	// credentials, db and TLS.
	Address string
	// Username, Password, DB and TLS apply when Address is host:port.
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

// IsURL reports whether addr is a redis:// or rediss:// URL.
func IsURL(addr string) bool {
	return strings.HasPrefix(addr, "redis://") || strings.HasPrefix(addr, "rediss://")
}

// Options validates c (Address must be set) and returns the go-redis
// options it stands for, with what every gate wants: no retries (a gate's
// caller asks again), a short dial timeout, the caller's context bounding
// each command, and no background maintenance. Errors name the parameter.
func (c Config) Options() (*redis.Options, error) {
	var o *redis.Options
	if IsURL(c.Address) {
		if c.Username != "" || c.Password != "" || c.DB != 0 || c.TLS {
			return nil, errors.New("username, password, db and tls go in the address URL when address is a URL")
		}
		var err error
		if o, err = redis.ParseURL(c.Address); err != nil {
			return nil, fmt.Errorf("gate_params.address: %w", err)
		}
	} else {
		if _, _, err := net.SplitHostPort(c.Address); err != nil {
			return nil, fmt.Errorf("gate_params.address %q: want host:port or a redis:// or rediss:// URL", c.Address)
		}
		if c.DB < 0 {
			return nil, fmt.Errorf("gate_params.db %d is negative", c.DB)
		}
		o = &redis.Options{Addr: c.Address, Username: c.Username, Password: c.Password, DB: c.DB}
		if c.TLS {
			o.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, ServerName: hostOf(c.Address)}
		}
	}
	if c.TLSCACert != "" || c.TLSCert != "" || c.TLSKey != "" || c.TLSInsecureSkipVerify {
		if o.TLSConfig == nil {
			return nil, errors.New("tls_ca_cert, tls_cert, tls_key and tls_insecure_skip_verify need tls=true or a rediss:// address")
		}
		if (c.TLSCert == "") != (c.TLSKey == "") {
			return nil, errors.New("tls_cert and tls_key go together")
		}
		if c.TLSCert != "" {
			pair, err := tls.LoadX509KeyPair(c.TLSCert, c.TLSKey)
			if err != nil {
				return nil, fmt.Errorf("tls_cert/tls_key: %w", err)
			}
			o.TLSConfig.Certificates = []tls.Certificate{pair}
		}
		o.TLSConfig.InsecureSkipVerify = c.TLSInsecureSkipVerify
		if c.TLSCACert != "" {
			pem, err := os.ReadFile(c.TLSCACert)
			if err != nil {
				return nil, fmt.Errorf("tls_ca_cert: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("tls_ca_cert %s: no PEM certificate", c.TLSCACert)
			}
			o.TLSConfig.RootCAs = pool
		}
	}
	o.MinIdleConns = 0
	o.MaxRetries = -1
	o.DialTimeout = 2 * time.Second
	o.ContextTimeoutEnabled = true
	o.DisableIdentity = true
	o.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	return o, nil
}

func hostOf(addr string) string {
	h, _, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	return h
}
