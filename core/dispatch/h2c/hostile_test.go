package h2c

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// reply is what the client sent back to a hostile gateway: an RST_STREAM
// on the request's stream or a GOAWAY, with its code.
type reply struct {
	frame string // "RST_STREAM", "GOAWAY" or "" (none before the connection ended)
	code  http2.ErrCode
}

// awaitReply reads the client's frames until an RST_STREAM on stream id or
// a GOAWAY arrives, or the connection ends.
func (c *rawConn) awaitReply(id uint32) reply {
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			return reply{}
		}
		switch f := f.(type) {
		case *http2.RSTStreamFrame:
			if f.StreamID == id {
				return reply{"RST_STREAM", f.ErrCode}
			}
		case *http2.GoAwayFrame:
			return reply{"GOAWAY", f.ErrCode}
		}
	}
}

const maxIncrement = 1<<31 - 1

// A gateway that breaks the protocol gets the RST_STREAM or GOAWAY RFC 9113
// asks for, and the call fails with a ProtocolError saying what happened
// (or, past the body cap, with an error wrapping *http.MaxBytesError). After
// a stream error the connection carries the next call.
func TestHostileGateway(t *testing.T) {
	data := func(n int) []byte { return make([]byte, n) }
	ok := []string{":status", "200"}
	tests := []struct {
		name   string
		cfg    Config
		tune   func(tr *Transport)
		act    func(c *rawConn, id uint32)
		want   reply
		reason string // in the error
	}{
		{
			name: "DATA past the stream's receive window",
			tune: func(tr *Transport) { tr.streamWindow = 16 << 10 },
			act: func(c *rawConn, id uint32) {
				c.writeHeaders(id, false, ok...)
				_ = c.fr.WriteData(id, false, data(16<<10))
				_ = c.fr.WriteData(id, false, data(1))
			},
			want:   reply{"RST_STREAM", http2.ErrCodeFlowControl},
			reason: "past the stream's receive window",
		},
		{
			name: "DATA past the connection's receive window",
			tune: func(tr *Transport) { tr.connWindow, tr.streamWindow = initialWindow, 1<<20 },
			act: func(c *rawConn, id uint32) {
				c.writeHeaders(id, false, ok...)
				for range 4 { // 65,536 bytes: one more than the window
					_ = c.fr.WriteData(id, false, data(16<<10))
				}
			},
			want:   reply{"GOAWAY", http2.ErrCodeFlowControl},
			reason: "past the connection's receive window",
		},
		{
			name: "padding counts against the window",
			tune: func(tr *Transport) { tr.streamWindow = 16 << 10 },
			act: func(c *rawConn, id uint32) {
				c.writeHeaders(id, false, ok...)
				_ = c.fr.WriteDataPadded(id, false, data(16<<10-256), make([]byte, 255))
				_ = c.fr.WriteData(id, false, data(1))
			},
			want:   reply{"RST_STREAM", http2.ErrCodeFlowControl},
			reason: "past the stream's receive window",
		},
		{
			name:   "WINDOW_UPDATE past 2^31-1 on the stream",
			act:    func(c *rawConn, id uint32) { _ = c.fr.WriteWindowUpdate(id, maxIncrement) },
			want:   reply{"RST_STREAM", http2.ErrCodeFlowControl},
			reason: "past 2^31-1",
		},
		{
			name:   "WINDOW_UPDATE past 2^31-1 on the connection",
			act:    func(c *rawConn, _ uint32) { _ = c.fr.WriteWindowUpdate(0, maxIncrement) },
			want:   reply{"GOAWAY", http2.ErrCodeFlowControl},
			reason: "past 2^31-1",
		},
		{
			name: "SETTINGS_INITIAL_WINDOW_SIZE takes a stream past 2^31-1",
			act: func(c *rawConn, id uint32) {
				_ = c.fr.WriteWindowUpdate(id, maxIncrement-initialWindow) // exactly 2^31-1: allowed
				_ = c.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: initialWindow + 1})
			},
			want:   reply{"GOAWAY", http2.ErrCodeFlowControl},
			reason: "SETTINGS_INITIAL_WINDOW_SIZE",
		},
		{
			name:   "WINDOW_UPDATE of 0 on the stream",
			act:    func(c *rawConn, id uint32) { _ = c.fr.WriteWindowUpdate(id, 0) },
			want:   reply{"RST_STREAM", http2.ErrCodeProtocol},
			reason: "WINDOW_UPDATE of 0",
		},
		{
			name: "WINDOW_UPDATE of 0 on the connection",
			act:  func(c *rawConn, _ uint32) { _ = c.fr.WriteWindowUpdate(0, 0) },
			want: reply{"GOAWAY", http2.ErrCodeProtocol},
		},
		{
			name:   "headers without :status",
			act:    func(c *rawConn, id uint32) { c.writeHeaders(id, false, "content-type", "text/plain") },
			want:   reply{"RST_STREAM", http2.ErrCodeProtocol},
			reason: "status",
		},
		{
			name:   "DATA before the headers",
			act:    func(c *rawConn, id uint32) { _ = c.fr.WriteData(id, false, data(10)) },
			want:   reply{"RST_STREAM", http2.ErrCodeProtocol},
			reason: "DATA before the response headers",
		},
		{
			name: "trailers that do not end the stream",
			act: func(c *rawConn, id uint32) {
				c.writeHeaders(id, false, ok...)
				c.writeHeaders(id, false, "x-trailer", "1")
			},
			want:   reply{"RST_STREAM", http2.ErrCodeProtocol},
			reason: "trailers",
		},
		{
			name:   "HEADERS on a stream the client never opened",
			act:    func(c *rawConn, id uint32) { c.writeHeaders(id+2, false, ok...) },
			want:   reply{"GOAWAY", http2.ErrCodeProtocol},
			reason: "never opened",
		},
		{
			name:   "RST_STREAM on a server-initiated stream",
			act:    func(c *rawConn, _ uint32) { _ = c.fr.WriteRSTStream(2, http2.ErrCodeCancel) },
			want:   reply{"GOAWAY", http2.ErrCodeProtocol},
			reason: "never opened",
		},
		{
			name: "PUSH_PROMISE",
			act: func(c *rawConn, id uint32) {
				_ = c.fr.WritePushPromise(http2.PushPromiseParam{StreamID: id, PromiseID: 2, EndHeaders: true,
					BlockFragment: c.headers(":method", "GET", ":path", "/", ":scheme", "http", ":authority", "x")})
			},
			want:   reply{"GOAWAY", http2.ErrCodeProtocol},
			reason: "PUSH_PROMISE",
		},
		{
			name:   "SETTINGS_ENABLE_PUSH 1",
			act:    func(c *rawConn, _ uint32) { _ = c.fr.WriteSettings(http2.Setting{ID: http2.SettingEnablePush, Val: 1}) },
			want:   reply{"GOAWAY", http2.ErrCodeProtocol},
			reason: "SETTINGS_ENABLE_PUSH",
		},
		{
			name:   "a frame larger than 16 KiB",
			act:    func(c *rawConn, _ uint32) { _ = c.fr.WriteRawFrame(0x20, 0, 0, data(20<<10)) },
			want:   reply{"GOAWAY", http2.ErrCodeFrameSize},
			reason: "larger than 16384",
		},
		{
			name: "a body past the cap",
			cfg:  Config{MaxBodyBytes: 1000},
			act: func(c *rawConn, id uint32) {
				c.writeHeaders(id, false, ok...)
				_ = c.fr.WriteData(id, false, data(600))
				_ = c.fr.WriteData(id, false, data(600))
			},
			want: reply{"RST_STREAM", http2.ErrCodeCancel},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			replies := make(chan reply, 1)
			dials := 0
			url := scriptedServer(t, func(c *rawConn, n int) {
				dials++
				id, _ := c.readRequest()
				if n > 0 || id == 0 {
					return
				}
				tt.act(c, id)
				r := c.awaitReply(id)
				replies <- r
				if r.frame != "RST_STREAM" {
					c.drain()
					return
				}
				// A stream error: the connection carries the next call.
				if id, _ = c.readRequest(); id != 0 {
					c.respond(id, 200, "next")
				}
				c.drain()
			})
			tr := newTransport(t, tt.cfg)
			if tt.tune != nil {
				tt.tune(tr)
			}
			u := mustURL(t, url)
			resp, err := tr.Post(t.Context(), u, jsonHeaders, nil)
			var got reply
			select {
			case got = <-replies: // the body is read after the reply, so that no window is given back first
			case <-time.After(5 * time.Second):
				t.Fatal("the client sent neither RST_STREAM nor GOAWAY")
			}
			if err == nil {
				_, err = io.ReadAll(resp.Body)
				_ = resp.Body.Close()
			}
			if got != tt.want {
				t.Errorf("client sent %+v, want %+v", got, tt.want)
			}
			var pe *ProtocolError
			var mbe *http.MaxBytesError
			switch {
			case tt.want.code == http2.ErrCodeCancel:
				if !errors.As(err, &mbe) || mbe.Limit != tt.cfg.MaxBodyBytes {
					t.Fatalf("err %v, want an *http.MaxBytesError", err)
				}
				if p := tr.peakBuffer.Load(); p > tt.cfg.MaxBodyBytes {
					t.Errorf("a buffer of %d bytes for a cap of %d", p, tt.cfg.MaxBodyBytes)
				}
			case !errors.As(err, &pe):
				t.Fatalf("err %v, want a *ProtocolError", err)
			case pe.Code != tt.want.code || (pe.Stream != 0) != (tt.want.frame == "RST_STREAM"):
				t.Errorf("err %v: %+v, want code %v, stream error %v", err, pe, tt.want.code, tt.want.frame == "RST_STREAM")
			case !strings.Contains(err.Error(), tt.reason) || !strings.Contains(err.Error(), tt.want.code.String()):
				t.Errorf("err %q does not say %q and %v", err, tt.reason, tt.want.code)
			}
			if tt.want.frame == "RST_STREAM" {
				if got := mustCall(t, tr, u); string(got) != "next" {
					t.Errorf("next call on the connection: %q", got)
				}
				if dials != 1 {
					t.Errorf("%d connections, want 1", dials)
				}
			}
		})
	}
}

