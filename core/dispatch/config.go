package dispatch

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
	"time"
)

// Defaults applied by Config.SetDefaults.
const (
	DefaultMaxConns         = 64
	DefaultRequestTimeout   = 5 * time.Minute
	DefaultDeadlineHeader   = "x-request-deadline"
	DefaultTimeoutHeader    = "x-envoy-upstream-rq-timeout-ms"
	DefaultMaxResponseBytes = 64 << 20
	DefaultPath             = "/v1/completions"
)

// HeaderOff, given as Config.DeadlineHeader or Config.TimeoutHeader, disables
// that header. "-" is accepted as a synonym.
const HeaderOff = "off"

// Config configures a Client. The zero value is usable after SetDefaults.
type Config struct {
	// MaxConns is the number of idle keep-alive connections kept per gateway
	// host (http.Transport.MaxIdleConnsPerHost); size it to the concurrency of
	// the queues sharing a gateway. Default 64. It does not apply to h2c,
	// whose connections each carry as many calls as the gateway allows and
	// close after 90 s without one.
	MaxConns int
	// MaxConnsPerHost caps the connections (idle, active and dialing) to one
	// gateway host; a call waits for a free connection (with h2c: a free
	// stream on one) when the cap is reached.
	// 0, the default, means no cap: concurrency is enforced by the pipeline's
	// credits, and a cap here would only add a hidden queue.
	MaxConnsPerHost int
	// RequestTimeout bounds one call when the request's deadline is further
	// away. A call that hits it is Retryable. Default 5m.
	RequestTimeout time.Duration
	// DeadlineHeader names the header that carries the request's deadline as
	// Unix milliseconds. Default "x-request-deadline"; HeaderOff disables it.
	DeadlineHeader string
	// TimeoutHeader names the header that carries the milliseconds left for the
	// call at send time (at least 1). Default "x-envoy-upstream-rq-timeout-ms";
	// HeaderOff disables it.
	TimeoutHeader string
	// TLS configures connections to https gateways.
	TLS TLSConfig
	// MaxResponseBytes caps the response body read. A bigger body makes the
	// call Fatal with ErrResponseTooLarge. Default 64 MiB.
	MaxResponseBytes int64
	// Protocol is how http:// gateways are spoken to: ProtocolAuto (the
	// default: h2c to the gateways that complete an HTTP/2 handshake with
	// prior knowledge, HTTP/1.1 to the others, detected per gateway address
	// and re-checked; see package core/dispatch/auto), ProtocolHTTP1 (one
	// connection per request in flight) or ProtocolH2C (HTTP/2 with prior
	// knowledge, for gateways that accept it, such as Envoy: many requests
	// share a few connections). https gateways negotiate HTTP/2 or HTTP/1.1
	// through ALPN (HTTP/2 only under ProtocolH2C).
	Protocol string
	// Fairness configures the fairness stamp (upstream's fairness_header
	// and fairness_attribute). The zero value stamps metadata.userid as
	// x-llm-d-inference-fairness-id.
	Fairness FairnessConfig
}

// Gateway protocols for Config.Protocol.
const (
	ProtocolAuto  = "auto"
	ProtocolHTTP1 = "http1"
	ProtocolH2C   = "h2c"
)

// TLSConfig names the PEM files used for https gateways. All fields are optional.
type TLSConfig struct {
	// CACert is a PEM bundle of CAs trusted in addition to the system roots.
	CACert string
	// Cert and Key are the client certificate and its key, for mutual TLS;
	// set both or neither.
	Cert string
	Key  string
	// InsecureSkipVerify disables verification of the gateway's certificate.
	InsecureSkipVerify bool
}

