package redisquota

import (
	"errors"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/gates/internal/redisconn"
)

// options validates the connection part of c and returns the go-redis
// options it stands for, and the address without credentials (for messages).
func (c Config) options() (*redis.Options, string, error) {
	if c.Address == "" {
		return nil, "", errors.New("gate_params.address: required (host:port or a redis:// URL)")
	}
	o, err := redisconn.Config{Address: c.Address, Username: c.Username, Password: c.Password, DB: c.DB,
		TLS: c.TLS, TLSCACert: c.TLSCACert, TLSCert: c.TLSCert, TLSKey: c.TLSKey,
		TLSInsecureSkipVerify: c.TLSInsecureSkipVerify}.Options()
	if err != nil {
		return nil, "", err
	}
	// One pipeline in flight per lane (see conn), each on a connection of
	// its own. No retries of dials or commands: a script that may have run
	// must not run twice (an acquire is not idempotent); the caller's error
	// path re-asks.
	o.PoolSize = lanes
	o.DialerRetries = 1 // a refused connection is an error now, not after 5 tries
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
		strconv.FormatBool(c.TLS), c.TLSCACert, c.TLSCert, c.TLSKey, strconv.FormatBool(c.TLSInsecureSkipVerify)}, "\x00")
}
