// Package h2c is sluice's HTTP/2 client for http:// gateways spoken to with
// prior knowledge (dispatch.protocol "h2c"); it implements dispatch.Poster.
// It is built on the framing and HPACK packages of golang.org/x/net/http2 and
// does only what a dispatcher needs: POST a body held in memory, read the
// answer.
//
// Why not net/http's HTTP/2 client: it runs a goroutine per call besides the
// caller's, allocates many times per call and flushes after each frame; with
// thousands of calls in flight on a small host its CPU and its goroutines'
// stacks were the largest cost of a request (docs/benchmarks.md). Here a call
// costs no goroutine: the caller writes its frames under the connection's
// write lock into a coalescingConn and then flushes it (sending in one system
// call what other calls wrote meanwhile, or leaving its frames to the call
// already writing), and one read loop per connection hands each stream its
// answer.
//
// Semantics kept from net/http: streams beyond the server's
// SETTINGS_MAX_CONCURRENT_STREAMS go to another connection (dialled when
// none has room, up to Config.MaxConnsPerHost); a request the server did not
// process (REFUSED_STREAM, or a stream above a GOAWAY's last stream ID) is
// sent again on another connection; a cancelled call resets its stream;
// flow control both ways; a connection silent for 30 s while calls are open
// is pinged and dropped if the ping is not answered within 15 s; idle
// connections close after 90 s.
//
// The gateway is not trusted (RFC 9113 as a receiver must read it):
//   - DATA past a stream's receive window is a stream error, past the
//     connection's a connection error, both FLOW_CONTROL_ERROR; a
//     WINDOW_UPDATE or SETTINGS_INITIAL_WINDOW_SIZE that takes a send window
//     past 2^31-1 is a FLOW_CONTROL_ERROR (a stream error for a stream's
//     window, a connection error for the connection's); a WINDOW_UPDATE of 0
//     is a PROTOCOL_ERROR of the same scope. A stream error resets the stream
//     (RST_STREAM) and fails its call; a connection error sends GOAWAY and
//     fails every call on the connection; either way with a *ProtocolError.
//   - A response body is buffered up to Config.MaxBodyBytes and never past
//     it: one byte more resets the stream and fails the body's Read with an
//     error wrapping *http.MaxBytesError. Buffers grow to at most the smaller
//     of that cap and the stream's receive window.
//   - Frames larger than 16 KiB (the client advertises no larger) are a
//     FRAME_SIZE_ERROR; a response header list is bounded (1 MiB); frames on
//     streams the client never opened, PUSH_PROMISE, a server setting
//     SETTINGS_ENABLE_PUSH, a malformed response (no or a bad :status, DATA
//     before the headers, trailers that do not end the stream) are protocol
//     errors.
//   - A gateway that stops reading fails its connection once no byte could be
//     written for 5 s, so a write never blocks a call for longer than that.
//
// Not supported: proxies (h2c goes straight to the gateway), server push
// (disabled in our SETTINGS), request trailers.
package h2c

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

	"golang.org/x/net/http2"

	"github.com/sluice-io/sluice/core/dispatch/internal/cowmap"
)