// SetDefaults fills zero fields with their defaults.
func (c *Config) SetDefaults() {
	if c.MaxConns == 0 {
		c.MaxConns = DefaultMaxConns
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = DefaultRequestTimeout
	}
	if c.DeadlineHeader == "" {
		c.DeadlineHeader = DefaultDeadlineHeader
	}
	if c.TimeoutHeader == "" {
		c.TimeoutHeader = DefaultTimeoutHeader
	}
	if c.MaxResponseBytes == 0 {
		c.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if c.Protocol == "" {
		c.Protocol = ProtocolAuto
	}
	c.Fairness.SetDefaults()
}

// Validate reports every invalid field (errors.Join). It does not read the
// TLS files; New does, and its errors name the file.
func (c Config) Validate() error {
	var errs []error
	bad := func(err error) { errs = append(errs, err) }
	if c.MaxConns < 0 {
		bad(fmt.Errorf("dispatch: max conns %d is negative", c.MaxConns))
	}
	if c.MaxConnsPerHost < 0 {
		bad(fmt.Errorf("dispatch: max conns per host %d is negative", c.MaxConnsPerHost))
	}
	if c.RequestTimeout < 0 {
		bad(fmt.Errorf("dispatch: request timeout %s is negative", c.RequestTimeout))
	}
	if c.MaxResponseBytes < 0 {
		bad(fmt.Errorf("dispatch: max response bytes %d is negative", c.MaxResponseBytes))
	}
	if (c.TLS.Cert == "") != (c.TLS.Key == "") {
		bad(errors.New("dispatch: tls cert and key must be set together"))
	}
	if c.Protocol != ProtocolAuto && c.Protocol != ProtocolHTTP1 && c.Protocol != ProtocolH2C {
		bad(fmt.Errorf("dispatch: protocol %q: want %q, %q or %q", c.Protocol, ProtocolAuto, ProtocolHTTP1, ProtocolH2C))
	}
	headersOK := true
	for _, h := range []struct{ what, v string }{{"deadline header", c.DeadlineHeader}, {"timeout header", c.TimeoutHeader}} {
		if err := validHeaderSetting(h.what, h.v); err != nil {
			bad(err)
			headersOK = false
		}
	}
	d, t := headerName(c.DeadlineHeader), headerName(c.TimeoutHeader)
	if headersOK && d != "" && d == t {
		bad(fmt.Errorf("dispatch: deadline header and timeout header are both %q", c.DeadlineHeader))
	}
	if err := c.Fairness.Validate(); err != nil {
		bad(fmt.Errorf("dispatch: %w", err))
	} else if f := c.Fairness.headerName(); f != "" && (f == d || f == t) {
		bad(fmt.Errorf("dispatch: fairness_header %q is also the deadline or timeout header", *c.Fairness.Header))
	}
	return errors.Join(errs...)
}

func validHeaderSetting(what, v string) error {
	if v == "" || isOff(v) {
		return nil
	}
	if !validToken(v) {
		return fmt.Errorf("dispatch: %s %q is not a valid header name", what, v)
	}
	if refusedHeader(http.CanonicalHeaderKey(v)) {
		return fmt.Errorf("dispatch: %s %q is a reserved header", what, v)
	}
	return nil
}

func isOff(v string) bool { return v == HeaderOff || v == "-" }

// headerName returns the canonical header name for a setting, or "" when the
// header is disabled.
func headerName(v string) string {
	if v == "" || isOff(v) {
		return ""
	}
	return http.CanonicalHeaderKey(v)
}

// Build loads the files and returns the TLS configuration for the gateway
// connections. Errors name the file that could not be used.
func (t TLSConfig) Build() (*tls.Config, error) {
	cfg := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		InsecureSkipVerify: t.InsecureSkipVerify, //nolint:gosec // explicit operator choice
	}
	if t.CACert != "" {
		pem, err := os.ReadFile(t.CACert)
		if err != nil {
			return nil, fmt.Errorf("tls ca cert: %w", err)
		}
		pool, err := x509.SystemCertPool()
		if err != nil || pool == nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls ca cert %s: no PEM certificate found", t.CACert)
		}
		cfg.RootCAs = pool
	}
	if t.Cert != "" || t.Key != "" {
		if t.Cert == "" || t.Key == "" {
			return nil, errors.New("tls: cert and key must be set together")
		}
		pair, err := tls.LoadX509KeyPair(t.Cert, t.Key)
		if err != nil {
			return nil, fmt.Errorf("tls key pair (cert %s, key %s): %w", t.Cert, t.Key, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}
