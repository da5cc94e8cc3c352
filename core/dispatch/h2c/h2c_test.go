package h2c

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/dispatch/internal/loopback"
)

// newTransport returns a Transport whose connections are closed when the
// test ends.
func newTransport(t testing.TB, cfg Config) *Transport {
	t.Helper()
	tr := New(cfg)
	t.Cleanup(tr.CloseIdleConnections)
	return tr
}

func mustURL(t testing.TB, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// result is what one call got: the status and the whole body, or an error.
type result struct {
	status int
	body   []byte
	err    error
}

// jsonHeaders are the headers the tests send, canonical as dispatch's are.
var jsonHeaders = http.Header{"Content-Type": {"application/json"}}

// call makes one call as dispatch does: Post, then the whole body, closed.
func call(ctx context.Context, tr *Transport, u *url.URL, h http.Header, payload []byte) result {
	resp, err := tr.Post(ctx, u, h, payload)
	if err != nil {
		return result{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return result{status: resp.StatusCode, body: b, err: err}
}

// mustCall makes one call and fails the test unless the gateway answered
// 200 and the body was read.
func mustCall(t testing.TB, tr *Transport, u *url.URL) []byte {
	t.Helper()
	r := call(t.Context(), tr, u, jsonHeaders, []byte(`{}`))
	if r.err != nil || r.status != http.StatusOK {
		t.Fatalf("status %d: %v", r.status, r.err)
	}
	return r.body
}

// callConcurrently makes n calls at once and fails the test unless all
// succeed.
func callConcurrently(t *testing.T, tr *Transport, u *url.URL, n int) {
	t.Helper()
	done := make(chan result, n)
	for range n {
		go func() { done <- call(context.Background(), tr, u, jsonHeaders, []byte(`{}`)) }()
	}
	for range n {
		if r := <-done; r.err != nil || r.status != http.StatusOK {
			t.Fatalf("status %d: %v", r.status, r.err)
		}
	}
}

// connsEnd closes tr's idle connections and reports whether every
// connection goroutine has ended within d.
func connsEnd(tr *Transport, d time.Duration) bool {
	ended := make(chan struct{})
	go func() {
		tr.CloseIdleConnections()
		tr.running.Wait()
		close(ended)
	}()
	select {
	case <-ended:
		return true
	case <-time.After(d):
		return false
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

// Many calls share one connection, over HTTP/2, with their headers in
// lower case as HTTP/2 wants them (a server would refuse upper case).
func TestSharesConnections(t *testing.T) {
	url, conns := loopback.H2C(t, 0, func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor != 2 || r.Header.Get("Content-Type") != "application/json" {
			http.Error(w, "want HTTP/2 and the content type", http.StatusBadRequest)
			return
		}
		time.Sleep(20 * time.Millisecond)
		_, _ = w.Write([]byte(`{}`))
	})
	tr := newTransport(t, Config{})
	callConcurrently(t, tr, mustURL(t, url), 20)
	if conns.Load() != 1 {
		t.Errorf("%d connections for 20 concurrent calls, want 1", conns.Load())
	}
}

// A burst of calls against a server allowing fewer streams per connection
// than the client assumes before SETTINGS arrive opens about as many
// connections as the burst needs, and every call succeeds.
func TestBurstSucceeds(t *testing.T) {
	const burst, streams = 300, 20
	url, conns := loopback.H2C(t, streams, func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(200 * time.Millisecond)
		_, _ = w.Write([]byte(`{}`))
	})
	tr := newTransport(t, Config{})
	callConcurrently(t, tr, mustURL(t, url), burst)
	if n := conns.Load(); n < burst/streams || n > burst/streams+5 {
		t.Errorf("%d connections for a burst of %d calls at %d streams per connection", n, burst, streams)
	}
}

// With MaxConnsPerHost, calls beyond what the connections carry wait for a
// stream and all succeed.
func TestMaxConnsPerHost(t *testing.T) {
	url, conns := loopback.H2C(t, 5, func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(50 * time.Millisecond)
		_, _ = w.Write([]byte(`{}`))
	})
	tr := newTransport(t, Config{MaxConnsPerHost: 2})
	callConcurrently(t, tr, mustURL(t, url), 40)
	if n := conns.Load(); n > 2 {
		t.Errorf("%d connections, cap 2", n)
	}
}

// A response larger than the client's receive windows arrives whole: the
// client gives the windows back as it reads.
func TestLargeResponse(t *testing.T) {
	body := bytes.Repeat([]byte("0123456789abcdef"), (3*defaultStreamWindow)/16+7)
	url, _ := loopback.H2C(t, 0, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		_, _ = w.Write(body)
	})
	tr := newTransport(t, Config{})
	u := mustURL(t, url)
	for i := range 3 { // more than the connection's window in all
		if got := mustCall(t, tr, u); !bytes.Equal(got, body) {
			t.Fatalf("call %d: %d bytes, want %d", i, len(got), len(body))
		}
	}
}

// A cancelled call resets its stream (the gateway's handler sees its
// context end) and gives its stream back: on a server allowing 2 streams
// per connection, calls after many cancelled ones still share 1 connection.
func TestCancelResetsStream(t *testing.T) {
	var seen atomic.Int32
	url, conns := loopback.H2C(t, 2, func(w http.ResponseWriter, r *http.Request) {
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
	tr := newTransport(t, Config{})
	u := mustURL(t, url)
	for i := range 6 {
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		r := call(ctx, tr, u, http.Header{"X-Block": {"1"}}, []byte(`{}`))
		cancel()
		if !errors.Is(r.err, context.DeadlineExceeded) {
			t.Fatalf("call %d: %d %v, want the context's deadline", i, r.status, r.err)
		}
	}
	waitFor(t, "the handlers to see 6 resets", func() bool { return seen.Load() == 6 })
	callConcurrently(t, tr, u, 2)
	if n := conns.Load(); n != 1 {
		t.Errorf("%d connections, want 1", n)
	}
}

// CloseIdleConnections closes the idle connections.
func TestCloseIdle(t *testing.T) {
	url, open := serverOpenConns(t)
	tr := New(Config{})
	mustCall(t, tr, mustURL(t, url))
	if open.Load() != 1 {
		t.Fatalf("%d connections open", open.Load())
	}
	tr.CloseIdleConnections()
	waitFor(t, "the connection to close", func() bool { return open.Load() == 0 })
}

// A connection without calls for the idle timeout is closed.
func TestIdleTimeout(t *testing.T) {
	url, open := serverOpenConns(t)
	tr := newTransport(t, Config{})
	tr.idleTimeout, tr.tick = 150*time.Millisecond, 20*time.Millisecond
	u := mustURL(t, url)
	mustCall(t, tr, u)
	if open.Load() != 1 {
		t.Fatalf("%d connections open after the call", open.Load())
	}
	waitFor(t, "the idle connection to close", func() bool { return open.Load() == 0 })
	mustCall(t, tr, u)
}

// serverOpenConns serves empty answers over h2c and counts the connections
// open at the moment.
func serverOpenConns(t *testing.T) (string, *atomic.Int32) {
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
func TestGatewayWithoutH2C(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(srv.Close)
	tr := newTransport(t, Config{})
	r := call(t.Context(), tr, mustURL(t, srv.URL), jsonHeaders, nil)
	if !errors.Is(r.err, ErrNotSpoken) || !strings.Contains(r.err.Error(), "http1") {
		t.Fatalf("%v, want the error naming dispatch.protocol http1", r.err)
	}
}

// Only http:// URLs with a host are posted to.
func TestNotHTTP(t *testing.T) {
	tr := newTransport(t, Config{})
	for _, s := range []string{"https://gw/v1", "http:///v1"} {
		if r := call(t.Context(), tr, mustURL(t, s), nil, nil); r.err == nil {
			t.Errorf("%s accepted", s)
		}
	}
}

// A body larger than the gateway's receive windows goes out as they open;
// a header block larger than a frame goes out in CONTINUATION frames;
// informational answers are skipped and trailers end the body.
func TestLargeRequestsAndAnswerShapes(t *testing.T) {
	payload := bytes.Repeat([]byte("abcdefgh"), (5<<20)/8) // 5 MiB: several windows' worth
	big := strings.Repeat("v", 40<<10)                     // beyond one 16 KiB frame
	url, _ := loopback.H2C(t, 0, func(w http.ResponseWriter, r *http.Request) {
		got, err := io.ReadAll(r.Body)
		if err != nil || !bytes.Equal(got, payload) || r.Header.Get("X-Big") != big {
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
	tr := newTransport(t, Config{})
	r := call(t.Context(), tr, mustURL(t, url), http.Header{"X-Big": {big}}, payload)
	if r.err != nil || r.status != http.StatusOK || string(r.body) != `{"ok":true}` {
		t.Fatalf("%d %q %v", r.status, r.body, r.err)
	}
}

// Connect opens one connection, sends no request, and the calls that follow
// use it; with an HTTP/1.1-only gateway it fails with a *HandshakeError
// wrapping ErrNotSpoken, with an unreachable one with the dial's error.
func TestConnect(t *testing.T) {
	var calls atomic.Int64
	url, conns := loopback.H2C(t, 0, func(w http.ResponseWriter, r *http.Request) { calls.Add(1) })
	tr := newTransport(t, Config{})
	u := mustURL(t, url+"/v1")
	for range 2 {
		if err := tr.Connect(t.Context(), u); err != nil {
			t.Fatalf("Connect: %v", err)
		}
	}
	if n := calls.Load(); n != 0 {
		t.Fatalf("Connect sent %d requests", n)
	}
	if r := call(t.Context(), tr, u, jsonHeaders, nil); r.err != nil || r.status != http.StatusOK {
		t.Fatalf("%d %v", r.status, r.err)
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("%d connections, want the one Connect opened", n)
	}

	h1 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(h1.Close)
	err := tr.Connect(t.Context(), mustURL(t, h1.URL))
	var he *HandshakeError
	if !errors.As(err, &he) || !errors.Is(err, ErrNotSpoken) {
		t.Fatalf("HTTP/1.1 gateway: %v, want a *HandshakeError wrapping ErrNotSpoken", err)
	}
	h1.Close()
	if err := tr.Connect(t.Context(), mustURL(t, h1.URL)); err == nil || errors.As(err, &he) {
		t.Fatalf("closed gateway: %v, want the dial's error", err)
	}
}
