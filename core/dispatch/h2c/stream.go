package h2c

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"

	"golang.org/x/net/http2"
)

// errCancelled ends a stream the client reset (its call's context ended, or
// its body was closed before the end).
var errCancelled = errors.New("h2c: stream cancelled")

// stream is one call.
type stream struct {
	cc         *conn
	id         uint32
	sendWindow int32 // guarded by cc.mu
	recvWindow int32 // guarded by cc.mu: what the server may still send

	resp   chan struct{} // closed when the response headers (or an error) arrived
	notify chan struct{} // one token: data or the end arrived

	mu            sync.Mutex // guards the fields below; resp's closing publishes status, header, contentLength
	status        int
	header        http.Header
	contentLength int64
	gotResp       bool
	buf           []byte // buf[off:] is received and not yet read
	off           int
	received      int64 // body bytes received
	eof           bool  // END_STREAM received
	err           error
	unacked       int32 // read and not yet given back to the stream's window
	ended         bool  // slot given back
}

// gotHeaders takes a response header block (informational ones are skipped;
// a second block is the trailers, which end the stream). It returns why the
// block is malformed, or "".
func (cs *stream) gotHeaders(f *http2.MetaHeadersFrame) string {
	cs.mu.Lock()
	if cs.gotResp {
		cs.mu.Unlock()
		switch {
		case cs.failed():
			return ""
		case len(f.PseudoFields()) > 0:
			return "pseudo-headers in the trailers"
		case !f.StreamEnded():
			return "trailers that do not end the stream"
		}
		cs.gotData(nil, true)
		return ""
	}
	status, err := strconv.Atoi(f.PseudoValue("status"))
	if err != nil || status < 100 || status > 999 {
		cs.mu.Unlock()
		return fmt.Sprintf("malformed response status %q", f.PseudoValue("status"))
	}
	if status < 200 && !f.StreamEnded() {
		cs.mu.Unlock()
		return ""
	}
	fields := f.RegularFields()
	h := make(http.Header, len(fields))
	vals := make([]string, len(fields)) // one backing array for the single values
	cs.contentLength = -1
	for i, hf := range fields {
		k := cs.cc.t.canonicalName(hf.Name)
		if old, ok := h[k]; ok {
			h[k] = append(old, hf.Value)
		} else {
			vals[i] = hf.Value
			h[k] = vals[i : i+1 : i+1]
		}
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
	return ""
}

func (cs *stream) failed() bool {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.err != nil
}

// What gotData did with a DATA frame's data.
const (
	dataTaken    = iota // buffered for the reader
	dataDropped         // the stream has failed: nobody will read it
	dataEarly           // before the response headers: malformed
	dataTooLarge        // past the body cap
)

// gotData buffers data for the reader, up to the body cap.
func (cs *stream) gotData(data []byte, end bool) int {
	cs.mu.Lock()
	switch {
	case cs.err != nil:
		cs.mu.Unlock()
		return dataDropped
	case !cs.gotResp:
		cs.mu.Unlock()
		return dataEarly
	case cs.cc.t.maxBody > 0 && cs.received+int64(len(data)) > cs.cc.t.maxBody:
		cs.mu.Unlock()
		return dataTooLarge
	}
	cs.received += int64(len(data))
	cs.appendLocked(data)
	cs.eof = cs.eof || end
	cs.mu.Unlock()
	cs.wake()
	if end {
		cs.end()
	}
	return dataTaken
}

// appendLocked adds data to the buffer, moving the unread bytes to its
// front or growing it when it is full. It never grows past what the server
// may have sent and the reader not read: the body cap and the stream's
// receive window bound that. Caller holds mu.
func (cs *stream) appendLocked(data []byte) {
	if len(cs.buf)+len(data) > cap(cs.buf) {
		if cs.off > 0 {
			n := copy(cs.buf, cs.buf[cs.off:])
			cs.buf, cs.off = cs.buf[:n], 0
		}
		if need := len(cs.buf) + len(data); need > cap(cs.buf) {
			t := cs.cc.t
			bound := int64(t.streamWindow)
			if t.maxBody > 0 {
				bound = min(bound, t.maxBody)
			}
			size := int64(max(need, 2*cap(cs.buf)))
			if cap(cs.buf) == 0 && cs.contentLength > int64(need) {
				size = cs.contentLength // one buffer for a body of known length
			}
			size = max(min(size, bound), int64(need))
			b := make([]byte, len(cs.buf), size)
			copy(b, cs.buf)
			cs.buf = b
			t.notePeak(int(size))
		}
	}
	cs.buf = append(cs.buf, data...)
}

// fail ends the stream with err, unless it has ended already; connGone
// says its connection has failed (and forgotten it). Nothing is sent.
func (cs *stream) fail(err error, connGone bool) {
	cs.mu.Lock()
	if cs.err != nil || cs.eof {
		cs.mu.Unlock()
		return
	}
	unread := cs.failLocked(err)
	cs.mu.Unlock()
	cs.wake()
	if connGone {
		cs.release()
		return
	}
	_ = cs.cc.consumed(nil, unread)
	cs.end()
}

// wake tells a reader waiting in body.Read to look again.
func (cs *stream) wake() {
	select {
	case cs.notify <- struct{}{}:
	default:
	}
}

// abort ends the stream with err (unless it has failed already): RST_STREAM
// with code to the server (unless the stream has ended on both sides), what
// it buffered given back to the connection's window, and the slot back.
func (cs *stream) abort(err error, code http2.ErrCode) {
	cs.mu.Lock()
	done := cs.eof || cs.ended
	unread := cs.failLocked(err)
	cs.mu.Unlock()
	cs.wake()
	cc := cs.cc
	if !done {
		_ = cc.write(func() error { return cc.fr.WriteRSTStream(cs.id, code) })
	}
	_ = cc.consumed(nil, unread)
	cs.end()
}

// failLocked records err as the stream's error (unless it has one), ends
// the wait for the response headers and drops the buffer; it returns the
// bytes dropped. Caller holds mu.
func (cs *stream) failLocked(err error) int32 {
	if cs.err == nil {
		cs.err = err
	}
	if !cs.gotResp {
		cs.gotResp = true
		close(cs.resp)
	}
	return cs.dropBuffer()
}

// dropBuffer discards what was received and not read, and returns its
// size. Caller holds mu.
func (cs *stream) dropBuffer() int32 {
	n := int32(len(cs.buf) - cs.off)
	cs.buf, cs.off = nil, 0
	return n
}

// end removes the stream from its connection and gives its slot back, once.
func (cs *stream) end() {
	cc := cs.cc
	cc.mu.Lock()
	if cc.streams[cs.id] == cs {
		delete(cc.streams, cs.id)
	}
	cc.mu.Unlock()
	cs.release()
}

func (cs *stream) release() {
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
func (cs *stream) consumed(n int32) int32 {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.eof || cs.err != nil {
		return 0
	}
	cs.unacked += n
	if cs.unacked < cs.cc.t.streamWindow/2 {
		return 0
	}
	inc := cs.unacked
	cs.unacked = 0
	return inc
}

// body is a response body.
type body struct {
	cs     *stream
	ctx    context.Context
	closed bool
}

// Read reads what the server sent; past the end of the stream it returns
// io.EOF, and the stream's error once it has failed.
func (b *body) Read(p []byte) (int, error) {
	cs := b.cs
	for {
		cs.mu.Lock()
		if cs.off < len(cs.buf) {
			n := copy(p, cs.buf[cs.off:])
			cs.off += n
			if cs.off == len(cs.buf) {
				cs.buf, cs.off = cs.buf[:0], 0 // the buffer is kept for what comes next
			}
			cs.mu.Unlock()
			// A failed WINDOW_UPDATE closes the connection, which fails the
			// stream with the connection's own error (a GOAWAY's, say): the
			// next Read reports that one, not the closed socket's.
			_ = cs.cc.consumed(cs, int32(n))
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
			cs.abort(errCancelled, http2.ErrCodeCancel)
			return 0, b.ctx.Err()
		}
	}
}

// Close resets the stream if the server has not finished it, frees what it
// buffered and gives its slot back: once Close returns, the call holds no
// stream, even when the read loop is still ending it.
func (b *body) Close() error {
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
		cs.abort(errCancelled, http2.ErrCodeCancel)
		return nil
	}
	if unread > 0 {
		_ = cs.cc.consumed(nil, unread)
	}
	cs.end()
	return nil
}
