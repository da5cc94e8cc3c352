// Package exposition reads Prometheus text-exposition pages (a model
// server's or an endpoint picker's /metrics) for the gates that scrape
// them directly: endpoint-scrape and pool-headroom.
package exposition

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Scrape fetches u with client and parses it as text exposition; a status
// other than 200, a body over maxBody bytes or one bad line is an error
// naming u.
func Scrape(ctx context.Context, client *http.Client, u string, maxBody int64) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", u, err)
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4;q=1,*/*;q=0.1")
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", u, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
		return nil, fmt.Errorf("scrape %s: status %s", u, resp.Status)
	}
	body := &limitedReader{r: resp.Body, n: maxBody}
	fams, err := Parse(body)
	if body.over {
		return nil, fmt.Errorf("scrape %s: body larger than %d bytes", u, maxBody)
	}
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", u, err)
	}
	return fams, nil
}

// limitedReader reads at most n bytes and notes whether there was more.
type limitedReader struct {
	r    io.Reader
	n    int64
	over bool
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.n <= 0 {
		var one [1]byte
		if k, _ := l.r.Read(one[:]); k > 0 {
			l.over = true
		}
		return 0, io.EOF
	}
	if int64(len(p)) > l.n {
		p = p[:l.n]
	}
	k, err := l.r.Read(p)
	l.n -= int64(k)
	return k, err
}

// Parse parses a Prometheus text-exposition page; one bad line fails it.
func Parse(r io.Reader) (map[string]*dto.MetricFamily, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parse text exposition: %w", err)
	}
	return fams, nil
}

// Values returns the gauge, counter and untyped values of mf's series that
// match every filter (a filter value "" also matches a series without the
// label), in exposition order. Histograms and summaries are skipped.
func Values(mf *dto.MetricFamily, filters map[string]string) []float64 {
	if mf == nil {
		return nil
	}
	var out []float64
	for _, m := range mf.GetMetric() {
		if !matches(m, filters) {
			continue
		}
		switch {
		case m.GetGauge() != nil:
			out = append(out, m.GetGauge().GetValue())
		case m.GetCounter() != nil:
			out = append(out, m.GetCounter().GetValue())
		case m.GetUntyped() != nil:
			out = append(out, m.GetUntyped().GetValue())
		}
	}
	return out
}

// Count returns the summed sample count of mf's histogram (or summary)
// series that match every filter, as Values filters them; ok is false
// when no series matches.
func Count(mf *dto.MetricFamily, filters map[string]string) (n float64, ok bool) {
	if mf == nil {
		return 0, false
	}
	for _, m := range mf.GetMetric() {
		if !matches(m, filters) {
			continue
		}
		switch {
		case m.GetHistogram() != nil:
			n, ok = n+float64(m.GetHistogram().GetSampleCount()), true
		case m.GetSummary() != nil:
			n, ok = n+float64(m.GetSummary().GetSampleCount()), true
		}
	}
	return n, ok
}

func matches(m *dto.Metric, filters map[string]string) bool {
	for k, want := range filters {
		got := ""
		for _, lp := range m.GetLabel() {
			if lp.GetName() == k {
				got = lp.GetValue()
				break
			}
		}
		if got != want {
			return false
		}
	}
	return true
}

// NewClient returns an HTTP client for scraping, with a transport of its
// own (so that its owner can drop the idle connections on Close): dials
// and TLS handshakes bounded by connect, each request by timeout, two idle
// connections kept per host.
func NewClient(connect, timeout time.Duration) (*http.Client, *http.Transport) {
	tr := &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		DialContext:         (&net.Dialer{Timeout: connect, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout: connect,
		MaxIdleConnsPerHost: 2,
		IdleConnTimeout:     90 * time.Second,
	}
	return &http.Client{Transport: tr, Timeout: timeout}, tr
}
