// Package promquery is the Prometheus client the Prometheus gates share: an
// instant query through the prometheus/client_golang API client, answers
// cached for a TTL (--prometheus-cache-ttl), and PromQL selector building
// with properly quoted label values.
package promquery

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/api"
	v1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
)

// DefaultTTL is how long an answer is reused when Config.TTL is zero.
const DefaultTTL = 5 * time.Second

// Config configures a Client.
type Config struct {
	// URL is the Prometheus server's base URL (http or https; required).
	URL string
	// TTL is how long an answer is reused (default DefaultTTL; negative: no cache).
	TTL time.Duration
	// Now is the clock (default time.Now); for tests.
	Now func() time.Time
}

// Validate reports an unusable configuration.
func (c Config) Validate() error {
	if c.URL == "" {
		return errors.New("no Prometheus URL (set --prometheus-url or the gate's prometheus_url)")
	}
	u, err := url.Parse(c.URL)
	if err != nil {
		return fmt.Errorf("prometheus url %q: %w", c.URL, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("prometheus url %q: want http(s)://host[:port][/path]", c.URL)
	}
	return nil
}

// ErrNoData means the query returned no sample (the metric is missing).
var ErrNoData = errors.New("no data")

// Client runs instant queries with a TTL cache. It is safe for concurrent use.
type Client struct {
	api v1.API
	tr  *http.Transport
	ttl time.Duration
	now func() time.Time

	mu     sync.Mutex
	cache  map[string]entry
	closed bool
}

type entry struct {
	at   time.Time
	vals []float64
}

// New returns a client; it does no I/O.
func New(c Config) (*Client, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if c.TTL == 0 {
		c.TTL = DefaultTTL
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	// An own transport, so that Close can drop its idle connections.
	tr := &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout: 5 * time.Second,
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     90 * time.Second,
	}
	ac, err := api.NewClient(api.Config{Address: c.URL, RoundTripper: tr})
	if err != nil {
		return nil, fmt.Errorf("prometheus client: %w", err)
	}
	return &Client{api: v1.NewAPI(ac), tr: tr, ttl: c.TTL, now: c.Now, cache: map[string]entry{}}, nil
}

// ErrClosed is returned by queries on a closed client.
var ErrClosed = errors.New("prometheus client closed")

// Values runs query (or reuses an answer younger than the TTL) and returns
// the value of every sample of the resulting vector or scalar, in label
// order. An empty answer is ErrNoData. Failed queries are not cached.
func (c *Client) Values(ctx context.Context, query string) ([]float64, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	e, ok := c.cache[query]
	now := c.now()
	c.mu.Unlock()
	if ok && c.ttl > 0 && now.Sub(e.at) < c.ttl {
		return answer(e.vals, query)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	v, _, _, err := c.api.Query(ctx, query, time.Time{})
	if err != nil {
		return nil, fmt.Errorf("query %s: %w", query, err)
	}
	vals, err := values(v)
	if err != nil {
		return nil, fmt.Errorf("query %s: %w", query, err)
	}
	c.mu.Lock()
	if !c.closed {
		c.cache[query] = entry{at: now, vals: vals}
	}
	c.mu.Unlock()
	return answer(vals, query)
}

func answer(vals []float64, query string) ([]float64, error) {
	if len(vals) == 0 {
		return nil, fmt.Errorf("query %s: %w", query, ErrNoData)
	}
	return vals, nil
}

// values extracts the sample values of an instant-query answer.
func values(v model.Value) ([]float64, error) {
	switch v := v.(type) {
	case model.Vector:
		sort.Slice(v, func(i, j int) bool { return v[i].Metric.Before(v[j].Metric) })
		out := make([]float64, 0, len(v))
		for _, s := range v {
			out = append(out, float64(s.Value))
		}
		return out, nil
	case *model.Scalar:
		return []float64{float64(v.Value)}, nil
	case nil:
		return nil, nil
	}
	return nil, fmt.Errorf("unexpected result type %s", v.Type())
}

// Max returns the largest value that is not NaN, and false when there is none.
func Max(vals []float64) (float64, bool) {
	m, ok := math.Inf(-1), false
	for _, v := range vals {
		if !math.IsNaN(v) && v >= m {
			m, ok = v, true
		}
	}
	return m, ok
}

// Close drops the cache and the idle connections; later queries fail with
// ErrClosed. It is idempotent.
func (c *Client) Close() error {
	c.mu.Lock()
	c.closed = true
	c.cache = nil
	c.mu.Unlock()
	c.tr.CloseIdleConnections()
	return nil
}

// Selector builds metric{k1="v1",k2="v2"} from name/value pairs, skipping
// pairs whose value is empty; values are quoted as PromQL strings.
func Selector(metric string, labels ...string) string {
	var b strings.Builder
	b.WriteString(metric)
	b.WriteByte('{')
	n := 0
	for i := 0; i+1 < len(labels); i += 2 {
		if labels[i+1] == "" {
			continue
		}
		if n > 0 {
			b.WriteByte(',')
		}
		b.WriteString(labels[i])
		b.WriteByte('=')
		b.WriteString(strconv.Quote(labels[i+1]))
		n++
	}
	b.WriteByte('}')
	return b.String()
}