// Tuning that is not configurable (tests of this package change the
// Transport's copies).
const (
	// defaultStreamWindow and defaultConnWindow are the receive windows
	// advertised: answers are read into memory at once, so they only bound
	// what a gateway may send ahead of the reader.
	defaultStreamWindow = 4 << 20
	defaultConnWindow   = 64 << 20
	// initialWindow is RFC 9113's window before SETTINGS and WINDOW_UPDATE.
	initialWindow = 65535
	// maxWindow is the largest flow-control window RFC 9113 allows.
	maxWindow = 1<<31 - 1
	// maxReadFrame is the largest frame read: RFC 9113's default
	// SETTINGS_MAX_FRAME_SIZE, which the client does not raise.
	maxReadFrame = 16 << 10
	// maxHeaderList bounds a response's header block.
	maxHeaderList = 1 << 20
	// defaultMaxStreams is assumed until the server's first SETTINGS frame
	// says otherwise (RFC 9113 leaves it unlimited; net/http assumes 100 as
	// well).
	defaultMaxStreams = 100
	// maxStreams caps the streams one connection carries at once, whatever
	// the gateway allows.
	maxStreams = 1 << 20
	// maxStreamID: a connection stops taking streams near the end of the
	// stream ID space (leaving room for the streams already reserved: at
	// most maxStreams) and a new one is dialled.
	maxStreamID = 1<<31 - 1 - 2*maxStreams
	// retries bounds how often a request the server did not process is sent
	// again.
	retries = 3
	// handshakeTimeout bounds the dial's HTTP/2 handshake.
	handshakeTimeout = 5 * time.Second
	// pingAfter, pingTimeout, idleTimeout, healthTick: a connection silent
	// for pingAfter while calls are open is pinged and dropped pingTimeout
	// after an unanswered ping; one without calls for idleTimeout is closed;
	// checked every healthTick.
	pingAfter   = 30 * time.Second
	pingTimeout = 15 * time.Second
	idleTimeout = 90 * time.Second
	healthTick  = time.Second
	// writeStall fails a connection whose socket took no byte for this long
	// (the gateway stopped reading).
	writeStall = 5 * time.Second
	// Cache bounds: routes come from a handful of endpoints and header names
	// from a handful of producers; past the bounds, values are computed per
	// call instead of growing without bound.
	maxCachedRoutes = 1024
	maxCachedNames  = 256
)

// ErrNotSpoken is the handshake error with a gateway that answered the
// HTTP/2 preface in HTTP/1.1.
var ErrNotSpoken = errors.New("the gateway answered in HTTP/1.1: it does not accept HTTP/2 with prior knowledge (set dispatch.protocol to http1)")

// ErrPingLost fails the calls of a connection whose ping went unanswered.
var ErrPingLost = errors.New("h2c: the gateway did not answer a ping")

// ErrWriteStalled fails the calls of a connection whose gateway stopped
// reading: no byte could be written to it for 5 s.
var ErrWriteStalled = errors.New("h2c: the gateway stopped reading")

// errUnprocessed marks a request the server did not process: it may be sent again.
var errUnprocessed = errors.New("h2c: the gateway did not process the request")

// HandshakeError is the error of a connection that was opened but did not
// complete the HTTP/2 handshake (the preface and the SETTINGS exchange):
// nothing of any request was sent on it. It wraps ErrNotSpoken when the
// gateway answered in HTTP/1.1.
type HandshakeError struct {
	// Addr is the gateway's address (host:port).
	Addr string
	// Err is what went wrong.
	Err error
}

// Error names the address and what went wrong.
func (e *HandshakeError) Error() string {
	return fmt.Sprintf("h2c handshake with %s: %v", e.Addr, e.Err)
}

// Unwrap returns Err.
func (e *HandshakeError) Unwrap() error { return e.Err }

// ProtocolError fails a call whose gateway broke HTTP/2 (RFC 9113). The
// client answered with RST_STREAM carrying Code when Stream is set (a stream
// error: that call alone fails), or with GOAWAY carrying Code when Stream is
// 0 (a connection error: every call on the connection fails). The request
// may have been processed.
type ProtocolError struct {
	// Stream is the stream reset, or 0 for a connection error.
	Stream uint32
	// Code is the error code sent to the gateway.
	Code http2.ErrCode
	// Reason says what the gateway did.
	Reason string
}

// Error describes the violation and names the error code.
func (e *ProtocolError) Error() string {
	if e.Stream == 0 {
		return fmt.Sprintf("%s (%v)", e.Reason, e.Code)
	}
	return fmt.Sprintf("h2c stream %d: %s (%v)", e.Stream, e.Reason, e.Code)
}

func connError(code http2.ErrCode, format string, args ...any) *ProtocolError {
	return &ProtocolError{Code: code, Reason: fmt.Sprintf(format, args...)}
}

// Config configures a Transport.
type Config struct {
	// Dial opens connections to gateways; nil means a net.Dialer's.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// MaxConnsPerHost caps the connections to one gateway address; a call
	// waits for a free stream on one when the cap is reached. 0 means no cap.
	MaxConnsPerHost int
	// MaxBodyBytes caps a response body: a body longer than this resets its
	// stream and fails its Read with an error wrapping *http.MaxBytesError,
	// and no more than this is ever buffered for it. 0 means no cap (the
	// stream's receive window still bounds what is buffered).
	MaxBodyBytes int64
}

