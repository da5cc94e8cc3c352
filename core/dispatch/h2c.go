package dispatch

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// h2c.go is sluice's HTTP/2 client for http:// gateways spoken to with prior
// knowledge (Config.Protocol "h2c"). It is built on the framing and HPACK
// packages of golang.org/x/net/http2 and does only what a dispatcher needs:
// POST a body held in memory, read the answer.
//
// Why not net/http's HTTP/2 client: it runs a goroutine per call besides the
// caller's, allocates ~60 times per call and flushes after each frame; with
// thousands of one-second calls in flight on a small host its CPU and its
// goroutines' stacks were the largest cost of a request (docs/benchmarks.md).
// Here a call costs no goroutine: the caller writes its frames under the
// connection's write lock into a coalescingConn and then flushes it (sending
// in one system call what other calls wrote meanwhile, or leaving its frames
// to the call already writing), and one read loop per connection hands each
// stream its answer.
//
// Semantics kept from net/http: streams beyond the server's
// SETTINGS_MAX_CONCURRENT_STREAMS go to another connection (dialled when
// none has room, up to Config.MaxConnsPerHost); a request the server did not
// process (REFUSED_STREAM, or a stream above a GOAWAY's last stream ID) is
// sent again on another connection; a cancelled call resets its stream;
// flow control both ways; a connection silent for 30 s while calls are open
// is pinged and dropped if the ping is not answered within 15 s; idle
// connections close after 90 s.
// Not supported: proxies (h2c goes straight to the gateway), server push
// (disabled in our SETTINGS), request trailers.

const (
	// h2cStreamWindow and h2cConnWindow are the receive windows sluice
	// advertises: answers are read into memory at once, so they only bound
	// what a gateway may send ahead of sluice reading it.
	h2cStreamWindow = 4 << 20
	h2cConnWindow   = 64 << 20
	// h2cMaxHeaderList bounds a response's header block.
	h2cMaxHeaderList = 1 << 20
	// h2cDefaultMaxStreams is assumed until the server's first SETTINGS
	// frame says otherwise (RFC 9113 leaves it unlimited; net/http assumes
	// 100 as well).
	h2cDefaultMaxStreams = 100
	// h2cMaxStreamID: a connection stops taking streams near the end of the
	// stream ID space (leaving room for the streams already reserved: at
	// most h2cMaxStreams) and a new one is dialled.
	h2cMaxStreamID = 1<<31 - 1 - 2*h2cMaxStreams
	// h2cMaxStreams caps the streams one connection carries at once,
	// whatever the gateway allows.
	h2cMaxStreams = 1 << 20
	// h2cRetries bounds how often a request the server did not process is
	// sent again.
	h2cRetries = 3
	// h2cHealthTick is how often a connection checks for silence and idleness.
	h2cHealthTick = time.Second
)

// errH2CUnprocessed marks a request the server did not process: it may be sent again.
var errH2CUnprocessed = errors.New("h2c: the gateway did not process the request")

// errH2CNotSpoken is the handshake error with a gateway that answered the
// HTTP/2 preface in HTTP/1.1.
var errH2CNotSpoken = errors.New("the gateway answered in HTTP/1.1: it does not accept HTTP/2 with prior knowledge (set dispatch.protocol to http1)")

// errH2CPingLost fails the calls of a connection whose ping went unanswered.
var errH2CPingLost = errors.New("h2c: the gateway did not answer a ping")

// h2cTransport posts requests over HTTP/2 with prior knowledge. It keeps a
// pool of connections per gateway address.
type h2cTransport struct {
	dial     func(ctx context.Context, network, addr string) (net.Conn, error)
	maxConns int // per address; 0: no cap
	// Connection health: ping after pingAfter of silence while calls are
	// open, drop the connection pingTimeout after an unanswered ping, close
	// it after idleTimeout without calls; checked every tick.
	pingAfter, pingTimeout, idleTimeout, tick time.Duration

	mu    sync.Mutex
	pools map[string]*h2cPool
}

