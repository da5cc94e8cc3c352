package auto

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluice-io/sluice/core/dispatch/internal/loopback"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// noProxy keeps the tests independent of the environment's proxy settings.
func noProxy(*http.Request) (*url.URL, error) { return nil, nil }

func newTransport(t *testing.T, cfg Config) *Transport {
	t.Helper()
	if cfg.Proxy == nil {
		cfg.Proxy = noProxy
	}
	tr := New(cfg)
	t.Cleanup(tr.CloseIdleConnections)
	return tr
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// ledger is a gateway handler that counts each request by its X-Id header
// and the protocol it came in.
type ledger struct {
	// prefaces counts the HTTP/2 prefaces an HTTP/1.1-only net/http server
	// hands to its handler as "PRI *" requests: the detections.
	prefaces atomic.Int64

	mu     sync.Mutex
	seen   map[string]int
	protos map[int]int // ProtoMajor → requests
}

func newLedger() *ledger { return &ledger{seen: map[string]int{}, protos: map[int]int{}} }

func (l *ledger) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == "PRI" {
		l.prefaces.Add(1)
		w.WriteHeader(http.StatusHTTPVersionNotSupported)
		return
	}
	_, _ = io.Copy(io.Discard, r.Body)
	l.mu.Lock()
	l.seen[r.Header.Get("X-Id")]++
	l.protos[r.ProtoMajor]++
	l.mu.Unlock()
	_, _ = w.Write([]byte("ok"))
}

// once fails the test unless every id in ids was received exactly once and
// nothing else was.
func (l *ledger) once(t *testing.T, ids []string) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range ids {
		if n := l.seen[id]; n != 1 {
			t.Errorf("request %s received %d times, want once", id, n)
		}
	}
	if len(l.seen) != len(ids) {
		t.Errorf("the gateway received %d distinct requests, want %d", len(l.seen), len(ids))
	}
}

// post sends request id to u and returns the response's protocol major.
func post(ctx context.Context, tr *Transport, u *url.URL, id string) (int, error) {
	resp, err := tr.Post(ctx, u, http.Header{"X-Id": {id}}, []byte(`{"id":"`+id+`"}`))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return 0, err
	}
	return resp.ProtoMajor, nil
}

// countingListener counts the connections accepted and how many of them
// began with the HTTP/2 preface.
type countingListener struct {
	net.Listener
	accepted atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepted.Add(1)
	}
	return c, err
}

// http1Server is a gateway that speaks HTTP/1.1 only (net/http without
// h2c). net/http hands the HTTP/2 preface to the handler as a request
// "PRI * HTTP/2.0" and answers it in HTTP/1.1.
func http1Server(t *testing.T, h http.Handler) (string, *countingListener) {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	var p http.Protocols
	p.SetHTTP1(true)
	srv.Config.Protocols = &p
	cl := &countingListener{Listener: srv.Listener}
	srv.Listener = cl
	srv.Start()
	t.Cleanup(func() { srv.CloseClientConnections(); srv.Close() })
	return srv.URL, cl
}