// Transport posts requests over HTTP/2 with prior knowledge. It keeps a pool
// of connections per gateway address. It is safe for concurrent use.
type Transport struct {
	dial     func(ctx context.Context, network, addr string) (net.Conn, error)
	maxConns int   // per address; 0: no cap
	maxBody  int64 // 0: no cap

	// Tuning, from the constants of the same names.
	streamWindow, connWindow                              int32
	handshakeTimeout, pingAfter, pingTimeout, idleTimeout time.Duration
	tick, writeStall                                      time.Duration

	routes cowmap.Map[*url.URL, *route]
	lower  cowmap.Map[string, string] // request header name → lower case
	canon  cowmap.Map[string, string] // response header name → canonical

	mu    sync.Mutex
	pools map[string]*pool

	// For tests: the largest buffer allocated for a response body, and the
	// connection goroutines running.
	peakBuffer atomic.Int64
	running    sync.WaitGroup
}

// New returns a Transport for cfg.
func New(cfg Config) *Transport {
	dial := cfg.Dial
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	return &Transport{
		dial: dial, maxConns: cfg.MaxConnsPerHost, maxBody: max(cfg.MaxBodyBytes, 0),
		streamWindow: defaultStreamWindow, connWindow: defaultConnWindow,
		handshakeTimeout: handshakeTimeout, pingAfter: pingAfter, pingTimeout: pingTimeout,
		idleTimeout: idleTimeout, tick: healthTick, writeStall: writeStall,
		routes: cowmap.Map[*url.URL, *route]{Max: maxCachedRoutes},
		lower:  cowmap.Map[string, string]{Max: maxCachedNames},
		canon:  cowmap.Map[string, string]{Max: maxCachedNames},
		pools:  map[string]*pool{},
	}
}

// Post sends body to u with the headers h and returns the response once its
// headers have arrived (see dispatch.Poster for the contract). u must be an
// http:// URL; it is read-only and may be kept (its address and path are
// cached). Names in h may be in any case (they are sent in lower case) and
// must not be hop-by-hop; Content-Length is set from len(body).
func (t *Transport) Post(ctx context.Context, u *url.URL, h http.Header, body []byte) (*http.Response, error) {
	r, err := t.route(u)
	if err != nil {
		return nil, err
	}
	for attempt := 0; ; attempt++ {
		cc, err := r.pool.get(ctx)
		if err != nil {
			return nil, err
		}
		resp, err := cc.roundTrip(ctx, r, h, body)
		if err != nil && errors.Is(err, errUnprocessed) && attempt < retries && ctx.Err() == nil {
			continue
		}
		return resp, err
	}
}

// Connect makes sure a connection to u's gateway is open, dialling one when
// none is, and returns the error of that dial: a *HandshakeError (wrapping
// ErrNotSpoken for a gateway that answered in HTTP/1.1) when the gateway was
// reached but did not complete the HTTP/2 handshake, the dial's error when it
// was not reached. It sends no request; the connection it opens stays in the
// pool for the calls that follow (and closes after 90 s without one).
func (t *Transport) Connect(ctx context.Context, u *url.URL) error {
	r, err := t.route(u)
	if err != nil {
		return err
	}
	return r.pool.connect(ctx)
}

// CloseIdleConnections closes the connections that carry no call. Calls in
// flight are not interrupted, and the Transport stays usable.
func (t *Transport) CloseIdleConnections() {
	t.mu.Lock()
	pools := make([]*pool, 0, len(t.pools))
	for _, p := range t.pools {
		pools = append(pools, p)
	}
	t.mu.Unlock()
	for _, p := range pools {
		for _, cc := range p.snapshot() {
			cc.closeIfIdle()
		}
	}
}

// route is what a URL means to the client: the connections to its address,
// and the :authority and :path it is sent with.
type route struct {
	pool      *pool
	authority string
	path      string
}