func newH2CTransport(dial func(ctx context.Context, network, addr string) (net.Conn, error), maxConns int) *h2cTransport {
	return &h2cTransport{dial: dial, maxConns: maxConns, pools: map[string]*h2cPool{},
		pingAfter: h2SendPingTimeout, pingTimeout: h2PingTimeout, idleTimeout: idleConnTimeout, tick: h2cHealthTick}
}

// post sends payload to ep with the headers h (names in lower case, none of
// them hop-by-hop: Client.headers builds them so) and returns the response
// once its headers have arrived. The response body must be closed.
func (t *h2cTransport) post(ctx context.Context, ep *endpoint, h http.Header, payload []byte) (*http.Response, error) {
	p := t.pool(ep.addr)
	for attempt := 0; ; attempt++ {
		cc, err := p.get(ctx)
		if err != nil {
			return nil, err
		}
		resp, err := cc.roundTrip(ctx, ep, h, payload)
		if err != nil && errors.Is(err, errH2CUnprocessed) && attempt < h2cRetries && ctx.Err() == nil {
			continue
		}
		return resp, err
	}
}

func (t *h2cTransport) pool(addr string) *h2cPool {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.pools[addr]
	if p == nil {
		p = &h2cPool{t: t, addr: addr, wake: make(chan struct{}), maxStreams: h2cDefaultMaxStreams}
		t.pools[addr] = p
	}
	return p
}

// closeIdle closes the connections that carry no call.
func (t *h2cTransport) closeIdle() {
	t.mu.Lock()
	pools := make([]*h2cPool, 0, len(t.pools))
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

// h2cPool is the connections to one gateway address.
type h2cPool struct {
	t    *h2cTransport
	addr string

	mu         sync.Mutex
	conns      []*h2cConn
	dialing    int           // dials in progress
	waiting    int           // calls waiting for room
	wake       chan struct{} // closed (and replaced) when room may have appeared
	maxStreams int           // the server's last announced stream limit
}

func (p *h2cPool) snapshot() []*h2cConn {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*h2cConn(nil), p.conns...)
}

