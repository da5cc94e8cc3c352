// Package nethttp is dispatch's protocol client on net/http's Transport: it
// speaks HTTP/1.1 to http:// gateways and negotiates HTTP/2 or HTTP/1.1
// through ALPN with https:// gateways. It implements dispatch.Poster.
//
// A call costs no http.Client (redirects are not followed: the Transport is
// used directly) and no URL parse: the caller's *url.URL is shared read-only.
package nethttp

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/url"
	"time"
)

// Transport tuning that is not configurable.
const (
	tlsHandshakeTimeout = 10 * time.Second
	idleConnTimeout     = 90 * time.Second
	bufferSize          = 2 << 10
	h2SendPingTimeout   = 30 * time.Second
	h2PingTimeout       = 15 * time.Second
)

// Config configures a Transport.
type Config struct {
	// Dial opens connections to gateways; nil means a net.Dialer's.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// TLS configures connections to https gateways; nil means the defaults.
	TLS *tls.Config
	// Proxy returns the proxy for a request (http.Transport.Proxy); nil
	// means http.ProxyFromEnvironment.
	Proxy func(*http.Request) (*url.URL, error)
	// Protocols are the protocols offered (http.Transport.Protocols); nil
	// means net/http's default.
	Protocols *http.Protocols
	// MaxIdleConnsPerHost is the number of idle keep-alive connections kept
	// per gateway host (http.Transport.MaxIdleConnsPerHost).
	MaxIdleConnsPerHost int
	// MaxConnsPerHost caps the connections (idle, active and dialing) to one
	// gateway host; 0 means no cap.
	MaxConnsPerHost int
}

// Transport posts requests through net/http's Transport. It is safe for
// concurrent use.
type Transport struct {
	rt *http.Transport
}

// New returns a Transport for cfg.
func New(cfg Config) *Transport {
	proxy := cfg.Proxy
	if proxy == nil {
		proxy = http.ProxyFromEnvironment
	}
	return &Transport{rt: &http.Transport{
		Proxy:               proxy,
		DialContext:         cfg.Dial,
		TLSClientConfig:     cfg.TLS,
		TLSHandshakeTimeout: tlsHandshakeTimeout,
		MaxIdleConns:        0, // no global cap; MaxIdleConnsPerHost bounds each gateway
		MaxIdleConnsPerHost: cfg.MaxIdleConnsPerHost,
		MaxConnsPerHost:     cfg.MaxConnsPerHost,
		IdleConnTimeout:     idleConnTimeout,
		// No ResponseHeaderTimeout: the call's context bounds the wait.
		// No compression: bodies are relayed as the gateway wrote them, and
		// compressing on a local network only costs CPU.
		DisableCompression: true,
		Protocols:          cfg.Protocols,
		// HTTP/1.1 keeps a connection, with a read and a write buffer, per
		// call in flight, so thousands of calls in flight make these buffers
		// a large part of resident memory (docs/benchmarks.md). Request and
		// response headers fit in 2 KiB, a small request goes out in one
		// write, and bodies larger than the buffer bypass it.
		ReadBufferSize:  bufferSize,
		WriteBufferSize: bufferSize,
		// An HTTP/2 connection whose peer went silent is found by a ping
		// instead of by each call's deadline.
		HTTP2: &http.HTTP2Config{SendPingTimeout: h2SendPingTimeout, PingTimeout: h2PingTimeout},
	}}
}

// Post sends body to u with the headers h (see dispatch.Poster). The request
// is built without parsing a URL: u is shared read-only, as a RoundTripper
// must not modify its request.
func (t *Transport) Post(ctx context.Context, u *url.URL, h http.Header, body []byte) (*http.Response, error) {
	r := http.Request{
		Method:        http.MethodPost,
		URL:           u,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        h,
		Body:          http.NoBody,
		ContentLength: int64(len(body)),
		Host:          u.Host,
	}
	if len(body) > 0 {
		// io.NopCloser over a *bytes.Reader is recognised by net/http as an
		// in-memory body: headers and body go out in one write.
		r.Body = io.NopCloser(bytes.NewReader(body))
		// A request the gateway refused unprocessed (HTTP/2 REFUSED_STREAM,
		// a GOAWAY, a keep-alive connection closed as it was reused) can
		// then be sent again with its body.
		r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	}
	return t.rt.RoundTrip(r.WithContext(ctx))
}

// CloseIdleConnections closes the connections that carry no call. Calls in
// flight are not interrupted, and the Transport stays usable.
func (t *Transport) CloseIdleConnections() { t.rt.CloseIdleConnections() }
