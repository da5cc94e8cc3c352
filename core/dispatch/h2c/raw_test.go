package h2c

import (
	"bytes"
	"errors"
	"io"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/sluice-io/sluice/core/dispatch/internal/loopback"
)

// rawConn is the server side of one h2c connection in the protocol tests:
// they script what the gateway does frame by frame. Its framer writes
// illegal frames too.
type rawConn struct {
	t    testing.TB
	nc   net.Conn
	fr   *http2.Framer
	hbuf bytes.Buffer
	henc *hpack.Encoder
}

// scriptedServer accepts h2c connections on a loopback port; for the n-th one
// (from 0) it reads the client preface, sends SETTINGS and runs serve.
// The connection is closed when serve returns.
func scriptedServer(t testing.TB, serve func(c *rawConn, n int)) string {
	t.Helper()
	return "http://" + loopback.Serve(t, func(nc net.Conn, n int) {
		defer nc.Close()
		c, err := acceptRaw(t, nc)
		if err != nil {
			t.Errorf("preface: %v", err)
			return
		}
		if err := c.fr.WriteSettings(); err != nil {
			return
		}
		serve(c, n)
	})
}

// acceptRaw reads the client preface from nc and returns its rawConn.
func acceptRaw(t testing.TB, nc net.Conn) (*rawConn, error) {
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(nc, preface); err != nil {
		return nil, err
	}
	if string(preface) != http2.ClientPreface {
		return nil, errors.New("not the HTTP/2 client preface")
	}
	c := &rawConn{t: t, nc: nc, fr: http2.NewFramer(nc, nc)}
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.fr.AllowIllegalWrites = true
	c.henc = hpack.NewEncoder(&c.hbuf)
	return c, nil
}

// drain reads and ignores frames (acknowledging nothing) until the client
// closes the connection.
func (c *rawConn) drain() {
	for {
		if _, err := c.fr.ReadFrame(); err != nil {
			return
		}
	}
}

// readRequest reads frames until a request has arrived whole and returns
// its stream ID and body; it answers SETTINGS and skips other frames. It
// returns 0 when the connection ends.
func (c *rawConn) readRequest() (uint32, []byte) {
	var body []byte
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			return 0, nil
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				_ = c.fr.WriteSettingsAck()
			}
		case *http2.MetaHeadersFrame:
			if f.StreamEnded() {
				return f.StreamID, nil
			}
		case *http2.DataFrame:
			body = append(body, f.Data()...)
			if f.StreamEnded() {
				return f.StreamID, body
			}
		}
	}
}

// headers encodes a header block: pairs of name and value.
func (c *rawConn) headers(kv ...string) []byte {
	c.hbuf.Reset()
	for i := 0; i+1 < len(kv); i += 2 {
		_ = c.henc.WriteField(hpack.HeaderField{Name: kv[i], Value: kv[i+1]})
	}
	return c.hbuf.Bytes()
}

// writeHeaders sends a complete header block on stream id.
func (c *rawConn) writeHeaders(id uint32, end bool, kv ...string) {
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.headers(kv...),
		EndHeaders: true, EndStream: end}); err != nil {
		c.t.Errorf("write headers: %v", err)
	}
}

// respond answers stream id with status and body.
func (c *rawConn) respond(id uint32, status int, body string) {
	c.writeHeaders(id, false, ":status", strconv.Itoa(status), "content-length", strconv.Itoa(len(body)))
	if err := c.fr.WriteData(id, true, []byte(body)); err != nil {
		c.t.Errorf("write data: %v", err)
	}
}

// A stream the gateway refuses (REFUSED_STREAM: not processed) is sent
// again, and the call succeeds.
func TestRefusedStreamIsResent(t *testing.T) {
	var requests atomic.Int32
	url := scriptedServer(t, func(c *rawConn, _ int) {
		for {
			id, _ := c.readRequest()
			if id == 0 {
				return
			}
			if requests.Add(1) == 1 {
				_ = c.fr.WriteRSTStream(id, http2.ErrCodeRefusedStream)
				continue
			}
			c.respond(id, 200, `{"ok":true}`)
		}
	})
	tr := newTransport(t, Config{})
	if got := mustCall(t, tr, mustURL(t, url)); string(got) != `{"ok":true}` {
		t.Fatalf("body %q", got)
	}
	if n := requests.Load(); n != 2 {
		t.Errorf("gateway saw %d requests, want 2", n)
	}
}

