// Package auto is dispatch's protocol client for dispatch.protocol "auto"
// (the default) with http:// gateways: it speaks HTTP/2 with prior
// knowledge (package h2c) to the gateways that accept it and HTTP/1.1
// (package nethttp) to the others, detected per gateway address. It
// implements dispatch.Poster. (https gateways need no detection: ALPN
// chooses, in package nethttp.)
//
// Detection: the first call to an address opens an h2c connection to it
// (h2c.Transport.Connect: the preface and the SETTINGS exchange, no
// request). The gateway is h2c when the handshake completes, HTTP/1.1 when
// it answered the preface in HTTP/1.1 or closed the connection without
// completing the handshake; the calls arriving meanwhile wait for that one
// handshake. When the gateway could not be reached at all the call fails
// with the dial's error and the next call detects again.
//
// Re-checks, so that a gateway that changes kind is followed:
//   - h2c: every new h2c connection does the handshake again; one that finds
//     an HTTP/1.1 gateway switches the address to HTTP/1.1, and the call that
//     dialled is sent over HTTP/1.1.
//   - HTTP/1.1: a call that fails without a response (the gateway closed or
//     refused connections, as when it restarts) makes the next call detect
//     again; so does the dial of a new HTTP/1.1 connection once the last
//     detection is older than a minute.
//
// No request is sent twice because of detection: a handshake sends no
// request, and a call goes to HTTP/1.1 after an h2c failure only when the h2c
// client reports that the gateway did not complete a new connection's
// handshake (nothing sent), after requests it certainly did not process.
//
// Gateways reached through a proxy (HTTP_PROXY and NO_PROXY) are spoken to in
// HTTP/1.1 through the proxy, as with dispatch.protocol "http1": h2c does not
// go through proxies.
package auto

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-io/sluice/core/dispatch/h2c"
	"github.com/sluice-io/sluice/core/dispatch/internal/cowmap"
	"github.com/sluice-io/sluice/core/dispatch/nethttp"
)

// Tuning that is not configurable (tests change the Transport's copy).
const (
	// recheckAfter: a new HTTP/1.1 connection to an address detected longer
	// ago than this makes the next call detect again.
	recheckAfter = time.Minute
	// maxCachedRoutes bounds the URL → gateway cache (routes come from a
	// handful of endpoints).
	maxCachedRoutes = 1024
)

// The kinds of gateway.
const (
	kindUnknown int32 = iota
	kindH2C
	kindHTTP1
)

// Config configures a Transport.
type Config struct {
	// Dial opens connections to gateways; nil means a net.Dialer's.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// MaxIdleConnsPerHost is the number of idle HTTP/1.1 keep-alive
	// connections kept per gateway.
	MaxIdleConnsPerHost int
	// MaxConnsPerHost caps the connections to one gateway (HTTP/1.1 and h2c
	// each); 0 means no cap.
	MaxConnsPerHost int
	// MaxBodyBytes caps an h2c response body (see h2c.Config); 0 means no cap.
	MaxBodyBytes int64
	// Proxy returns the proxy for a request, as http.Transport.Proxy; nil
	// means http.ProxyFromEnvironment.
	Proxy func(*http.Request) (*url.URL, error)
}

// Transport posts requests to http:// gateways in h2c or HTTP/1.1, whichever
// each gateway speaks. It is safe for concurrent use.
type Transport struct {
	h2    *h2c.Transport
	h1    *nethttp.Transport
	proxy func(*http.Request) (*url.URL, error)
	dial  func(ctx context.Context, network, addr string) (net.Conn, error)

	recheckAfter time.Duration

	routes cowmap.Map[*url.URL, *gateway]

	mu    sync.Mutex
	addrs map[string]*gateway
}

// New returns a Transport for cfg.
func New(cfg Config) *Transport {
	dial := cfg.Dial
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	proxy := cfg.Proxy
	if proxy == nil {
		proxy = http.ProxyFromEnvironment
	}
	t := &Transport{
		proxy:        proxy,
		dial:         dial,
		recheckAfter: recheckAfter,
		routes:       cowmap.Map[*url.URL, *gateway]{Max: maxCachedRoutes},
		addrs:        map[string]*gateway{},
	}
	t.h2 = h2c.New(h2c.Config{Dial: dial, MaxConnsPerHost: cfg.MaxConnsPerHost, MaxBodyBytes: cfg.MaxBodyBytes})
	var p http.Protocols
	p.SetHTTP1(true)
	t.h1 = nethttp.New(nethttp.Config{
		Dial:                t.dialHTTP1,
		Protocols:           &p,
		Proxy:               proxy,
		MaxIdleConnsPerHost: cfg.MaxIdleConnsPerHost,
		MaxConnsPerHost:     cfg.MaxConnsPerHost,
	})
	return t
}

// gateway is what is known of one address.
type gateway struct {
	kind    atomic.Int32
	checked atomic.Int64 // Unix nanoseconds of the last detection
	fixed   bool         // reached through a proxy: HTTP/1.1 for good

	mu    sync.Mutex
	probe *probe // the detection in progress, or nil
}

