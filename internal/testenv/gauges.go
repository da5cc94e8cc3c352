package testenv

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// Gauges is a fake metrics endpoint (for example an endpoint picker's or
// an inference pool's) whose gauge values the test sets; Prometheus scrapes
// it like any target.
type Gauges struct {
	srv *httptest.Server

	mu     sync.Mutex
	series map[string]float64 // `name{labels}` → value
}

// StartGauges starts the endpoint on 127.0.0.1; it closes when t ends.
func StartGauges(t testing.TB) *Gauges {
	t.Helper()
	g := &Gauges{series: map[string]float64{}}
	g.srv = httptest.NewServer(http.HandlerFunc(g.serve))
	t.Cleanup(g.srv.Close)
	return g
}

// URL is the metrics URL (…/metrics).
func (g *Gauges) URL() string { return g.srv.URL + "/metrics" }

// Set sets the gauge name with labels (name/value pairs) to v.
func (g *Gauges) Set(name string, v float64, labels ...string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.series[seriesKey(name, labels)] = v
}

// Delete removes the series, so that it goes stale in Prometheus.
func (g *Gauges) Delete(name string, labels ...string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.series, seriesKey(name, labels))
}

func seriesKey(name string, labels []string) string {
	var b strings.Builder
	b.WriteString(name)
	if len(labels) > 1 {
		b.WriteByte('{')
		for i := 0; i+1 < len(labels); i += 2 {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, "%s=%q", labels[i], labels[i+1])
		}
		b.WriteByte('}')
	}
	return b.String()
}

func (g *Gauges) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/metrics" {
		http.NotFound(w, r)
		return
	}
	g.mu.Lock()
	keys := make([]string, 0, len(g.series))
	for k := range g.series {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	typed := map[string]bool{}
	for _, k := range keys {
		name, _, _ := strings.Cut(k, "{")
		if !typed[name] {
			typed[name] = true
			fmt.Fprintf(&b, "# TYPE %s gauge\n", name)
		}
		b.WriteString(k)
		b.WriteByte(' ')
		b.WriteString(strconv.FormatFloat(g.series[k], 'g', -1, 64))
		b.WriteByte('\n')
	}
	g.mu.Unlock()
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	_, _ = w.Write([]byte(b.String()))
}