// Each kind of http:// gateway is found and spoken to in its protocol, with
// one detection however many calls arrive at once, and every request
// arrives once.
func TestDetection(t *testing.T) {
	tests := []struct {
		name     string
		start    func(t *testing.T, h http.Handler) (url string, conns func() int64)
		kind     string
		major    int
		maxConns int64 // connections the gateway may see for calls calls at once
		calls    int
		prefaces int64 // prefaces handed to the handler
	}{
		{
			name: "h2c gateway",
			start: func(t *testing.T, h http.Handler) (string, func() int64) {
				u, n := loopback.H2C(t, 100, h.ServeHTTP)
				return u, n.Load
			},
			// The detection's connection is kept and carries calls: 200
			// calls at 100 streams per connection need 2 or 3.
			kind: "h2c", major: 2, calls: 200, maxConns: 3,
		},
		{
			name: "HTTP/1.1-only gateway",
			start: func(t *testing.T, h http.Handler) (string, func() int64) {
				u, l := http1Server(t, h)
				return u, l.accepted.Load
			},
			// One connection per call in flight, and one detection.
			kind: "http1", major: 1, calls: 50, maxConns: 51, prefaces: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := newLedger()
			gw, conns := tt.start(t, l)
			tr := newTransport(t, Config{MaxIdleConnsPerHost: 64})
			u := mustURL(t, gw+"/v1/completions")
			if k := tr.Kind(u); k != "" {
				t.Fatalf("kind before any call = %q", k)
			}
			ids := make([]string, tt.calls)
			var wg sync.WaitGroup
			errs := make(chan error, tt.calls)
			for i := range tt.calls {
				ids[i] = strconv.Itoa(i)
				wg.Go(func() {
					major, err := post(t.Context(), tr, u, ids[i])
					if err == nil && major != tt.major {
						err = &protoError{major}
					}
					errs <- err
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			if k := tr.Kind(u); k != tt.kind {
				t.Fatalf("kind = %q, want %q", k, tt.kind)
			}
			if n := conns(); n > tt.maxConns {
				t.Errorf("the gateway saw %d connections, want at most %d", n, tt.maxConns)
			}
			if n := l.prefaces.Load(); n != tt.prefaces {
				t.Errorf("the handler saw %d HTTP/2 prefaces, want %d", n, tt.prefaces)
			}
			l.once(t, ids)
		})
	}
}

type protoError struct{ major int }

func (e *protoError) Error() string { return "answered over HTTP/" + strconv.Itoa(e.major) }

// switchGateway serves each new connection as an h2c gateway or an
// HTTP/1.1-only one, whichever it is set to at the time, and can drop its
// connections, as a gateway redeployed with another protocol would.
type switchGateway struct {
	h2c   atomic.Bool
	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

// chanListener is a net.Listener fed by hand.
type chanListener struct {
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func newChanListener() *chanListener {
	return &chanListener{conns: make(chan net.Conn), closed: make(chan struct{})}
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *chanListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *chanListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

// hand gives c to l's server, or closes it once l is closed.
func (l *chanListener) hand(c net.Conn) {
	select {
	case l.conns <- c:
	case <-l.closed:
		_ = c.Close()
	}
}

func startSwitchGateway(t *testing.T, h http.Handler) (*switchGateway, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var p1, p2 http.Protocols
	p1.SetHTTP1(true)
	p2.SetUnencryptedHTTP2(true)
	h1, h2 := &http.Server{Handler: h, Protocols: &p1}, &http.Server{Handler: h, Protocols: &p2}
	l1, l2 := newChanListener(), newChanListener()
	g := &switchGateway{}
	g.wg.Go(func() { _ = h1.Serve(l1) })
	g.wg.Go(func() { _ = h2.Serve(l2) })
	g.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			g.mu.Lock()
			g.conns = append(g.conns, c)
			g.mu.Unlock()
			if g.h2c.Load() {
				l2.hand(c)
			} else {
				l1.hand(c)
			}
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		_ = h1.Close()
		_ = h2.Close()
		g.drop()
		g.wg.Wait()
	})
	return g, "http://" + ln.Addr().String()
}

// drop closes every connection the gateway has.
func (g *switchGateway) drop() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, c := range g.conns {
		_ = c.Close()
	}
	g.conns = nil
}

// A gateway that changes kind between connections is followed: from h2c to
// HTTP/1.1 by the handshake of the next h2c connection, from HTTP/1.1 to h2c
// by the detection after a failed call or a new HTTP/1.1 connection. No
// request is received twice; a call may fail while the gateway drops its
// connections, as it would with a fixed protocol.
func TestGatewayChangesKind(t *testing.T) {
	l := newLedger()
	g, gw := startSwitchGateway(t, l)
	g.h2c.Store(true)
	tr := newTransport(t, Config{MaxIdleConnsPerHost: 4})
	tr.recheckAfter = 0 // every new HTTP/1.1 connection re-checks
	u := mustURL(t, gw+"/v1")
	var ids []string
	n := 0
	// call posts until one call succeeds (a few may fail while the
	// connections drop) and returns the protocol of that answer.
	call := func() int {
		t.Helper()
		for range 50 {
			n++
			id := strconv.Itoa(n)
			major, err := post(t.Context(), tr, u, id)
			if err == nil {
				ids = append(ids, id)
				return major
			}
			// A failed call may or may not have reached the gateway.
			l.mu.Lock()
			if l.seen[id] > 0 {
				ids = append(ids, id)
			}
			l.mu.Unlock()
			time.Sleep(5 * time.Millisecond)
		}
		t.Fatal("no call succeeded")
		return 0
	}
	steps := []struct {
		h2c  bool
		want int
		kind string
	}{
		{true, 2, "h2c"},
		{false, 1, "http1"},
		{true, 2, "h2c"},
		{false, 1, "http1"},
	}
	for i, s := range steps {
		g.h2c.Store(s.h2c)
		g.drop()
		if got := call(); got != s.want {
			t.Fatalf("step %d: answered over HTTP/%d, want HTTP/%d", i, got, s.want)
		}
		for range 3 {
			if got := call(); got != s.want {
				t.Fatalf("step %d: answered over HTTP/%d, want HTTP/%d", i, got, s.want)
			}
		}
		if k := tr.Kind(u); k != s.kind {
			t.Fatalf("step %d: kind %q, want %q", i, k, s.kind)
		}
	}
	l.once(t, ids)
}

// A gateway that cannot be reached fails the call with the dial's error and
// is detected again by the next call.
func TestUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	tr := newTransport(t, Config{})
	u := mustURL(t, "http://"+addr+"/v1")
	if _, err := post(t.Context(), tr, u, "1"); err == nil {
		t.Fatal("a call to a closed port succeeded")
	}
	if k := tr.Kind(u); k != "" {
		t.Fatalf("kind after a failed dial = %q, want unknown", k)
	}
	l := newLedger()
	ln, err = net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("the port was taken meanwhile: %v", err)
	}
	srv := &http.Server{Handler: l}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	if major, err := post(t.Context(), tr, u, "2"); err != nil || major != 1 {
		t.Fatalf("HTTP/%d, %v; want an HTTP/1.1 answer", major, err)
	}
	l.once(t, []string{"2"})
}

