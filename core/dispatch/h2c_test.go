package dispatch

import (
	"context"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/message"
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
	req := &message.Request{ID: "x", Deadline: time.Now().Add(time.Minute), Payload: []byte(`{}`)}
	// One call first: until the server's SETTINGS arrive, the client cannot
	// know how many streams a connection may carry and dials more.
	if o := c.Do(context.Background(), target, req); o.Class != Success {
		t.Fatalf("first call: %v %d %v", o.Class, o.StatusCode, o.Err)
	}
	doConcurrently(t, c, target, req, 20)
	if conns.Load() > 2 {
		t.Errorf("%d connections for 20 concurrent h2c calls", conns.Load())
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

// A cold burst against a server with fewer streams per connection than
// the client assumes before the server's SETTINGS arrive (100) gets
// REFUSED_STREAM for the excess; those calls are sent again (the request
// carries GetBody) and all succeed.
//
// net/http dials a connection for every call that finds the open ones
// full and keeps one of them; the count is logged, not asserted (300 calls
// at 20 streams per connection open several hundred here).
func TestH2CBurstSucceeds(t *testing.T) {
	const burst, streams = 300, 20
	url, conns := h2cServer(t, streams, func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(200 * time.Millisecond)
		_, _ = w.Write([]byte(`{}`))
	})
	c := newClient(t, Config{Protocol: ProtocolH2C})
	target := Target{BaseURL: url}
	req := &message.Request{ID: "x", Deadline: time.Now().Add(time.Minute), Payload: []byte(`{}`)}
	doConcurrently(t, c, target, req, burst)
	t.Logf("%d connections for a burst of %d calls at %d streams per connection", conns.Load(), burst, streams)
}

// doConcurrently makes n calls at once and fails the test unless all succeed.
func doConcurrently(t *testing.T, c *Client, target Target, req *message.Request, n int) {
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
