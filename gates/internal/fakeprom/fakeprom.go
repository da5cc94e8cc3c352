// Package fakeprom is a stand-in for Prometheus's instant-query API
// (/api/v1/query) for fast unit tests of the Prometheus gates: the test sets
// the answer of each query string. Tests against a real Prometheus use
// internal/testenv.StartPrometheus instead.
package fakeprom

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// Server answers instant queries with the values a test set.
type Server struct {
	srv *httptest.Server

	mu      sync.Mutex
	answers map[string][]float64
	status  int // non-zero: answer every query with this HTTP status
	hang    chan struct{}
	queries int
}

// Start starts a server on 127.0.0.1 that is closed when t ends.
func Start(t testing.TB) *Server {
	t.Helper()
	s := &Server{answers: map[string][]float64{}, hang: make(chan struct{})}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(func() {
		s.mu.Lock()
		select {
		case <-s.hang:
		default:
			close(s.hang)
		}
		s.mu.Unlock()
		s.srv.Close()
	})
	return s
}

// URL is the server's base URL (the gates' prometheus_url).
func (s *Server) URL() string { return s.srv.URL }

// Set makes query answer a vector with one sample per value (none: an empty vector).
func (s *Server) Set(query string, vals ...float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.answers[query] = vals
}

// Clear forgets every answer: all queries return empty vectors.
func (s *Server) Clear() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.answers = map[string][]float64{}
}

// Fail makes every query fail with HTTP status code (0: answer again).
func (s *Server) Fail(code int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.status = code
}

// Hang makes every later query wait until the server closes.
func (s *Server) Hang() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.status = -1
}

// Queries is how many queries were received.
func (s *Server) Queries() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.queries
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/api/v1/query" {
		http.NotFound(w, r)
		return
	}
	if err := r.ParseForm(); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	q := r.Form.Get("query")
	s.mu.Lock()
	s.queries++
	status, vals, hang := s.status, s.answers[q], s.hang
	s.mu.Unlock()
	switch {
	case status < 0:
		select {
		case <-hang:
		case <-r.Context().Done():
		}
		return
	case status > 0:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		fmt.Fprintf(w, `{"status":"error","errorType":"internal","error":"fake failure %d"}`, status)
		return
	}
	var b strings.Builder
	b.WriteString(`{"status":"success","data":{"resultType":"vector","result":[`)
	for i, v := range vals {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"metric":{"replica":"%d"},"value":[1700000000,"%s"]}`, i, strconv.FormatFloat(v, 'g', -1, 64))
	}
	b.WriteString(`]}}`)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte(b.String()))
}
