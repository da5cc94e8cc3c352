package h2c

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

// conn is one HTTP/2 connection.
type conn struct {
	t    *Transport
	pool *pool
	wc   *coalescingConn // the socket

	// Writing: frames are written under wmu; the framer's writing side and
	// the HPACK encoder belong to whoever holds it.
	wmu  sync.Mutex
	fr   *http2.Framer // its reading side is the read loop's alone
	henc *hpack.Encoder
	hbuf bytes.Buffer

	lastRead atomic.Int64 // Unix ns of the last frame read

	mu          sync.Mutex // guards the fields below and the streams' windows
	streams     map[uint32]*stream
	nextID      uint32
	active      int // streams reserved or open
	maxStreams  int // the server's SETTINGS_MAX_CONCURRENT_STREAMS
	peerWindow  int32
	sendWindow  int32         // connection-level send window
	peerMaxRead uint32        // the server's SETTINGS_MAX_FRAME_SIZE
	recvWindow  int32         // connection-level receive window: what the server may still send
	recvUnacked int32         // connection-level bytes consumed and not yet given back
	windowGrew  chan struct{} // closed (and replaced) when a send window grows
	goingAway   bool          // GOAWAY received or ID space used up: no new streams
	err         error         // why the connection failed; set once
	idleSince   time.Time     // when active last dropped to 0
	pingSent    time.Time     // an unanswered health ping, or zero
	closed      chan struct{} // closed when the connection is closed
	closeOnce   sync.Once
}

// dial dials the address and does the HTTP/2 handshake: the client preface
// and SETTINGS, then the server's SETTINGS (which the protocol says come
// first), acknowledged.
func (p *pool) dial(ctx context.Context) (*conn, error) {
	t := p.t
	nc, err := t.dial(ctx, "tcp", p.addr)
	if err != nil {
		return nil, err
	}
	cc := &conn{
		t:           t,
		pool:        p,
		streams:     map[uint32]*stream{},
		nextID:      1,
		maxStreams:  defaultMaxStreams,
		peerWindow:  initialWindow,
		sendWindow:  initialWindow,
		peerMaxRead: maxReadFrame,
		recvWindow:  max(t.connWindow, initialWindow),
		windowGrew:  make(chan struct{}),
		closed:      make(chan struct{}),
	}
	// Frames are written to a coalescingConn: each Write (one frame) is a
	// copy into its buffer; write flushes it.
	cc.wc = newCoalescingConn(nc, t.writeStall)
	br := bufio.NewReaderSize(nc, 16<<10)
	cc.fr = http2.NewFramer(cc.wc, br)
	cc.fr.SetMaxReadFrameSize(maxReadFrame)
	cc.fr.SetReuseFrames() // the read loop is done with a frame before it reads the next
	cc.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	cc.fr.MaxHeaderListSize = maxHeaderList
	cc.henc = hpack.NewEncoder(&cc.hbuf)
	if err := cc.handshake(ctx, nc, br); err != nil {
		if pe := cc.protocolError(err); pe != nil {
			err = pe
			_ = cc.fr.WriteGoAway(0, pe.Code, nil) // Close sends it
		}
		_ = cc.wc.Close()
		return nil, &HandshakeError{Addr: p.addr, Err: err}
	}
	cc.lastRead.Store(time.Now().UnixNano())
	cc.idleSince = time.Now()
	t.running.Add(2)
	go cc.readLoop()
	go cc.health()
	return cc, nil
}

func (cc *conn) handshake(ctx context.Context, nc net.Conn, br *bufio.Reader) error {
	// Reads are bounded by the handshake timeout and the caller's context
	// (writes by the coalescingConn's stall bound).
	deadline := time.Now().Add(cc.t.handshakeTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = nc.SetReadDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { _ = nc.SetReadDeadline(time.Unix(1, 0)) })
	err := cc.exchangeSettings(br)
	if !stop() {
		// The context ended: the read deadline is (or is about to be) in
		// the past, whatever the exchange did.
		return context.Cause(ctx)
	}
	if err != nil {
		return err
	}
	return nc.SetReadDeadline(time.Time{})
}

