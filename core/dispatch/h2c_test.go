package dispatch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/wire"
)

// With Protocol h2c, an http:// gateway is spoken to over HTTP/2 with prior
// knowledge, and many calls share one connection.
func TestH2CSharesConnections(t *testing.T) {
	url, conns := h2cServer(t, 0, func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor != 2 {
			http.Error(w, "want HTTP/2", http.StatusHTTPVersionNotSupported)
			return
		}
		time.Sleep(20 * time.Millisecond)
		_, _ = w.Write([]byte(`{}`))
	})

	c := newClient(t, Config{Protocol: ProtocolH2C})
	target := Target{BaseURL: url}
	req := &wire.Request{ID: "x", Deadline: time.Now().Add(time.Minute), Payload: []byte(`{}`)}
	doConcurrently(t, c, target, req, 20)
	if conns.Load() != 1 {
		t.Errorf("%d connections for 20 concurrent h2c calls, want 1", conns.Load())
	}
	if _, err := New(Config{Protocol: "spdy"}); err == nil {
		t.Error("unknown protocol accepted")
	}
}

// h2cServer serves handler over h2c (HTTP/2 with prior knowledge only) on a
// loopback port with a limit of streams per connection (0: Go's default),
// and counts the connections it accepts.
func h2cServer(t testing.TB, streams int, handler http.HandlerFunc) (string, *atomic.Int64) {
	t.Helper()
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	conns := new(atomic.Int64)
	srv := &http.Server{
		Protocols: &p,
		HTTP2:     &http.HTTP2Config{MaxConcurrentStreams: streams},
		Handler:   handler,
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				conns.Add(1)
			}
		},
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String(), conns
}

// A burst of calls against a server allowing fewer streams per connection
// than the client assumes before SETTINGS arrive opens about as many
// connections as the burst needs (net/http's client opened 236 here) and
// every call succeeds.
func TestH2CBurstSucceeds(t *testing.T) {
	const burst, streams = 300, 20
	url, conns := h2cServer(t, streams, func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(200 * time.Millisecond)
		_, _ = w.Write([]byte(`{}`))
	})
	c := newClient(t, Config{Protocol: ProtocolH2C})
	target := Target{BaseURL: url}
	req := &wire.Request{ID: "x", Deadline: time.Now().Add(time.Minute), Payload: []byte(`{}`)}
	doConcurrently(t, c, target, req, burst)
	if n := conns.Load(); n < burst/streams || n > burst/streams+5 {
		t.Errorf("%d connections for a burst of %d calls at %d streams per connection", n, burst, streams)
	}
}

// With MaxConnsPerHost, calls beyond what the connections carry wait for a
// stream and all succeed.
func TestH2CMaxConnsPerHost(t *testing.T) {
	url, conns := h2cServer(t, 5, func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(50 * time.Millisecond)
		_, _ = w.Write([]byte(`{}`))
	})
	c := newClient(t, Config{Protocol: ProtocolH2C, MaxConnsPerHost: 2})
	req := &wire.Request{ID: "x", Deadline: time.Now().Add(time.Minute), Payload: []byte(`{}`)}
	doConcurrently(t, c, Target{BaseURL: url}, req, 40)
	if n := conns.Load(); n > 2 {
		t.Errorf("%d connections, cap 2", n)
	}
}

// A response larger than the client's receive windows arrives whole: the
// client gives the windows back as it reads.
func TestH2CLargeResponse(t *testing.T) {
	body := bytes.Repeat([]byte("0123456789abcdef"), (3*h2cStreamWindow)/16+7)
	url, _ := h2cServer(t, 0, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		_, _ = w.Write(body)
	})
	c := newClient(t, Config{Protocol: ProtocolH2C})
	for i := range 3 { // more than the connection's window in all
		out := c.Do(t.Context(), Target{BaseURL: url}, newRequest(time.Minute))
		if out.Class != Success || !bytes.Equal(out.Body, body) {
			t.Fatalf("call %d: %v, %d bytes (want %d): %v", i, out.Class, len(out.Body), len(body), out.Err)
		}
	}
}

// A cancelled call resets its stream (the gateway's handler sees its
// context end) and gives its stream back: on a server allowing 2 streams
// per connection, calls after many cancelled ones still share 1 connection.
func TestH2CCancelResetsStream(t *testing.T) {
	var seen atomic.Int32
	url, conns := h2cServer(t, 2, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Block") == "" {
			_, _ = w.Write([]byte(`{}`))
			return
		}
		select {
		case <-r.Context().Done():
			seen.Add(1)
		case <-time.After(10 * time.Second):
		}
	})
	c := newClient(t, Config{Protocol: ProtocolH2C})
	target := Target{BaseURL: url}
	for i := range 6 {
		req := newRequest(time.Minute)
		req.Headers = map[string]string{"X-Block": "1"}
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		out := c.Do(ctx, target, req)
		cancel()
		if out.Class != Retryable || !errors.Is(out.Err, context.DeadlineExceeded) {
			t.Fatalf("call %d: %v %v, want Retryable (caller deadline)", i, out.Class, out.Err)
		}
	}
	waitFor(t, "the handlers to see 6 resets", func() bool { return seen.Load() == 6 })
	doConcurrently(t, c, target, newRequest(time.Minute), 2)
	if n := conns.Load(); n != 1 {
		t.Errorf("%d connections, want 1", n)
	}
}