// The body cap holds at its edge: a body of exactly the cap arrives whole in
// one buffer of its size; with a known length the buffer is allocated once.
func TestBodyCapEdge(t *testing.T) {
	const limit = 50 << 10
	for _, withLength := range []bool{false, true} {
		url := scriptedServer(t, func(c *rawConn, _ int) {
			for {
				id, _ := c.readRequest()
				if id == 0 {
					return
				}
				kv := []string{":status", "200"}
				if withLength {
					kv = append(kv, "content-length", "51200")
				}
				c.writeHeaders(id, false, kv...)
				for sent := 0; sent < limit; sent += 10 << 10 {
					_ = c.fr.WriteData(id, sent+10<<10 == limit, make([]byte, 10<<10))
				}
			}
		})
		tr := newTransport(t, Config{MaxBodyBytes: limit})
		if got := mustCall(t, tr, mustURL(t, url)); len(got) != limit {
			t.Fatalf("%d bytes, want %d", len(got), limit)
		}
		if p := tr.peakBuffer.Load(); p > limit || (withLength && p != limit) {
			t.Errorf("content length known %v: largest buffer %d bytes, cap %d", withLength, p, limit)
		}
	}
}

// A gateway that stops reading fails the connection once nothing could be
// written for the stall duration, so a call writing a large body does not
// hang past it.
func TestWriteStall(t *testing.T) {
	url := "http://" + serveStalled(t)
	tr := newTransport(t, Config{})
	tr.writeStall = 200 * time.Millisecond
	start := time.Now()
	r := call(t.Context(), tr, mustURL(t, url), jsonHeaders, make([]byte, 64<<20))
	if !errors.Is(r.err, ErrWriteStalled) {
		t.Fatalf("%v, want ErrWriteStalled", r.err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %v", d)
	}
}

// serveStalled is a gateway that opens the largest windows it can and then
// reads nothing more, until the test ends.
func serveStalled(t *testing.T) string {
	stop := make(chan struct{})
	addr := strings.TrimPrefix(scriptedServer(t, func(c *rawConn, _ int) {
		_ = c.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: maxIncrement})
		_ = c.fr.WriteWindowUpdate(0, maxIncrement-initialWindow)
		<-stop
	}), "http://")
	t.Cleanup(func() { close(stop) }) // runs before the server's cleanup
	return addr
}