// probe is one detection; done is closed when it ends, err is then what the
// calls that waited for it return (nil: look at the kind again).
type probe struct {
	done chan struct{}
	err  error
}

// Post sends body to u with the headers h over the protocol u's gateway
// speaks (see dispatch.Poster for the contract). u must be an http:// URL.
func (t *Transport) Post(ctx context.Context, u *url.URL, h http.Header, body []byte) (*http.Response, error) {
	g, err := t.gateway(u)
	if err != nil {
		return nil, err
	}
	for {
		switch g.kind.Load() {
		case kindH2C:
			resp, err := t.h2.Post(ctx, u, h, body)
			if err != nil && notH2C(err) && ctx.Err() == nil {
				// A new connection found a gateway that no longer speaks
				// h2c; this request was not sent on it.
				g.set(kindHTTP1)
				return t.h1.Post(ctx, u, h, body)
			}
			return resp, err
		case kindHTTP1:
			resp, err := t.h1.Post(ctx, u, h, body)
			if err != nil && ctx.Err() == nil && !g.fixed {
				g.kind.CompareAndSwap(kindHTTP1, kindUnknown)
			}
			return resp, err
		default:
			if err := t.detect(ctx, g, u); err != nil {
				return nil, err
			}
		}
	}
}

// CloseIdleConnections closes the connections that carry no call, of both
// protocols. Calls in flight are not interrupted, and the Transport stays
// usable.
func (t *Transport) CloseIdleConnections() {
	t.h2.CloseIdleConnections()
	t.h1.CloseIdleConnections()
}

// Kind reports what u's gateway was last detected as: "h2c", "http1", or ""
// when it is not known (not detected yet, or to be detected again).
func (t *Transport) Kind(u *url.URL) string {
	g, err := t.gateway(u)
	if err != nil {
		return ""
	}
	switch g.kind.Load() {
	case kindH2C:
		return "h2c"
	case kindHTTP1:
		return "http1"
	}
	return ""
}

// notH2C reports whether err is a new h2c connection's handshake that did
// not complete although the gateway was reached.
func notH2C(err error) bool {
	var he *h2c.HandshakeError
	return errors.As(err, &he)
}

func (g *gateway) set(kind int32) {
	g.kind.Store(kind)
	g.checked.Store(time.Now().UnixNano())
}

// detect finds what g speaks with one h2c handshake shared by the calls
// arriving meanwhile. It returns nil when the caller should look at g's kind
// again.
func (t *Transport) detect(ctx context.Context, g *gateway, u *url.URL) error {
	g.mu.Lock()
	if g.kind.Load() != kindUnknown {
		g.mu.Unlock()
		return nil
	}
	if p := g.probe; p != nil {
		g.mu.Unlock()
		select {
		case <-p.done:
			return p.err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	p := &probe{done: make(chan struct{})}
	g.probe = p
	g.mu.Unlock()

	err := t.h2.Connect(ctx, u)
	g.mu.Lock()
	defer g.mu.Unlock()
	g.probe = nil
	defer close(p.done)
	switch {
	case err == nil:
		g.set(kindH2C)
		return nil
	case notH2C(err) && ctx.Err() == nil:
		g.set(kindHTTP1)
		return nil
	case ctx.Err() != nil:
		// This call's own end: the others detect again.
		return err
	}
	p.err = fmt.Errorf("gateway %s: %w", u.Host, err)
	return p.err
}

// gateway returns the state of u's address.
func (t *Transport) gateway(u *url.URL) (*gateway, error) {
	if g, ok := t.routes.Load(u); ok {
		return g, nil
	}
	if u.Scheme != "http" || u.Host == "" {
		return nil, fmt.Errorf("auto: %s is not an http:// URL with a host", u.Redacted())
	}
	port := u.Port()
	if port == "" {
		port = "80"
	}
	addr := net.JoinHostPort(u.Hostname(), port)
	proxied := false
	if p, err := t.proxy(&http.Request{Method: http.MethodPost, URL: u, Header: http.Header{}}); err == nil && p != nil {
		proxied = true
	}
	if proxied {
		g := &gateway{fixed: true}
		g.set(kindHTTP1)
		return t.routes.Store(u, g), nil
	}
	t.mu.Lock()
	g := t.addrs[addr]
	if g == nil {
		g = &gateway{}
		t.addrs[addr] = g
	}
	t.mu.Unlock()
	return t.routes.Store(u, g), nil
}

// dialHTTP1 dials an HTTP/1.1 connection; one to an address detected longer
// ago than recheckAfter makes the next call detect again.
func (t *Transport) dialHTTP1(ctx context.Context, network, addr string) (net.Conn, error) {
	t.mu.Lock()
	g := t.addrs[addr]
	t.mu.Unlock()
	if g != nil && time.Since(time.Unix(0, g.checked.Load())) > t.recheckAfter {
		g.kind.CompareAndSwap(kindHTTP1, kindUnknown)
	}
	return t.dial(ctx, network, addr)
}