func (t *Transport) route(u *url.URL) (*route, error) {
	if r, ok := t.routes.Load(u); ok {
		return r, nil
	}
	if u.Scheme != "http" || u.Host == "" {
		return nil, fmt.Errorf("h2c: %s is not an http:// URL with a host", u.Redacted())
	}
	port := u.Port()
	if port == "" {
		port = "80"
	}
	r := &route{pool: t.pool(net.JoinHostPort(u.Hostname(), port)), authority: u.Host, path: u.RequestURI()}
	return t.routes.Store(u, r), nil
}

func (t *Transport) pool(addr string) *pool {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.pools[addr]
	if p == nil {
		p = &pool{t: t, addr: addr, wake: make(chan struct{}), maxStreams: defaultMaxStreams}
		t.pools[addr] = p
	}
	return p
}

// notePeak records a response body buffer of n bytes.
func (t *Transport) notePeak(n int) {
	for {
		old := t.peakBuffer.Load()
		if int64(n) <= old || t.peakBuffer.CompareAndSwap(old, int64(n)) {
			return
		}
	}
}

// pool is the connections to one gateway address.
type pool struct {
	t    *Transport
	addr string

	mu         sync.Mutex
	conns      []*conn
	dialing    int           // dials in progress
	waiting    int           // calls waiting for room
	wake       chan struct{} // closed (and replaced) when room may have appeared
	maxStreams int           // the server's last announced stream limit
}

func (p *pool) snapshot() []*conn {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*conn(nil), p.conns...)
}

// get returns a connection with a stream reserved for the caller, dialling
// one when none has room (several at once when many calls wait).
func (p *pool) get(ctx context.Context) (*conn, error) {
	p.mu.Lock()
	for {
		for _, cc := range p.conns {
			if cc.reserve() {
				p.mu.Unlock()
				return cc, nil
			}
		}
		canDial := p.t.maxConns == 0 || len(p.conns)+p.dialing < p.t.maxConns
		if canDial && p.dialing*p.maxStreams <= p.waiting {
			p.dialing++
			p.mu.Unlock()
			cc, err := p.dial(ctx)
			p.mu.Lock()
			p.dialing--
			if err != nil {
				p.wakeLocked()
				p.mu.Unlock()
				return nil, err
			}
			p.conns = append(p.conns, cc)
			p.wakeLocked()
			n := cc.maxStreamsNow()
			if n == 0 {
				// Allowed by the protocol (the gateway may raise it later),
				// but dialling more would not help this call.
				p.mu.Unlock()
				return nil, fmt.Errorf("h2c: %s allows no streams (SETTINGS_MAX_CONCURRENT_STREAMS 0)", p.addr)
			}
			p.maxStreams = n
			continue
		}
		wake := p.wake
		p.waiting++
		p.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			p.mu.Lock()
			p.waiting--
			p.mu.Unlock()
			return nil, ctx.Err()
		}
		p.mu.Lock()
		p.waiting--
	}
}

// connect dials a connection unless one that takes streams is open.
func (p *pool) connect(ctx context.Context) error {
	p.mu.Lock()
	for _, cc := range p.conns {
		if cc.usable() {
			p.mu.Unlock()
			return nil
		}
	}
	if p.t.maxConns > 0 && len(p.conns)+p.dialing >= p.t.maxConns {
		// At the cap: the connections open (or being dialled) spoke h2c.
		p.mu.Unlock()
		return nil
	}
	p.dialing++
	p.mu.Unlock()
	cc, err := p.dial(ctx)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dialing--
	if err == nil {
		p.conns = append(p.conns, cc)
		if n := cc.maxStreamsNow(); n > 0 {
			p.maxStreams = n
		}
	}
	p.wakeLocked()
	return err
}

// wakeLocked lets the waiting calls look again. Caller holds mu.
func (p *pool) wakeLocked() {
	if p.waiting > 0 {
		close(p.wake)
		p.wake = make(chan struct{})
	}
}

// roomFreed is called when a stream of one of the pool's connections ends.
func (p *pool) roomFreed() {
	p.mu.Lock()
	p.wakeLocked()
	p.mu.Unlock()
}

func (p *pool) remove(cc *conn) {
	p.mu.Lock()
	for i, c := range p.conns {
		if c == cc {
			p.conns = append(p.conns[:i], p.conns[i+1:]...)
			break
		}
	}
	p.wakeLocked()
	p.mu.Unlock()
}
