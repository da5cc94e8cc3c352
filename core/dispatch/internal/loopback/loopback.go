// Package loopback starts the servers on 127.0.0.1 that the tests and
// benchmarks of dispatch and its protocol clients call: a raw one that
// hands each connection to a function, and an h2c one (HTTP/2 with prior
// knowledge only) over net/http. Both stop, with their connections, when the
// test ends.
package loopback

import (
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
)

// Serve listens on a loopback port and runs serve for each connection
// accepted (n counts them from 0), and returns the address. When the test
// ends it stops listening, closes the connections and waits for serve to
// return.
func Serve(tb testing.TB, serve func(conn net.Conn, n int)) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	wg.Go(func() {
		for n := 0; ; n++ {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, conn)
			mu.Unlock()
			wg.Go(func() { serve(conn, n) })
		}
	})
	tb.Cleanup(func() {
		_ = l.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return l.Addr().String()
}

// H2C serves handler over h2c (HTTP/2 with prior knowledge only) with a
// limit of streams per connection (0: Go's default), and returns its
// http:// URL and a count of the connections it accepted.
func H2C(tb testing.TB, streams int, handler http.HandlerFunc) (string, *atomic.Int64) {
	tb.Helper()
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
		tb.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	tb.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String(), conns
}