// A GOAWAY ends a connection for new calls: streams above its last stream
// ID were not processed and are sent again on a new connection; streams at
// or below it are answered on the old one.
func TestGoAway(t *testing.T) {
	var requests atomic.Int32
	url := scriptedServer(t, func(c *rawConn, n int) {
		if n == 0 {
			// Two calls arrive; the first is answered, the second refused
			// by a GOAWAY naming the first as the last one processed.
			a, _ := c.readRequest()
			b, _ := c.readRequest()
			requests.Add(2)
			first := min(a, b)
			_ = c.fr.WriteGoAway(first, http2.ErrCodeNo, nil)
			time.Sleep(50 * time.Millisecond)
			c.respond(first, 200, "first")
			c.drain() // until the client closes it: it has nothing left on it
		}
		for {
			id, _ := c.readRequest()
			if id == 0 {
				return
			}
			requests.Add(1)
			c.respond(id, 200, "again")
		}
	})
	tr := newTransport(t, Config{})
	u := mustURL(t, url)
	outs := make(chan result, 2)
	go func() { outs <- call(t.Context(), tr, u, jsonHeaders, nil) }()
	time.Sleep(50 * time.Millisecond) // the first call gets stream 1
	go func() { outs <- call(t.Context(), tr, u, jsonHeaders, nil) }()
	bodies := map[string]bool{}
	for range 2 {
		r := <-outs
		if r.err != nil {
			t.Fatal(r.err)
		}
		bodies[string(r.body)] = true
	}
	if !bodies["first"] || !bodies["again"] || requests.Load() != 3 {
		t.Errorf("bodies %v, %d requests; want first and again, 3", bodies, requests.Load())
	}
}

// A connection lost after a GOAWAY while a call waits for its answer
// fails the call, and the connection ends: failing its last stream does
// not close it a second time (which once deadlocked the read loop, and
// CloseIdleConnections with it).
func TestGoAwayThenConnectionLost(t *testing.T) {
	url := scriptedServer(t, func(c *rawConn, _ int) {
		id, _ := c.readRequest()
		_ = c.fr.WriteGoAway(id, http2.ErrCodeNo, nil) // the call's stream is processed...
	}) // ...and the connection drops without its answer
	tr := New(Config{})
	if r := call(t.Context(), tr, mustURL(t, url), jsonHeaders, nil); r.err == nil {
		t.Fatalf("status %d without an answer", r.status)
	}
	if !connsEnd(tr, 5*time.Second) {
		t.Fatal("the connection did not end")
	}
}

// A connection lost while a call waits for its answer fails that call (it
// may have been processed: it is not sent again), and the next call dials a
// new connection.
func TestConnectionLost(t *testing.T) {
	var requests atomic.Int32
	url := scriptedServer(t, func(c *rawConn, n int) {
		for {
			id, _ := c.readRequest()
			if id == 0 {
				return
			}
			requests.Add(1)
			if n == 0 {
				return // drop the connection without an answer
			}
			c.respond(id, 200, "ok")
		}
	})
	tr := newTransport(t, Config{})
	u := mustURL(t, url)
	if r := call(t.Context(), tr, u, jsonHeaders, nil); r.err == nil || requests.Load() != 1 {
		t.Fatalf("lost connection: %d %v after %d requests; want an error after 1", r.status, r.err, requests.Load())
	}
	mustCall(t, tr, u)
}

// A gateway that goes silent (no answer, no ping ack) is found by a ping:
// the call fails long before its deadline.
func TestPingTimeout(t *testing.T) {
	url := scriptedServer(t, func(c *rawConn, _ int) {
		c.readRequest()
		c.drain() // answer nothing, acknowledge no ping
	})
	tr := newTransport(t, Config{})
	tr.pingAfter, tr.pingTimeout, tr.tick = 100*time.Millisecond, 200*time.Millisecond, 20*time.Millisecond
	start := time.Now()
	if r := call(t.Context(), tr, mustURL(t, url), jsonHeaders, nil); !errors.Is(r.err, ErrPingLost) {
		t.Fatalf("%v, want ping lost", r.err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("took %v", d)
	}
}

// The client answers the gateway's pings.
func TestAnswersPings(t *testing.T) {
	acked := make(chan [8]byte, 1)
	url := scriptedServer(t, func(c *rawConn, _ int) {
		id, _ := c.readRequest()
		_ = c.fr.WritePing(false, [8]byte{1, 2, 3, 4, 5, 6, 7, 8})
		for {
			f, err := c.fr.ReadFrame()
			if err != nil {
				return
			}
			if p, ok := f.(*http2.PingFrame); ok && p.IsAck() {
				acked <- p.Data
				break
			}
		}
		c.respond(id, 200, "ok")
	})
	tr := newTransport(t, Config{})
	mustCall(t, tr, mustURL(t, url))
	select {
	case d := <-acked:
		if d != [8]byte{1, 2, 3, 4, 5, 6, 7, 8} {
			t.Errorf("ping ack data %v", d)
		}
	default:
		t.Error("no ping ack")
	}
}

// http.Header keys come back canonical, repeated names keep every value.
func TestResponseHeaders(t *testing.T) {
	url := scriptedServer(t, func(c *rawConn, _ int) {
		id, _ := c.readRequest()
		c.writeHeaders(id, true, ":status", "429", "retry-after", "7", "x-llm-d-request-dropped-reason", "full",
			"x-multi", "a", "x-multi", "b")
		c.drain()
	})
	tr := newTransport(t, Config{})
	resp, err := tr.Post(t.Context(), mustURL(t, url), jsonHeaders, nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	h := resp.Header
	if resp.StatusCode != 429 || h["Retry-After"][0] != "7" || h["X-Llm-D-Request-Dropped-Reason"][0] != "full" ||
		len(h["X-Multi"]) != 2 || h["X-Multi"][1] != "b" || resp.ContentLength != 0 {
		t.Fatalf("status %d, content length %d, header %v", resp.StatusCode, resp.ContentLength, h)
	}
}