func (cc *conn) exchangeSettings(br *bufio.Reader) error {
	if _, err := io.WriteString(cc.wc, http2.ClientPreface); err != nil {
		return err
	}
	if err := cc.fr.WriteSettings(
		http2.Setting{ID: http2.SettingEnablePush, Val: 0},
		http2.Setting{ID: http2.SettingInitialWindowSize, Val: uint32(cc.t.streamWindow)},
		http2.Setting{ID: http2.SettingMaxHeaderListSize, Val: maxHeaderList},
	); err != nil {
		return err
	}
	if inc := cc.recvWindow - initialWindow; inc > 0 {
		if err := cc.fr.WriteWindowUpdate(0, uint32(inc)); err != nil {
			return err
		}
	}
	if err := cc.wc.Flush(); err != nil {
		return err
	}
	// A gateway that does not speak HTTP/2 with prior knowledge answers
	// the preface with an HTTP/1.1 error: say so plainly.
	if b, err := br.Peek(len("HTTP/1.")); err == nil && string(b) == "HTTP/1." {
		return ErrNotSpoken
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
	return cc.wc.Flush()
}

func (cc *conn) maxStreamsNow() int {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return cc.maxStreams
}

// usable reports whether the connection takes new streams (it may be full
// at the moment).
func (cc *conn) usable() bool {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return cc.err == nil && !cc.goingAway && cc.nextID <= maxStreamID
}

// reserve takes a stream slot if the connection has one.
func (cc *conn) reserve() bool {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if cc.nextID > maxStreamID {
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
// A connection that has failed is being closed already: close, failing its
// streams, gets here and must not be called again.
func (cc *conn) unreserve() {
	cc.mu.Lock()
	cc.active--
	idle := cc.active == 0
	if idle {
		cc.idleSince = time.Now()
	}
	drop := idle && cc.goingAway && cc.err == nil
	cc.mu.Unlock()
	if drop {
		cc.close(nil)
	}
	cc.pool.roomFreed()
}

func (cc *conn) closeIfIdle() {
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

// close fails every open stream with the connection's error (err, unless
// one was set before; a closed connection when both are nil) and closes
// the socket. Only the first call has an effect.
func (cc *conn) close(err error) {
	cc.closeOnce.Do(func() {
		cc.mu.Lock()
		if cc.err == nil {
			cc.err = err
		}
		if cc.err == nil {
			cc.err = net.ErrClosed
		}
		err = cc.err
		streams := cc.streams
		cc.streams = map[uint32]*stream{}
		cc.windowGrewLocked()
		cc.mu.Unlock()
		close(cc.closed)
		_ = cc.wc.Close()
		for _, cs := range streams {
			cs.fail(fmt.Errorf("h2c connection to %s: %w", cc.pool.addr, err), true)
		}
		cc.pool.remove(cc)
	})
}

// protocolError returns the connection error that err (from reading or
// handling a frame) is, or nil when it is no protocol violation.
func (cc *conn) protocolError(err error) *ProtocolError {
	var pe *ProtocolError
	var ce http2.ConnectionError
	switch {
	case errors.As(err, &pe):
		if pe.Stream == 0 {
			return pe
		}
	case errors.As(err, &ce):
		reason := "a malformed frame"
		switch d := cc.fr.ErrorDetail(); {
		case d != nil:
			reason = d.Error()
		case http2.ErrCode(ce) == http2.ErrCodeCompression:
			reason = "a header block HPACK cannot decode"
		case http2.ErrCode(ce) == http2.ErrCodeFlowControl:
			reason = "a SETTINGS_INITIAL_WINDOW_SIZE past 2^31-1"
		}
		return connError(http2.ErrCode(ce), "%s", reason)
	case errors.Is(err, http2.ErrFrameTooLarge):
		return connError(http2.ErrCodeFrameSize, "a frame larger than %d bytes", maxReadFrame)
	}
	return nil
}

// fail ends the connection after the read loop stopped with err: a protocol
// violation is told to the gateway in a GOAWAY first.
func (cc *conn) fail(err error) {
	pe := cc.protocolError(err)
	if pe == nil {
		cc.close(err)
		return
	}
	cc.mu.Lock()
	if cc.err == nil {
		cc.err = pe
	}
	cc.mu.Unlock()
	_ = cc.write(func() error { return cc.fr.WriteGoAway(0, pe.Code, nil) })
	cc.close(pe)
}

// write runs fn (which writes frames) under the write lock, then flushes
// (see coalescingConn). A write error fails the connection.
func (cc *conn) write(fn func() error) error {
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

// windowGrewLocked wakes the calls waiting for send window. Caller holds mu.
func (cc *conn) windowGrewLocked() {
	close(cc.windowGrew)
	cc.windowGrew = make(chan struct{})
}

// roundTrip sends one request on a stream reserved by reserve and waits for
// the response headers.
func (cc *conn) roundTrip(ctx context.Context, r *route, h http.Header, payload []byte) (*http.Response, error) {
	cs := &stream{cc: cc, resp: make(chan struct{}), notify: make(chan struct{}, 1)}
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
		cs.recvWindow = cc.t.streamWindow
		cc.streams[cs.id] = cs
		maxFrame := int(cc.peerMaxRead)
		cc.mu.Unlock()
		sent = true
		if err := cc.writeHeaders(cs.id, r, h, len(payload), maxFrame); err != nil {
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
		return nil, errUnprocessed
	}
	if err != nil {
		cs.end()
		return nil, err
	}
	if len(rest) > 0 {
		if err := cc.writeBody(ctx, cs, rest); err != nil {
			cs.abort(err, http2.ErrCodeCancel)
			return nil, err
		}
	}
	select {
	case <-cs.resp:
	case <-ctx.Done():
		cs.abort(errCancelled, http2.ErrCodeCancel)
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
		// Status (the text) is left empty: StatusCode is the answer.
		StatusCode:    status,
		Proto:         "HTTP/2.0",
		ProtoMajor:    2,
		Header:        cs.header,
		ContentLength: cs.contentLength,
		Body:          &body{cs: cs, ctx: ctx},
	}, nil
}

// writeHeaders encodes and writes the request's header block (HEADERS, then
// CONTINUATION frames if it does not fit one frame). Caller holds wmu.
func (cc *conn) writeHeaders(id uint32, r *route, h http.Header, bodyLen, maxFrame int) error {
	cc.hbuf.Reset()
	enc := func(name, value string) {
		_ = cc.henc.WriteField(hpack.HeaderField{Name: name, Value: value})
	}
	enc(":method", http.MethodPost)
	enc(":scheme", "http")
	enc(":authority", r.authority)
	enc(":path", r.path)
	for k, vs := range h {
		k = cc.t.lowerName(k)
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
// allow and returns the rest; nothing once the stream has ended (reset, or
// answered in full), since no frame may follow a stream's end. Caller holds
// wmu.
func (cc *conn) writeData(cs *stream, payload []byte) ([]byte, error) {
	for len(payload) > 0 {
		cc.mu.Lock()
		if cc.err != nil {
			err := cc.err
			cc.mu.Unlock()
			return payload, fmt.Errorf("h2c connection to %s: %w", cc.pool.addr, err)
		}
		if cc.streams[cs.id] != cs {
			cc.mu.Unlock()
			return nil, nil
		}
		n := min(int32(min(len(payload), maxWindow)), cc.sendWindow, cs.sendWindow, int32(cc.peerMaxRead))
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
func (cc *conn) writeBody(ctx context.Context, cs *stream, payload []byte) error {
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
// its headers and data. A stream error ends that stream alone.
func (cc *conn) readLoop() {
	defer cc.t.running.Done()
	var err error
	for {
		var f http2.Frame
		f, err = cc.fr.ReadFrame()
		if err != nil {
			if err = cc.readError(err); err != nil {
				break
			}
			continue
		}
		cc.lastRead.Store(time.Now().UnixNano())
		if err = cc.handle(f); err != nil {
			break
		}
	}
	cc.fail(err)
}

// readError handles an error from reading a frame: a stream error resets
// that stream alone (nil is returned: reading goes on); any other error
// ends the connection.
func (cc *conn) readError(err error) error {
	var se http2.StreamError
	if !errors.As(err, &se) {
		return err
	}
	cc.lastRead.Store(time.Now().UnixNano())
	reason := "a malformed frame"
	if se.Cause != nil {
		reason = se.Cause.Error()
	} else if se.Code == http2.ErrCodeProtocol {
		reason = "a WINDOW_UPDATE of 0 or a malformed frame"
	}
	return cc.streamError(se.StreamID, se.Code, reason)
}

// lookup returns the open stream id (nil if it is not open) and whether id
// is one the client never opened: a server-initiated (even) ID, or one not
// used yet. Frames on those are a connection error.
func (cc *conn) lookup(id uint32) (cs *stream, idle bool) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return cc.streams[id], id%2 == 0 || id >= cc.nextID
}

// streamError resets stream id with code; it returns a connection error
// when the client never opened id.
func (cc *conn) streamError(id uint32, code http2.ErrCode, reason string) error {
	cs, idle := cc.lookup(id)
	if cs == nil {
		if idle {
			return connError(http2.ErrCodeProtocol, "%s on stream %d, which the client never opened", reason, id)
		}
		return nil // already closed: nothing to reset
	}
	cs.abort(&ProtocolError{Stream: id, Code: code, Reason: reason}, code)
	return nil
}

func (cc *conn) handle(f http2.Frame) error {
	switch f := f.(type) {
	case *http2.MetaHeadersFrame:
		return cc.onHeaders(f)
	case *http2.DataFrame:
		return cc.onData(f)
	case *http2.RSTStreamFrame:
		cs, idle := cc.lookup(f.StreamID)
		if cs == nil {
			if idle {
				return connError(http2.ErrCodeProtocol, "RST_STREAM on stream %d, which the client never opened", f.StreamID)
			}
			return nil
		}
		err := fmt.Errorf("h2c stream %d: the gateway reset the stream: %w", f.StreamID,
			http2.StreamError{StreamID: f.StreamID, Code: f.ErrCode})
		if f.ErrCode == http2.ErrCodeRefusedStream {
			err = fmt.Errorf("%w: %w", errUnprocessed, err)
		}
		cs.fail(err, false)
	case *http2.SettingsFrame:
		if f.IsAck() {
			return nil
		}
		if err := cc.applySettings(f); err != nil {
			return err
		}
		return cc.write(cc.fr.WriteSettingsAck)
	case *http2.WindowUpdateFrame:
		return cc.onWindowUpdate(f)
	case *http2.PingFrame:
		if f.IsAck() {
			cc.mu.Lock()
			cc.pingSent = time.Time{}
			cc.mu.Unlock()
			return nil
		}
		data := f.Data
		return cc.write(func() error { return cc.fr.WritePing(true, data) })
	case *http2.GoAwayFrame:
		cc.mu.Lock()
		cc.goingAway = true
		var refused []*stream
		for id, cs := range cc.streams {
			if id > f.LastStreamID {
				refused = append(refused, cs)
			}
		}
		idle := cc.active == 0
		cc.mu.Unlock()
		for _, cs := range refused {
			cs.fail(fmt.Errorf("%w: GOAWAY %v", errUnprocessed, f.ErrCode), false)
		}
		cc.pool.roomFreed()
		if idle {
			return io.EOF // nothing left on it
		}
	case *http2.PushPromiseFrame:
		return connError(http2.ErrCodeProtocol, "PUSH_PROMISE, but push is disabled")
	}
	return nil
}

// onHeaders hands a header block to its stream.
func (cc *conn) onHeaders(f *http2.MetaHeadersFrame) error {
	cs, idle := cc.lookup(f.StreamID)
	if cs == nil {
		if idle {
			return connError(http2.ErrCodeProtocol, "HEADERS on stream %d, which the client never opened", f.StreamID)
		}
		return nil // a stream already ended or reset
	}
	if f.Truncated {
		cs.abort(fmt.Errorf("h2c stream %d: response header list larger than %d bytes", f.StreamID, maxHeaderList), http2.ErrCodeCancel)
		return nil
	}
	if reason := cs.gotHeaders(f); reason != "" {
		cs.abort(&ProtocolError{Stream: f.StreamID, Code: http2.ErrCodeProtocol, Reason: reason}, http2.ErrCodeProtocol)
	}
	return nil
}

// onData charges a DATA frame to the receive windows and hands its data to
// its stream. Data past the connection's window is a connection error, past
// the stream's a stream error (RFC 9113 §6.9.1).
func (cc *conn) onData(f *http2.DataFrame) error {
	id, n := f.StreamID, int32(f.Length) // padding counts against the windows too
	cc.mu.Lock()
	if n > cc.recvWindow {
		left := cc.recvWindow
		cc.mu.Unlock()
		return connError(http2.ErrCodeFlowControl,
			"the gateway sent %d bytes of DATA on stream %d past the connection's receive window (%d bytes left)", n, id, left)
	}
	cc.recvWindow -= n
	cs := cc.streams[id]
	if cs == nil {
		idle := id%2 == 0 || id >= cc.nextID
		cc.mu.Unlock()
		if idle {
			return connError(http2.ErrCodeProtocol, "DATA on stream %d, which the client never opened", id)
		}
		// A stream already ended or reset: give its share back now.
		return cc.consumed(nil, n)
	}
	if n > cs.recvWindow {
		left := cs.recvWindow
		cc.mu.Unlock()
		cs.abort(&ProtocolError{Stream: id, Code: http2.ErrCodeFlowControl,
			Reason: fmt.Sprintf("the gateway sent %d bytes of DATA past the stream's receive window (%d bytes left)", n, left)},
			http2.ErrCodeFlowControl)
		return cc.consumed(nil, n)
	}
	cs.recvWindow -= n
	cc.mu.Unlock()
	data := f.Data()
	switch verdict := cs.gotData(data, f.StreamEnded()); verdict {
	case dataTaken:
		if pad := n - int32(len(data)); pad > 0 {
			return cc.consumed(cs, pad)
		}
		return nil
	case dataTooLarge:
		cs.abort(fmt.Errorf("h2c stream %d: response body longer than %d bytes: %w", id, cc.t.maxBody,
			&http.MaxBytesError{Limit: cc.t.maxBody}), http2.ErrCodeCancel)
	case dataEarly:
		cs.abort(&ProtocolError{Stream: id, Code: http2.ErrCodeProtocol, Reason: "DATA before the response headers"},
			http2.ErrCodeProtocol)
	}
	// Nobody will read it: give its share of the window back now.
	return cc.consumed(nil, n)
}

// onWindowUpdate grows a send window; past 2^31-1 it is a flow-control
// error of the window's scope (RFC 9113 §6.9.1). An increment of 0 never
// gets here: the framer reports it as a PROTOCOL_ERROR of the same scope.
func (cc *conn) onWindowUpdate(f *http2.WindowUpdateFrame) error {
	inc := int64(f.Increment)
	cc.mu.Lock()
	if f.StreamID == 0 {
		if int64(cc.sendWindow)+inc > maxWindow {
			w := cc.sendWindow
			cc.mu.Unlock()
			return connError(http2.ErrCodeFlowControl,
				"WINDOW_UPDATE of %d takes the connection's send window of %d past 2^31-1", inc, w)
		}
		cc.sendWindow += int32(inc)
		cc.windowGrewLocked()
		cc.mu.Unlock()
		return nil
	}
	cs := cc.streams[f.StreamID]
	if cs == nil {
		idle := f.StreamID%2 == 0 || f.StreamID >= cc.nextID
		cc.mu.Unlock()
		if idle {
			return connError(http2.ErrCodeProtocol, "WINDOW_UPDATE on stream %d, which the client never opened", f.StreamID)
		}
		return nil
	}
	if w := cs.sendWindow; int64(w)+inc > maxWindow {
		cc.mu.Unlock()
		cs.abort(&ProtocolError{Stream: f.StreamID, Code: http2.ErrCodeFlowControl,
			Reason: fmt.Sprintf("WINDOW_UPDATE of %d takes the stream's send window of %d past 2^31-1", inc, w)},
			http2.ErrCodeFlowControl)
		return nil
	}
	cs.sendWindow += int32(inc)
	cc.windowGrewLocked()
	cc.mu.Unlock()
	return nil
}

func (cc *conn) applySettings(f *http2.SettingsFrame) error {
	return f.ForeachSetting(func(s http2.Setting) error {
		if err := s.Valid(); err != nil {
			var ce http2.ConnectionError
			if errors.As(err, &ce) {
				return connError(http2.ErrCode(ce), "invalid setting %v", s)
			}
			return err
		}
		switch s.ID {
		case http2.SettingEnablePush:
			if s.Val != 0 {
				return connError(http2.ErrCodeProtocol, "the server set SETTINGS_ENABLE_PUSH to %d", s.Val)
			}
		case http2.SettingMaxConcurrentStreams:
			cc.mu.Lock()
			cc.maxStreams = int(min(s.Val, maxStreams))
			cc.mu.Unlock()
		case http2.SettingInitialWindowSize:
			cc.mu.Lock()
			defer cc.mu.Unlock()
			delta := int64(s.Val) - int64(cc.peerWindow)
			for id, cs := range cc.streams {
				if int64(cs.sendWindow)+delta > maxWindow {
					return connError(http2.ErrCodeFlowControl,
						"SETTINGS_INITIAL_WINDOW_SIZE %d takes stream %d's send window past 2^31-1", s.Val, id)
				}
			}
			cc.peerWindow = int32(s.Val)
			for _, cs := range cc.streams {
				cs.sendWindow += int32(delta)
			}
			cc.windowGrewLocked()
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
func (cc *conn) consumed(cs *stream, n int32) error {
	if n <= 0 {
		return nil
	}
	streamInc := int32(0)
	if cs != nil {
		streamInc = cs.consumed(n)
	}
	cc.mu.Lock()
	cc.recvUnacked += n
	connInc := int32(0)
	if cc.recvUnacked >= max(cc.t.connWindow, initialWindow)/2 {
		connInc, cc.recvUnacked = cc.recvUnacked, 0
		cc.recvWindow += connInc
	}
	if streamInc > 0 {
		cs.recvWindow += streamInc
	}
	cc.mu.Unlock()
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
func (cc *conn) health() {
	defer cc.t.running.Done()
	tr := cc.t
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
				cc.close(fmt.Errorf("%w within %s", ErrPingLost, tr.pingTimeout))
			case ping:
				_ = cc.write(func() error { return cc.fr.WritePing(false, [8]byte{'s', 'l', 'u', 'i', 'c', 'e'}) })
			}
		}
	}
}