// Closing the client closes its idle connections.
func TestH2CCloseIdle(t *testing.T) {
	url, open := h2cServerOpenConns(t)
	c, err := New(Config{Protocol: ProtocolH2C})
	if err != nil {
		t.Fatal(err)
	}
	if out := c.Do(t.Context(), Target{BaseURL: url}, newRequest(time.Minute)); out.Class != Success {
		t.Fatalf("%v %v", out.Class, out.Err)
	}
	if open.Load() != 1 {
		t.Fatalf("%d connections open", open.Load())
	}
	c.Close()
	waitFor(t, "the connection to close", func() bool { return open.Load() == 0 })
}

// A connection without calls for the idle timeout is closed.
func TestH2CIdleTimeout(t *testing.T) {
	url, open := h2cServerOpenConns(t)
	c := newClient(t, Config{Protocol: ProtocolH2C})
	c.h2c.idleTimeout, c.h2c.tick = 150*time.Millisecond, 20*time.Millisecond
	if out := c.Do(t.Context(), Target{BaseURL: url}, newRequest(time.Minute)); out.Class != Success {
		t.Fatalf("%v %v", out.Class, out.Err)
	}
	if open.Load() != 1 {
		t.Fatalf("%d connections open after the call", open.Load())
	}
	waitFor(t, "the idle connection to close", func() bool { return open.Load() == 0 })
	if out := c.Do(t.Context(), Target{BaseURL: url}, newRequest(time.Minute)); out.Class != Success {
		t.Fatalf("call after the idle close: %v %v", out.Class, out.Err)
	}
}

// h2cServerOpenConns serves empty answers over h2c and counts the
// connections open at the moment.
func h2cServerOpenConns(t *testing.T) (string, *atomic.Int32) {
	t.Helper()
	open := new(atomic.Int32)
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	srv.Config.Protocols = &p
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			open.Add(1)
		case http.StateClosed, http.StateHijacked:
			open.Add(-1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.URL, open
}

// A gateway that speaks only HTTP/1.1 fails the call with an error that
// says so (and how to fix it), not with a framing error.
func TestH2CGatewayWithoutH2C(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(srv.Close)
	c := newClient(t, Config{Protocol: ProtocolH2C})
	out := c.Do(t.Context(), Target{BaseURL: srv.URL}, newRequest(time.Minute))
	if out.Class != Retryable || !errors.Is(out.Err, errH2CNotSpoken) || !strings.Contains(out.Err.Error(), "http1") {
		t.Fatalf("%v %v, want Retryable naming dispatch.protocol http1", out.Class, out.Err)
	}
}

// waitFor polls cond for up to 5 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); !cond(); {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// doConcurrently makes n calls at once and fails the test unless all succeed.
func doConcurrently(t *testing.T, c *Client, target Target, req *wire.Request, n int) {
	t.Helper()
	done := make(chan Outcome, n)
	for range n {
		go func() { done <- c.Do(context.Background(), target, req) }()
	}
	for range n {
		if o := <-done; o.Class != Success {
			t.Fatalf("outcome %v %d %v", o.Class, o.StatusCode, o.Err)
		}
	}
}

// A body larger than the gateway's receive windows goes out as they open;
// a header block larger than a frame goes out in CONTINUATION frames;
// informational answers are skipped and trailers end the body.
func TestH2CLargeRequestsAndAnswerShapes(t *testing.T) {
	body := bytes.Repeat([]byte("abcdefgh"), (5<<20)/8) // 5 MiB: several windows' worth
	big := strings.Repeat("v", 40<<10)                  // beyond one 16 KiB frame
	url, _ := h2cServer(t, 0, func(w http.ResponseWriter, r *http.Request) {
		got, err := io.ReadAll(r.Body)
		if err != nil || !bytes.Equal(got, body) || r.Header.Get("X-Big") != big {
			http.Error(w, fmt.Sprintf("got %d body bytes, X-Big of %d: %v", len(got), len(r.Header.Get("X-Big")), err), http.StatusBadRequest)
			return
		}
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Set("Trailer", "X-Checksum")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte(`{"ok":true}`))
		w.Header().Set("X-Checksum", "abc")
	})
	c := newClient(t, Config{Protocol: ProtocolH2C})
	req := newRequest(time.Minute)
	req.Payload = body
	req.Headers = map[string]string{"X-Big": big}
	out := c.Do(t.Context(), Target{BaseURL: url}, req)
	if out.Class != Success || string(out.Body) != `{"ok":true}` {
		t.Fatalf("%v %d %q %v", out.Class, out.StatusCode, out.Body, out.Err)
	}
}