// get returns a connection with a stream reserved for the caller, dialling
// one when none has room (several at once when many calls wait).
func (p *h2cPool) get(ctx context.Context) (*h2cConn, error) {
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
			cc, err := p.dialConn(ctx)
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

// wakeLocked lets the waiting calls look again. Caller holds mu.
func (p *h2cPool) wakeLocked() {
	if p.waiting > 0 {
		close(p.wake)
		p.wake = make(chan struct{})
	}
}

// roomFreed is called when a stream of one of the pool's connections ends.
func (p *h2cPool) roomFreed() {
	p.mu.Lock()
	p.wakeLocked()
	p.mu.Unlock()
}

func (p *h2cPool) remove(cc *h2cConn) {
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

// dialConn dials the address and does the HTTP/2 handshake: the client
// preface and SETTINGS, then the server's SETTINGS (which the protocol says
// come first), acknowledged.
func (p *h2cPool) dialConn(ctx context.Context) (*h2cConn, error) {
	nc, err := p.t.dial(ctx, "tcp", p.addr)
	if err != nil {
		return nil, err
	}
	cc := &h2cConn{
		pool:        p,
		streams:     map[uint32]*h2cStream{},
		nextID:      1,
		maxStreams:  h2cDefaultMaxStreams,
		peerWindow:  65535,
		sendWindow:  65535,
		peerMaxRead: 16 << 10,
		windowGrew:  make(chan struct{}),
		closed:      make(chan struct{}),
	}
	// Frames are written to a coalescingConn: each Write (one frame) is a
	// copy into its buffer; write flushes it.
	wc := newCoalescingConn(nc)
	cc.wc = wc
	br := bufio.NewReaderSize(nc, 16<<10)
	cc.fr = http2.NewFramer(wc, br)
	cc.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	cc.fr.MaxHeaderListSize = h2cMaxHeaderList
	cc.henc = hpack.NewEncoder(&cc.hbuf)

	deadline := time.Now().Add(dialTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = nc.SetDeadline(deadline)
	err = func() error {
		if _, err := io.WriteString(wc, http2.ClientPreface); err != nil {
			return err
		}
		if err := cc.fr.WriteSettings(
			http2.Setting{ID: http2.SettingEnablePush, Val: 0},
			http2.Setting{ID: http2.SettingInitialWindowSize, Val: h2cStreamWindow},
			http2.Setting{ID: http2.SettingMaxHeaderListSize, Val: h2cMaxHeaderList},
		); err != nil {
			return err
		}
		if err := cc.fr.WriteWindowUpdate(0, h2cConnWindow-65535); err != nil {
			return err
		}
		if err := wc.Flush(); err != nil {
			return err
		}
		// A gateway that does not speak HTTP/2 with prior knowledge answers
		// the preface with an HTTP/1.1 error: say so plainly.
		if b, err := br.Peek(len("HTTP/1.")); err == nil && string(b) == "HTTP/1." {
			return errH2CNotSpoken
		}
		f, err := cc.fr.ReadFrame()
		if err != nil {
			return err
		}
		sf, ok := f.(*http2.SettingsFrame)
		if !ok || sf.IsAck() {
			return fmt.Errorf("expected the server's SETTINGS, got %v", f.Header())
		}
		if err := cc.applySettings(sf); err != nil {
			return err
		}
		if err := cc.fr.WriteSettingsAck(); err != nil {
			return err
		}
		return wc.Flush()
	}()
	if err != nil {
		_ = wc.Close()
		return nil, fmt.Errorf("h2c handshake with %s: %w", p.addr, err)
	}
	_ = nc.SetDeadline(time.Time{})
	cc.lastRead.Store(time.Now().UnixNano())
	cc.idleSince = time.Now()
	go cc.readLoop()
	go cc.health()
	return cc, nil
}

// h2cConn is one HTTP/2 connection.
type h2cConn struct {
	pool *h2cPool
	wc   *coalescingConn // the socket

	// Writing: frames are written under wmu; the framer's writing side and
	// the HPACK encoder belong to whoever holds it.
	wmu  sync.Mutex
	fr   *http2.Framer // its reading side is the read loop's alone
	henc *hpack.Encoder
	hbuf bytes.Buffer

	lastRead atomic.Int64 // Unix ns of the last frame read

	mu          sync.Mutex // guards the fields below
	streams     map[uint32]*h2cStream
	nextID      uint32
	active      int // streams reserved or open
	maxStreams  int // the server's SETTINGS_MAX_CONCURRENT_STREAMS
	peerWindow  int32
	sendWindow  int32         // connection-level send window
	peerMaxRead uint32        // the server's SETTINGS_MAX_FRAME_SIZE
	windowGrew  chan struct{} // closed (and replaced) when a send window grows
	goingAway   bool          // GOAWAY received or ID space used up: no new streams
	err         error         // the connection failed; set once
	idleSince   time.Time     // when active last dropped to 0
	pingSent    time.Time     // an unanswered health ping, or zero
	recvUnacked int32         // connection-level bytes consumed and not yet given back
	closed      chan struct{} // closed when the connection is closed
	closeOnce   sync.Once
}

func (cc *h2cConn) maxStreamsNow() int {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return cc.maxStreams
}

// reserve takes a stream slot if the connection has one.
func (cc *h2cConn) reserve() bool {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if cc.nextID > h2cMaxStreamID {
		cc.goingAway = true // closed once its last stream ends
	}
	if cc.err != nil || cc.goingAway || cc.active >= cc.maxStreams {
		return false
	}
	cc.active++
	return true
}

// unreserve gives back a slot taken by reserve (or held by a stream that has
// ended) and closes a connection that is going away and now carries nothing.
func (cc *h2cConn) unreserve() {
	cc.mu.Lock()
	cc.active--
	idle := cc.active == 0
	if idle {
		cc.idleSince = time.Now()
	}
	drop := idle && cc.goingAway
	cc.mu.Unlock()
	if drop {
		cc.close(nil)
	}
	cc.pool.roomFreed()
}

func (cc *h2cConn) closeIfIdle() {
	cc.mu.Lock()
	idle := cc.active == 0
	if idle {
		cc.goingAway = true
	}
	cc.mu.Unlock()
	if idle {
		cc.close(nil)
	}
}

// close fails every open stream with err (a closed connection when nil)
// and closes the socket. Only the first call has an effect.
func (cc *h2cConn) close(err error) {
	cc.closeOnce.Do(func() {
		if err == nil {
			err = net.ErrClosed
		}
		cc.mu.Lock()
		if cc.err == nil {
			cc.err = err
		}
		streams := cc.streams
		cc.streams = map[uint32]*h2cStream{}
		close(cc.windowGrew)
		cc.windowGrew = make(chan struct{})
		cc.mu.Unlock()
		close(cc.closed)
		_ = cc.wc.Close()
		for _, cs := range streams {
			cs.fail(fmt.Errorf("h2c connection to %s: %w", cc.pool.addr, err), true)
		}
		cc.pool.remove(cc)
	})
}

// write runs fn (which writes frames) under the write lock, then flushes
// (see coalescingConn). A write error fails the connection.
func (cc *h2cConn) write(fn func() error) error {
	cc.wmu.Lock()
	err := fn()
	cc.wmu.Unlock()
	if err == nil {
		err = cc.wc.Flush()
	}
	if err != nil {
		cc.close(err)
	}
	return err
}

// roundTrip sends one request on a stream reserved by reserve and waits for
// the response headers.
func (cc *h2cConn) roundTrip(ctx context.Context, ep *endpoint, h http.Header, payload []byte) (*http.Response, error) {
	cs := &h2cStream{cc: cc, resp: make(chan struct{}), notify: make(chan struct{}, 1)}
	var sent bool
	rest := payload
	err := cc.write(func() error {
		cc.mu.Lock()
		if cc.err != nil || cc.goingAway {
			cc.mu.Unlock()
			return nil
		}
		cs.id = cc.nextID
		cc.nextID += 2
		cs.sendWindow = cc.peerWindow
		cc.streams[cs.id] = cs
		maxFrame := int(cc.peerMaxRead)
		cc.mu.Unlock()
		sent = true
		if err := cc.writeHeaders(cs.id, ep, h, len(payload), maxFrame); err != nil {
			return err
		}
		// As much of the body as the windows allow (usually all of it)
		// goes with the headers.
		var err error
		rest, err = cc.writeData(cs, rest)
		return err
	})
	if !sent {
		cc.unreserve()
		return nil, errH2CUnprocessed
	}
	if err != nil {
		cs.end()
		return nil, err
	}
	if len(rest) > 0 {
		if err := cc.writeBody(ctx, cs, rest); err != nil {
			cs.reset(http2.ErrCodeCancel)
			return nil, err
		}
	}
	select {
	case <-cs.resp:
	case <-ctx.Done():
		cs.reset(http2.ErrCodeCancel)
		return nil, ctx.Err()
	}
	cs.mu.Lock()
	status, err := cs.status, cs.err
	cs.mu.Unlock()
	if status == 0 {
		cs.end()
		return nil, err
	}
	return &http.Response{
		// Status (the text) is left empty: Client.response reads StatusCode.
		StatusCode:    status,
		Proto:         "HTTP/2.0",
		ProtoMajor:    2,
		Header:        cs.header,
		ContentLength: cs.contentLength,
		Body:          &h2cBody{cs: cs, ctx: ctx},
	}, nil
}

// writeHeaders encodes and writes the request's header block (HEADERS, then
// CONTINUATION frames if it does not fit one frame). Caller holds wmu.
func (cc *h2cConn) writeHeaders(id uint32, ep *endpoint, h http.Header, bodyLen, maxFrame int) error {
	cc.hbuf.Reset()
	enc := func(name, value string) {
		_ = cc.henc.WriteField(hpack.HeaderField{Name: name, Value: value})
	}
	enc(":method", http.MethodPost)
	enc(":scheme", "http")
	enc(":authority", ep.u.Host)
	enc(":path", ep.path)
	for k, vs := range h {
		for _, v := range vs {
			enc(k, v)
		}
	}
	if bodyLen > 0 {
		var arr [20]byte
		enc("content-length", string(strconv.AppendInt(arr[:0], int64(bodyLen), 10)))
	}
	block := cc.hbuf.Bytes()
	first := true
	for first || len(block) > 0 {
		n := min(len(block), maxFrame)
		chunk, rest := block[:n], block[n:]
		var err error
		if first {
			err = cc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: chunk,
				EndStream: bodyLen == 0, EndHeaders: len(rest) == 0})
		} else {
			err = cc.fr.WriteContinuation(id, len(rest) == 0, chunk)
		}
		if err != nil {
			return err
		}
		first, block = false, rest
	}
	return nil
}

// writeData writes as much of payload in DATA frames as the send windows
// allow and returns the rest. Caller holds wmu.
func (cc *h2cConn) writeData(cs *h2cStream, payload []byte) ([]byte, error) {
	for len(payload) > 0 {
		cc.mu.Lock()
		if cc.err != nil {
			err := cc.err
			cc.mu.Unlock()
			return payload, err
		}
		n := min(int32(len(payload)), cc.sendWindow, cs.sendWindow, int32(cc.peerMaxRead))
		if n <= 0 {
			cc.mu.Unlock()
			return payload, nil
		}
		cc.sendWindow -= n
		cs.sendWindow -= n
		cc.mu.Unlock()
		chunk := payload[:n]
		payload = payload[n:]
		if err := cc.fr.WriteData(cs.id, len(payload) == 0, chunk); err != nil {
			return payload, err
		}
	}
	return nil, nil
}

// writeBody writes the rest of a body as the send windows grow, waiting
// for them without the write lock.
func (cc *h2cConn) writeBody(ctx context.Context, cs *h2cStream, payload []byte) error {
	for len(payload) > 0 {
		cc.mu.Lock()
		waitFor := cc.windowGrew
		cc.mu.Unlock()
		err := cc.write(func() error {
			var err error
			payload, err = cc.writeData(cs, payload)
			return err
		})
		if err != nil {
			return err
		}
		if len(payload) > 0 {
			select {
			case <-waitFor:
			case <-cs.resp: // answered (or reset) before the body was sent
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	return nil
}

// readLoop reads frames until the connection fails, and hands each stream
// its headers and data.
func (cc *h2cConn) readLoop() {
	var err error
	for {
		var f http2.Frame
		f, err = cc.fr.ReadFrame()
		if err != nil {
			break
		}
		cc.lastRead.Store(time.Now().UnixNano())
		if err = cc.handle(f); err != nil {
			break
		}
	}
	cc.close(err)
}

func (cc *h2cConn) stream(id uint32) *h2cStream {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return cc.streams[id]
}

func (cc *h2cConn) handle(f http2.Frame) error {
	switch f := f.(type) {
	case *http2.MetaHeadersFrame:
		if cs := cc.stream(f.StreamID); cs != nil {
			cs.gotHeaders(f)
		}
	case *http2.DataFrame:
		n := int32(f.Length) // padding counts against the windows too
		cs := cc.stream(f.StreamID)
		if cs == nil || !cs.gotData(f.Data(), f.StreamEnded()) {
			// Nobody will read it: give its share of the window back now.
			return cc.consumed(nil, n)
		}
		if pad := n - int32(len(f.Data())); pad > 0 {
			return cc.consumed(cs, pad)
		}
	case *http2.RSTStreamFrame:
		if cs := cc.stream(f.StreamID); cs != nil {
			err := error(http2.StreamError{StreamID: f.StreamID, Code: f.ErrCode})
			if f.ErrCode == http2.ErrCodeRefusedStream {
				err = fmt.Errorf("%w: %w", errH2CUnprocessed, err)
			}
			cs.fail(err, false)
		}
	case *http2.SettingsFrame:
		if f.IsAck() {
			return nil
		}
		if err := cc.applySettings(f); err != nil {
			return err
		}
		return cc.write(cc.fr.WriteSettingsAck)
	case *http2.WindowUpdateFrame:
		cc.mu.Lock()
		if f.StreamID == 0 {
			cc.sendWindow += int32(f.Increment)
		} else if cs := cc.streams[f.StreamID]; cs != nil {
			cs.sendWindow += int32(f.Increment)
		}
		close(cc.windowGrew)
		cc.windowGrew = make(chan struct{})
		cc.mu.Unlock()
	case *http2.PingFrame:
		if f.IsAck() {
			cc.mu.Lock()
			cc.pingSent = time.Time{}
			cc.mu.Unlock()
			return nil
		}
		return cc.write(func() error { return cc.fr.WritePing(true, f.Data) })
	case *http2.GoAwayFrame:
		cc.mu.Lock()
		cc.goingAway = true
		var refused []*h2cStream
		for id, cs := range cc.streams {
			if id > f.LastStreamID {
				refused = append(refused, cs)
			}
		}
		idle := cc.active == 0
		cc.mu.Unlock()
		for _, cs := range refused {
			cs.fail(fmt.Errorf("%w: GOAWAY %v", errH2CUnprocessed, f.ErrCode), false)
		}
		cc.pool.roomFreed()
		if idle {
			return io.EOF // nothing left on it
		}
	case *http2.PushPromiseFrame:
		return http2.ConnectionError(http2.ErrCodeProtocol) // push is disabled
	}
	return nil
}

func (cc *h2cConn) applySettings(f *http2.SettingsFrame) error {
	return f.ForeachSetting(func(s http2.Setting) error {
		if err := s.Valid(); err != nil {
			return err
		}
		switch s.ID {
		case http2.SettingMaxConcurrentStreams:
			cc.mu.Lock()
			cc.maxStreams = int(min(s.Val, h2cMaxStreams))
			cc.mu.Unlock()
		case http2.SettingInitialWindowSize:
			cc.mu.Lock()
			delta := int32(s.Val) - cc.peerWindow
			cc.peerWindow = int32(s.Val)
			for _, cs := range cc.streams {
				cs.sendWindow += delta
			}
			close(cc.windowGrew)
			cc.windowGrew = make(chan struct{})
			cc.mu.Unlock()
		case http2.SettingMaxFrameSize:
			cc.mu.Lock()
			cc.peerMaxRead = s.Val
			cc.mu.Unlock()
		case http2.SettingHeaderTableSize:
			cc.wmu.Lock()
			cc.henc.SetMaxDynamicTableSizeLimit(s.Val)
			cc.wmu.Unlock()
		}
		return nil
	})
}

// consumed gives n bytes of receive window back: the connection's once half
// of it is used, and cs's (when not nil and still open) likewise.
func (cc *h2cConn) consumed(cs *h2cStream, n int32) error {
	cc.mu.Lock()
	cc.recvUnacked += n
	connInc := int32(0)
	if cc.recvUnacked >= h2cConnWindow/2 {
		connInc, cc.recvUnacked = cc.recvUnacked, 0
	}
	cc.mu.Unlock()
	streamInc := int32(0)
	if cs != nil {
		streamInc = cs.consumed(n)
	}
	if connInc == 0 && streamInc == 0 {
		return nil
	}
	return cc.write(func() error {
		if connInc > 0 {
			if err := cc.fr.WriteWindowUpdate(0, uint32(connInc)); err != nil {
				return err
			}
		}
		if streamInc > 0 {
			return cc.fr.WriteWindowUpdate(cs.id, uint32(streamInc))
		}
		return nil
	})
}

// health closes the connection when it has been idle for idleTimeout, and
// pings it when calls are open and it has been silent for pingAfter; an
// unanswered ping closes it after pingTimeout.
func (cc *h2cConn) health() {
	tr := cc.pool.t
	t := time.NewTicker(tr.tick)
	defer t.Stop()
	for {
		select {
		case <-cc.closed:
			return
		case now := <-t.C:
			cc.mu.Lock()
			idle := cc.active == 0 && now.Sub(cc.idleSince) >= tr.idleTimeout
			silent := now.Sub(time.Unix(0, cc.lastRead.Load())) >= tr.pingAfter
			pingLost := !cc.pingSent.IsZero() && now.Sub(cc.pingSent) >= tr.pingTimeout
			ping := cc.active > 0 && silent && cc.pingSent.IsZero()
			if ping {
				cc.pingSent = now
			}
			cc.mu.Unlock()
			switch {
			case idle:
				cc.closeIfIdle()
			case pingLost:
				cc.close(fmt.Errorf("%w within %s", errH2CPingLost, tr.pingTimeout))
			case ping:
				_ = cc.write(func() error { return cc.fr.WritePing(false, [8]byte{'s', 'l', 'u', 'i', 'c', 'e'}) })
			}
		}
	}
}

// h2cStream is one call.
type h2cStream struct {
	cc         *h2cConn
	id         uint32
	sendWindow int32 // guarded by cc.mu

	resp   chan struct{} // closed when the response headers (or an error) arrived
	notify chan struct{} // one token: data or the end arrived

	mu            sync.Mutex // guards the fields below; resp's closing publishes status, header, contentLength
	status        int
	header        http.Header
	contentLength int64
	gotResp       bool
	buf           []byte // received, not yet read
	eof           bool   // END_STREAM received
	err           error
	unacked       int32 // read and not yet given back to the stream's window
	ended         bool  // slot given back
}

// gotHeaders takes a response header block (informational ones are skipped;
// a second block is the trailers, which end the stream).
func (cs *h2cStream) gotHeaders(f *http2.MetaHeadersFrame) {
	cs.mu.Lock()
	if cs.gotResp {
		cs.mu.Unlock()
		if f.StreamEnded() {
			cs.gotData(nil, true)
		}
		return
	}
	status, err := strconv.Atoi(f.PseudoValue("status"))
	if err != nil || status < 100 || status > 999 {
		cs.mu.Unlock()
		cs.fail(fmt.Errorf("h2c: malformed response status %q", f.PseudoValue("status")), false)
		return
	}
	if status < 200 && !f.StreamEnded() {
		cs.mu.Unlock()
		return
	}
	fields := f.RegularFields()
	h := make(http.Header, len(fields))
	cs.contentLength = -1
	for _, hf := range fields {
		k := http.CanonicalHeaderKey(hf.Name)
		h[k] = append(h[k], hf.Value)
		if k == "Content-Length" {
			if n, err := strconv.ParseInt(hf.Value, 10, 64); err == nil && n >= 0 {
				cs.contentLength = n
			}
		}
	}
	cs.status, cs.header, cs.gotResp = status, h, true
	if f.StreamEnded() {
		cs.eof = true
		cs.contentLength = 0
	}
	close(cs.resp)
	cs.mu.Unlock()
	if f.StreamEnded() {
		cs.end()
	}
}

// gotData appends data; it reports false when the stream no longer wants
// it (it failed or was reset).
func (cs *h2cStream) gotData(data []byte, end bool) bool {
	cs.mu.Lock()
	if cs.err != nil || !cs.gotResp {
		early := cs.err == nil // DATA before any response headers
		cs.mu.Unlock()
		if early {
			cs.fail(errors.New("h2c: DATA before the response headers"), false)
		}
		return false
	}
	cs.buf = append(cs.buf, data...)
	cs.eof = cs.eof || end
	cs.mu.Unlock()
	cs.wake()
	if end {
		cs.end()
	}
	return true
}

// fail ends the stream with err, unless it has ended already; connGone
// says its connection has failed (and forgotten it).
func (cs *h2cStream) fail(err error, connGone bool) {
	cs.mu.Lock()
	if cs.err != nil || cs.eof {
		cs.mu.Unlock()
		return
	}
	cs.err = err
	if !cs.gotResp {
		cs.gotResp = true
		close(cs.resp)
	}
	unread := cs.dropBuffer()
	cs.mu.Unlock()
	cs.wake()
	if connGone {
		cs.release()
		return
	}
	_ = cs.cc.consumed(nil, unread)
	cs.end()
}

// wake tells a reader waiting in h2cBody.Read to look again.
func (cs *h2cStream) wake() {
	select {
	case cs.notify <- struct{}{}:
	default:
	}
}

// reset cancels the stream: RST_STREAM to the server (unless the server
// has ended it), what it buffered given back to the connection's window,
// and the slot back.
func (cs *h2cStream) reset(code http2.ErrCode) {
	cs.mu.Lock()
	done := cs.eof || cs.ended
	if cs.err == nil {
		cs.err = errors.New("h2c: stream cancelled")
	}
	if !cs.gotResp {
		cs.gotResp = true
		close(cs.resp)
	}
	unread := cs.dropBuffer()
	cs.mu.Unlock()
	cc := cs.cc
	if !done {
		_ = cc.write(func() error { return cc.fr.WriteRSTStream(cs.id, code) })
	}
	_ = cc.consumed(nil, unread)
	cs.end()
}

// dropBuffer discards what was received and not read, and returns its
// size. Caller holds mu.
func (cs *h2cStream) dropBuffer() int32 {
	n := int32(len(cs.buf))
	cs.buf = nil
	return n
}

// end removes the stream from its connection and gives its slot back, once.
func (cs *h2cStream) end() {
	cc := cs.cc
	cc.mu.Lock()
	if cc.streams[cs.id] == cs {
		delete(cc.streams, cs.id)
	}
	cc.mu.Unlock()
	cs.release()
}

func (cs *h2cStream) release() {
	cs.mu.Lock()
	done := cs.ended
	cs.ended = true
	cs.mu.Unlock()
	if !done {
		cs.cc.unreserve()
	}
}

// consumed records n bytes read from the stream and returns the window
// increment to send for it (0 while less than half is used or once the
// server has ended the stream).
func (cs *h2cStream) consumed(n int32) int32 {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.eof || cs.err != nil {
		return 0
	}
	cs.unacked += n
	if cs.unacked < h2cStreamWindow/2 {
		return 0
	}
	inc := cs.unacked
	cs.unacked = 0
	return inc
}

// h2cBody is a response body.
type h2cBody struct {
	cs     *h2cStream
	ctx    context.Context
	closed bool
}

func (b *h2cBody) Read(p []byte) (int, error) {
	cs := b.cs
	for {
		cs.mu.Lock()
		if len(cs.buf) > 0 {
			n := copy(p, cs.buf)
			cs.buf = cs.buf[n:]
			if len(cs.buf) == 0 {
				cs.buf = nil
			}
			cs.mu.Unlock()
			if err := cs.cc.consumed(cs, int32(n)); err != nil {
				return n, err
			}
			return n, nil
		}
		err, eof := cs.err, cs.eof
		cs.mu.Unlock()
		if err != nil {
			return 0, err
		}
		if eof {
			return 0, io.EOF
		}
		select {
		case <-cs.notify:
		case <-b.ctx.Done():
			cs.reset(http2.ErrCodeCancel)
			return 0, b.ctx.Err()
		}
	}
}

// Close resets the stream if the server has not finished it.
func (b *h2cBody) Close() error {
	if b.closed {
		return nil
	}
	b.closed = true
	cs := b.cs
	cs.mu.Lock()
	finished := cs.eof || cs.err != nil
	var unread int32
	if finished {
		unread = cs.dropBuffer()
	}
	cs.mu.Unlock()
	if !finished {
		cs.reset(http2.ErrCodeCancel)
		return nil
	}
	if unread > 0 {
		_ = cs.cc.consumed(nil, unread)
	}
	return nil
}