// A gateway behind a proxy is spoken to in HTTP/1.1 through the proxy,
// without detection.
func TestProxied(t *testing.T) {
	l := newLedger()
	var viaProxy atomic.Int64
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		viaProxy.Add(1)
		l.ServeHTTP(w, r)
	}))
	t.Cleanup(proxy.Close)
	pu := mustURL(t, proxy.URL)
	tr := newTransport(t, Config{Proxy: func(*http.Request) (*url.URL, error) { return pu, nil }})
	u := mustURL(t, "http://gateway.invalid/v1")
	if major, err := post(t.Context(), tr, u, "1"); err != nil || major != 1 {
		t.Fatalf("HTTP/%d, %v", major, err)
	}
	if viaProxy.Load() != 1 || tr.Kind(u) != "http1" {
		t.Fatalf("%d calls through the proxy, kind %q", viaProxy.Load(), tr.Kind(u))
	}
	l.once(t, []string{"1"})
}

// Only http:// URLs with a host are posted to.
func TestNotHTTP(t *testing.T) {
	tr := newTransport(t, Config{})
	for _, s := range []string{"https://gw/v1", "http:///v1"} {
		if _, err := post(t.Context(), tr, mustURL(t, s), "1"); err == nil {
			t.Errorf("%s accepted", s)
		}
	}
}
