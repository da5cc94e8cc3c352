package dispatch

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
)

// rawConn is the server side of one h2c connection in the protocol tests
// below: they script what the gateway does frame by frame.
type rawConn struct {
	t    *testing.T
	nc   net.Conn
	fr   *http2.Framer
	hbuf bytes.Buffer
	henc *hpack.Encoder
}

// scriptedServer accepts h2c connections on a loopback port; for the n-th one
// (from 0) it reads the client preface, sends SETTINGS and runs serve.
// The connection is closed when serve returns.
func scriptedServer(t *testing.T, serve func(c *rawConn, n int)) string {
	t.Helper()
	return "http://" + serveLoopback(t, func(nc net.Conn, n int) {
		defer nc.Close()
		preface := make([]byte, len(http2.ClientPreface))
		if _, err := io.ReadFull(nc, preface); err != nil || string(preface) != http2.ClientPreface {
			t.Errorf("preface %q: %v", preface, err)
			return
		}
		c := &rawConn{t: t, nc: nc, fr: http2.NewFramer(nc, nc)}
		c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
		c.henc = hpack.NewEncoder(&c.hbuf)
		if err := c.fr.WriteSettings(); err != nil {
			return
		}
		serve(c, n)
	})
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

// respond answers stream id with status and body.
func (c *rawConn) respond(id uint32, status int, body string) {
	c.hbuf.Reset()
	_ = c.henc.WriteField(hpack.HeaderField{Name: ":status", Value: strconv.Itoa(status)})
	_ = c.henc.WriteField(hpack.HeaderField{Name: "content-length", Value: strconv.Itoa(len(body))})
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.hbuf.Bytes(), EndHeaders: true}); err != nil {
		c.t.Errorf("write headers: %v", err)
	}
	if err := c.fr.WriteData(id, true, []byte(body)); err != nil {
		c.t.Errorf("write data: %v", err)
	}
}

// A stream the gateway refuses (REFUSED_STREAM: not processed) is sent
// again, and the call succeeds.
func TestH2CRefusedStreamIsResent(t *testing.T) {
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
	c := newClient(t, Config{Protocol: ProtocolH2C})
	out := c.Do(t.Context(), Target{BaseURL: url}, newRequest(time.Minute))
	if out.Class != Success || string(out.Body) != `{"ok":true}` {
		t.Fatalf("%v %q %v", out.Class, out.Body, out.Err)
	}
	if n := requests.Load(); n != 2 {
		t.Errorf("gateway saw %d requests, want 2", n)
	}
}

// A GOAWAY ends a connection for new calls: streams above its last stream
// ID were not processed and are sent again on a new connection; streams at
// or below it are answered on the old one.
func TestH2CGoAway(t *testing.T) {
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
	c := newClient(t, Config{Protocol: ProtocolH2C})
	target := Target{BaseURL: url}
	outs := make(chan Outcome, 2)
	go func() { outs <- c.Do(t.Context(), target, newRequest(time.Minute)) }()
	time.Sleep(50 * time.Millisecond) // the first call gets stream 1
	go func() { outs <- c.Do(t.Context(), target, newRequest(time.Minute)) }()
	bodies := map[string]bool{}
	for range 2 {
		out := <-outs
		if out.Class != Success {
			t.Fatalf("%v %v", out.Class, out.Err)
		}
		bodies[string(out.Body)] = true
	}
	if !bodies["first"] || !bodies["again"] || requests.Load() != 3 {
		t.Errorf("bodies %v, %d requests; want first and again, 3", bodies, requests.Load())
	}
}

// A connection lost while a call waits for its answer fails that call as
// Retryable (it may have been processed: it is not sent again by the
// client), and the next call dials a new connection.
func TestH2CConnectionLost(t *testing.T) {
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
	c := newClient(t, Config{Protocol: ProtocolH2C})
	target := Target{BaseURL: url}
	out := c.Do(t.Context(), target, newRequest(time.Minute))
	if out.Class != Retryable || out.Err == nil || requests.Load() != 1 {
		t.Fatalf("lost connection: %v %v after %d requests; want Retryable after 1", out.Class, out.Err, requests.Load())
	}
	if out := c.Do(t.Context(), target, newRequest(time.Minute)); out.Class != Success {
		t.Fatalf("next call: %v %v", out.Class, out.Err)
	}
}

// A gateway that goes silent (no answer, no ping ack) is found by a ping:
// the call fails long before its deadline.
func TestH2CPingTimeout(t *testing.T) {
	url := scriptedServer(t, func(c *rawConn, _ int) {
		c.readRequest()
		c.drain() // answer nothing, acknowledge no ping
	})
	c := newClient(t, Config{Protocol: ProtocolH2C})
	c.h2c.pingAfter, c.h2c.pingTimeout, c.h2c.tick = 100*time.Millisecond, 200*time.Millisecond, 20*time.Millisecond
	start := time.Now()
	out := c.Do(t.Context(), Target{BaseURL: url}, newRequest(time.Minute))
	if out.Class != Retryable || !errors.Is(out.Err, errH2CPingLost) {
		t.Fatalf("%v %v, want Retryable, ping lost", out.Class, out.Err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("took %v", d)
	}
}

// The client answers the gateway's pings.
func TestH2CAnswersPings(t *testing.T) {
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
	c := newClient(t, Config{Protocol: ProtocolH2C})
	if out := c.Do(t.Context(), Target{BaseURL: url}, newRequest(time.Minute)); out.Class != Success {
		t.Fatalf("%v %v", out.Class, out.Err)
	}
	select {
	case d := <-acked:
		if d != [8]byte{1, 2, 3, 4, 5, 6, 7, 8} {
			t.Errorf("ping ack data %v", d)
		}
	default:
		t.Error("no ping ack")
	}
}
