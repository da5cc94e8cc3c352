// Package endpointscrape is the gate of type "endpoint-scrape": it scrapes a
// Prometheus text-exposition endpoint (a model server's or an endpoint
// picker's /metrics) directly, without a Prometheus server, as upstream's.
//
//	{"gate_type":"endpoint-scrape","gate_params":{
//	  "url":"http://vllm-0:8000/metrics","metric":"vllm:num_requests_running",
//	  "labels":{"model_name":"m"},"max_count_per_pod":64,"baseline":0.1}}
//
// One evaluation: GET url (bounded by the caller's context and a 10 s
// timeout; a status other than 200 is an error), parse the whole body as
// text exposition (one bad line fails the scrape), take the series of the
// family named metric that match every label filter (a filter value ""
// also matches a series without the label), in exposition order, reading
// gauge, counter and untyped values (histograms and summaries are skipped).
// With v the first such value:
//
//	maxCount = max_count_per_pod, or pods × max_count_per_pod when pods_url
//	           and pods_metric are set (pods: the first matching sample of
//	           pods_metric at pods_url, filtered by pods_labels; none, or
//	           one ≤ 0, is an error)
//	s        = v / maxCount when maxCount > 0, else v
//	D        = 1 − clamp(s, 0, 1)   (value_type saturation, the default: v is used capacity)
//	D        = clamp(s, 0, 1)       (value_type budget: v is the free share already)
//	budget   = 0 if D ≤ baseline, else min(1, D − baseline)
//
// absent_value, when set, is v for a scrape that worked but has no
// matching series (a gauge the server exports only once it is non-zero).
//
// admission "counted" (upstream #484) decides per request instead: each
// read of the endpoint, at most one per cache_ttl, admits floor(maxCount −
// v) requests; the next are deferred until the next read, and a failed read
// admits none. It needs max_count_per_pod > 0, value_type saturation, and
// neither baseline nor fallback. Its budget is D (baseline 0).
//
// Evaluations (failures included, as upstream) are reused for cache_ttl
// (default --prometheus-cache-ttl, 5 s), and concurrent callers share one
// scrape. When the scrape fails, the metric or a matching series is
// missing, or D is NaN, the gate uses the fallback budget (default 0:
// closed), clamped to [0,1], and reports the failure as a
// *gate.FallbackError. Setting failure_policy instead hands failures to the
// refresh loop's policy; setting both is an error.
package endpointscrape

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/gates/internal/exposition"
	"github.com/sluice-io/sluice/gates/internal/promquery"
)

// Type is the gate's registry name.
const Type = "endpoint-scrape"

// ScrapeTimeout bounds one HTTP GET, as upstream's client timeout.
const ScrapeTimeout = 10 * time.Second

// DefaultTTL is how long an evaluation is reused when neither cache_ttl nor
// --prometheus-cache-ttl says otherwise.
const DefaultTTL = promquery.DefaultTTL

// maxBody bounds a scraped body; a /metrics page is kilobytes to a few MB.
const maxBody = 64 << 20

// The value types and admission modes.
const (
	ValueSaturation  = "saturation" // the value is the used capacity
	ValueBudget      = "budget"     // the value is the free share
	AdmissionBudget  = "budget"     // the gate yields a budget
	AdmissionCounted = "counted"    // each read admits floor(maxCount − value) requests
)

// ErrNoSample means the scrape worked but the metric, or a series matching
// the label filters, is missing.
var ErrNoSample = errors.New("no sample")

// ErrClosed is returned by evaluations of a closed gate.
var ErrClosed = errors.New("endpoint-scrape gate closed")

// Config configures a Gate.
type Config struct {
	// URL is the endpoint scraped (http or https; required).
	URL string
	// Metric is the exact metric family name (required).
	Metric string
	// Labels are equality filters a series must all match ("" also matches
	// a series without the label).
	Labels map[string]string
	// MaxCountPerPod is the capacity the value is divided by (per pod with
	// PodsURL and PodsMetric); 0 takes the value as a share already.
	MaxCountPerPod float64
	// Baseline is the threshold D is compared with, in [0,1).
	Baseline float64
	// Fallback is the budget used on failure, clamped to [0,1]; nil hands
	// failures to the refresh loop's policy.
	Fallback *float64
	// PodsURL, PodsMetric and PodsLabels name the ready-pod count that
	// multiplies MaxCountPerPod (dynamic capacity): both URL and metric, or
	// neither.
	PodsURL, PodsMetric string
	PodsLabels          map[string]string
	// Pool names the inference pool, for the inference_pool label of the
	// gate's readings only.
	Pool string
	// ValueType is ValueSaturation (default) or ValueBudget: what the
	// scraped value means.
	ValueType string
	// AbsentValue, when set, is the value of a scrape without a matching
	// series; nil: such a scrape fails.
	AbsentValue *float64
	// Admission is AdmissionBudget (default) or AdmissionCounted.
	Admission string
	// TTL is how long an evaluation is reused (default DefaultTTL).
	TTL time.Duration
	// Now is the clock (default time.Now); for tests.
	Now func() time.Time
}

func (c *Config) setDefaults() {
	if c.TTL == 0 {
		c.TTL = DefaultTTL
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.ValueType == "" {
		c.ValueType = ValueSaturation
	}
	if c.Admission == "" {
		c.Admission = AdmissionBudget
	}
	if c.Fallback != nil && !math.IsNaN(*c.Fallback) {
		f := min(1, max(0, *c.Fallback))
		c.Fallback = &f
	}
}

// Validate reports an unusable configuration, naming the parameter.
func (c Config) Validate() error {
	var errs []error
	if err := checkURL("url", c.URL, true); err != nil {
		errs = append(errs, err)
	}
	if c.Metric == "" {
		errs = append(errs, errors.New("gate_params.metric is required: the metric family's name"))
	}
	if !(c.MaxCountPerPod >= 0) || math.IsInf(c.MaxCountPerPod, 0) {
		errs = append(errs, fmt.Errorf("gate_params.max_count_per_pod: %v must be a finite number ≥ 0", c.MaxCountPerPod))
	}
	if !(c.Baseline >= 0 && c.Baseline < 1) {
		errs = append(errs, fmt.Errorf("gate_params.baseline: %v outside [0,1)", c.Baseline))
	}
	if c.Fallback != nil && math.IsNaN(*c.Fallback) {
		errs = append(errs, errors.New("gate_params.fallback: NaN is not a budget"))
	}
	switch {
	case (c.PodsURL == "") != (c.PodsMetric == ""):
		errs = append(errs, errors.New("gate_params.pods_url and pods_metric: set both (dynamic capacity) or neither"))
	case c.PodsURL != "":
		if err := checkURL("pods_url", c.PodsURL, true); err != nil {
			errs = append(errs, err)
		}
	case len(c.PodsLabels) > 0:
		errs = append(errs, errors.New("gate_params.pods_labels: needs pods_url and pods_metric"))
	}
	if c.TTL < 0 {
		errs = append(errs, fmt.Errorf("gate_params.cache_ttl: %v is negative", c.TTL))
	}
	if c.ValueType != ValueSaturation && c.ValueType != ValueBudget {
		errs = append(errs, fmt.Errorf("gate_params.value_type: %q is neither %q nor %q", c.ValueType, ValueSaturation, ValueBudget))
	}
	if c.AbsentValue != nil && (math.IsNaN(*c.AbsentValue) || math.IsInf(*c.AbsentValue, 0)) {
		errs = append(errs, fmt.Errorf("gate_params.absent_value: %v is not a finite number", *c.AbsentValue))
	}
	switch c.Admission {
	case AdmissionBudget:
	case AdmissionCounted:
		if !(c.MaxCountPerPod > 0) {
			errs = append(errs, errors.New("gate_params.admission counted: needs max_count_per_pod > 0"))
		}
		if c.ValueType != ValueSaturation {
			errs = append(errs, errors.New("gate_params.admission counted: needs value_type saturation"))
		}
		if c.Baseline != 0 {
			errs = append(errs, errors.New("gate_params.admission counted: takes no baseline"))
		}
	default:
		errs = append(errs, fmt.Errorf("gate_params.admission: %q is neither %q nor %q", c.Admission, AdmissionBudget, AdmissionCounted))
	}
	return errors.Join(errs...)
}

func checkURL(param, s string, required bool) error {
	if s == "" {
		if required {
			return fmt.Errorf("gate_params.%s is required: the endpoint's http(s) URL", param)
		}
		return nil
	}
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("gate_params.%s: %w", param, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("gate_params.%s: %q is not an http(s)://host[:port]/path URL", param, s)
	}
	return nil
}

// Gate is the scrape gate. It is safe for concurrent use.
type Gate struct {
	cfg    Config
	client *http.Client
	tr     *http.Transport

	mu     sync.Mutex
	cached *evaluation // the last evaluation that may be reused
	flight *evaluation // the evaluation running now, if any
	closed bool

	headroom headroom // admission counted

	readings gate.ReadingRecorder
}

// headroom is admission counted's state: the admissions the last read
// left, and when it was made.
type headroom struct {
	mu     sync.Mutex
	readAt time.Time
	left   int
}

// evaluation is one scrape's outcome: D of the first matching series, or
// the error.
type evaluation struct {
	done chan struct{}
	at   time.Time
	d    float64
	err  error
	// callerGone is true when the scrape ended with its caller's context,
	// so the outcome says nothing about the endpoint (not cached, and a
	// waiter whose context is alive asks again).
	callerGone bool
}

var (
	_ gate.Gate      = (*Gate)(nil)
	_ gate.Describer = (*Gate)(nil)
	_ gate.Reader    = (*Gate)(nil)
)

// New returns the gate; it does no I/O.
func New(cfg Config) (*Gate, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	// An own transport, so that Close can drop its idle connections.
	client, tr := exposition.NewClient(5*time.Second, ScrapeTimeout)
	return &Gate{cfg: cfg, tr: tr, client: client}, nil
}

// Factory builds the gate from gate_params: url, metric (required), labels,
// max_count_per_pod, baseline, fallback, pods_url, pods_metric, pods_labels,
// pool (alias inference_pool; descriptive), cache_ttl (default
// --prometheus-cache-ttl).
func Factory(p gate.Params, env gate.Env) (gate.Gate, error) {
	cfg := Config{
		URL: p.String("url", ""), Metric: p.String("metric", ""),
		PodsURL: p.String("pods_url", ""), PodsMetric: p.String("pods_metric", ""),
		ValueType: p.String("value_type", ValueSaturation), Admission: p.String("admission", AdmissionBudget),
	}
	var err error
	if p.Has("absent_value") {
		v, err := p.Float("absent_value", 0)
		if err != nil {
			return nil, err
		}
		cfg.AbsentValue = &v
	}
	if cfg.Admission == AdmissionCounted && (p.Has("baseline") || p.Has("fallback") || p.Has("failure_policy")) {
		return nil, errors.New("gate_params.admission counted: takes no baseline, fallback or failure_policy (a failed read admits nothing)")
	}
	if cfg.Labels, err = p.StringMap("labels"); err != nil {
		return nil, err
	}
	if cfg.PodsLabels, err = p.StringMap("pods_labels"); err != nil {
		return nil, err
	}
	if cfg.MaxCountPerPod, err = p.Float("max_count_per_pod", 0); err != nil {
		return nil, err
	}
	if cfg.Baseline, err = p.Float("baseline", 0); err != nil {
		return nil, err
	}
	zero := 0.0 // upstream's default fallback: closed
	if cfg.Fallback, err = promquery.Fallback(p, &zero); err != nil {
		return nil, err
	}
	if cfg.Pool, err = pool(p); err != nil {
		return nil, err
	}
	if cfg.TTL, err = p.Duration("cache_ttl", env.PrometheusCacheTTL); err != nil {
		return nil, err
	}
	if p.Has("cache_ttl") && cfg.TTL == 0 {
		return nil, errors.New("gate_params.cache_ttl: 0 (use a tiny duration such as 1ns to turn the cache off)")
	}
	if err := p.Unused(); err != nil {
		return nil, err
	}
	g, err := New(cfg)
	if err != nil {
		return nil, err // not g: a nil *Gate would make a non-nil gate.Gate
	}
	if g.cfg.Admission == AdmissionCounted {
		return Counted{g}, nil
	}
	return g, nil
}

// pool reads gate_params.pool or its alias inference_pool (optional).
func pool(p gate.Params) (string, error) {
	a, b := p.String("pool", ""), p.String("inference_pool", "")
	if a != "" && b != "" && a != b {
		return "", fmt.Errorf("gate_params.pool %q and inference_pool %q disagree", a, b)
	}
	if a != "" {
		return a, nil
	}
	return b, nil
}

// freeOf is D for one value under the configured value type.
func (g *Gate) freeOf(v, maxCount float64) float64 {
	if g.cfg.ValueType == ValueBudget {
		return 1 - Free(v, maxCount) // the share itself, clamped
	}
	return Free(v, maxCount)
}

// Free is D for one value: 1 − clamp(value / maxCount, 0, 1), or
// 1 − clamp(value, 0, 1) when maxCount ≤ 0. A NaN stays NaN.
func Free(value, maxCount float64) float64 {
	s := value
	if maxCount > 0 {
		s = value / maxCount
	}
	if !math.IsNaN(s) {
		s = min(1, max(0, s))
	}
	return 1 - s
}

// Budget is the gate's formula: 0 when D ≤ baseline (or NaN), else
// min(1, D − baseline).
func Budget(d, baseline float64) float64 {
	if math.IsNaN(d) || d <= baseline {
		return 0
	}
	return min(1, d-baseline)
}

// Budget scrapes (or reuses an evaluation younger than the TTL) and returns
// the budget of the first matching series.
func (g *Gate) Budget(ctx context.Context) (float64, error) {
	d, err := g.free(ctx)
	if err == nil && (math.IsNaN(d) || math.IsInf(d, 0)) {
		err = fmt.Errorf("scrape %s: %s is %v: %w", g.cfg.URL, g.cfg.Metric, d, ErrNoSample)
	}
	if err == nil {
		g.readings.Record(g.cfg.Pool, d, g.cfg.Baseline)
		return Budget(d, g.cfg.Baseline), nil
	}
	g.readings.Fail(g.cfg.Pool)
	if g.cfg.Fallback != nil {
		return 0, &gate.FallbackError{Budget: *g.cfg.Fallback, Err: err}
	}
	return 0, err
}

// free returns D from the cache, from a scrape another caller runs, or
// from a scrape of its own.
func (g *Gate) free(ctx context.Context) (float64, error) {
	for {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		g.mu.Lock()
		if g.closed {
			g.mu.Unlock()
			return 0, ErrClosed
		}
		if c := g.cached; c != nil && g.cfg.Now().Sub(c.at) < g.cfg.TTL {
			g.mu.Unlock()
			return c.d, c.err
		}
		if f := g.flight; f != nil {
			g.mu.Unlock()
			select {
			case <-f.done:
				if f.callerGone {
					continue // its caller gave up; ask again with ours
				}
				return f.d, f.err
			case <-ctx.Done():
				return 0, ctx.Err()
			}
		}
		e := &evaluation{done: make(chan struct{}), at: g.cfg.Now()}
		g.flight = e
		g.mu.Unlock()

		e.d, e.err = g.evaluate(ctx)
		e.callerGone = e.err != nil && ctx.Err() != nil
		g.mu.Lock()
		g.flight = nil
		if !e.callerGone && !g.closed {
			g.cached = e
		}
		g.mu.Unlock()
		close(e.done)
		return e.d, e.err
	}
}

// evaluate scrapes the metric (and the pods metric) and returns D of the
// first matching series.
func (g *Gate) evaluate(ctx context.Context) (float64, error) {
	v, maxCount, err := g.read(ctx)
	if err != nil {
		return 0, err
	}
	return g.freeOf(v, maxCount), nil
}

// read scrapes the metric (and the pods metric) and returns the value of
// the first matching series (or absent_value) and the capacity.
func (g *Gate) read(ctx context.Context) (v, maxCount float64, err error) {
	pages := map[string]map[string]*dto.MetricFamily{} // one scrape per distinct URL
	vals, err := g.values(ctx, pages, g.cfg.URL, g.cfg.Metric, g.cfg.Labels)
	if err != nil {
		return 0, 0, err
	}
	maxCount = g.cfg.MaxCountPerPod
	if g.cfg.PodsURL != "" {
		pods, err := g.values(ctx, pages, g.cfg.PodsURL, g.cfg.PodsMetric, g.cfg.PodsLabels)
		if err != nil {
			return 0, 0, fmt.Errorf("pods metric: %w", err)
		}
		if len(pods) == 0 {
			return 0, 0, fmt.Errorf("pods metric %s%s not found at %s: %w", g.cfg.PodsMetric, filterString(g.cfg.PodsLabels), g.cfg.PodsURL, ErrNoSample)
		}
		if !(pods[0] > 0) {
			return 0, 0, fmt.Errorf("pods metric %s at %s is %v: no capacity", g.cfg.PodsMetric, g.cfg.PodsURL, pods[0])
		}
		maxCount = pods[0] * g.cfg.MaxCountPerPod
	}
	if len(vals) == 0 {
		if g.cfg.AbsentValue != nil {
			return *g.cfg.AbsentValue, maxCount, nil
		}
		return 0, 0, fmt.Errorf("metric %s%s not found at %s: %w", g.cfg.Metric, filterString(g.cfg.Labels), g.cfg.URL, ErrNoSample)
	}
	return vals[0], maxCount, nil
}

// Counted is the gate with admission counted: the scrape gate plus a
// per-request decision. (A gate with admission budget has no Admit, so
// the pipeline treats it as a budget-only gate.)
type Counted struct{ *Gate }

var _ gate.Admitter = Counted{}

// Admit implements admission counted. A read of the endpoint, at most one
// per cache_ttl, admits floor(maxCount − value) requests; the others are
// deferred until the next read may run. A failed read admits none.
func (c Counted) Admit(ctx context.Context, _ *wire.Request) (gate.Decision, error) {
	g := c.Gate
	h := &g.headroom
	h.mu.Lock()
	defer h.mu.Unlock()
	now := g.cfg.Now()
	if h.readAt.IsZero() || now.Sub(h.readAt) >= g.cfg.TTL {
		v, maxCount, err := g.read(ctx)
		if err != nil && ctx.Err() != nil {
			return gate.Decision{}, err // the caller gave up: no read happened
		}
		h.readAt, h.left = now, 0
		if err == nil && !math.IsNaN(v) {
			h.left = int(math.Max(0, math.Floor(maxCount-v)))
		}
	}
	if h.left > 0 {
		h.left--
		return gate.Admitted, nil
	}
	return gate.Decision{Verdict: gate.Defer, Delay: max(time.Millisecond, h.readAt.Add(g.cfg.TTL).Sub(now)),
		Reason: "no headroom left until the next read of " + g.cfg.URL}, nil
}

// values returns the values of metric's series at u matching filters, in
// exposition order.
func (g *Gate) values(ctx context.Context, pages map[string]map[string]*dto.MetricFamily, u, metric string, filters map[string]string) ([]float64, error) {
	fams, ok := pages[u]
	if !ok {
		var err error
		if fams, err = g.scrape(ctx, u); err != nil {
			return nil, err
		}
		pages[u] = fams
	}
	return Values(fams[metric], filters), nil
}

// scrape fetches u and parses it as text exposition.
func (g *Gate) scrape(ctx context.Context, u string) (map[string]*dto.MetricFamily, error) {
	return exposition.Scrape(ctx, g.client, u, maxBody)
}

// Parse parses a Prometheus text-exposition page; one bad line fails it.
func Parse(r io.Reader) (map[string]*dto.MetricFamily, error) { return exposition.Parse(r) }

// Values returns the gauge, counter and untyped values of mf's series that
// match every filter (a filter value "" also matches a series without the
// label), in exposition order. Histograms and summaries are skipped.
func Values(mf *dto.MetricFamily, filters map[string]string) []float64 {
	return exposition.Values(mf, filters)
}

// filterString renders filters as {k="v",...}, sorted; "" when none.
func filterString(filters map[string]string) string {
	if len(filters) == 0 {
		return ""
	}
	parts := make([]string, 0, len(filters))
	for _, k := range slices.Sorted(maps.Keys(filters)) {
		parts = append(parts, fmt.Sprintf("%s=%q", k, filters[k]))
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// Describe says when the gate closes.
func (g *Gate) Describe() string {
	capacity := "the value itself is the used share"
	switch {
	case g.cfg.PodsURL != "":
		capacity = fmt.Sprintf("capacity = %s%s at %s × %g", g.cfg.PodsMetric, filterString(g.cfg.PodsLabels), g.cfg.PodsURL, g.cfg.MaxCountPerPod)
	case g.cfg.MaxCountPerPod > 0:
		capacity = fmt.Sprintf("capacity %g", g.cfg.MaxCountPerPod)
	}
	s := fmt.Sprintf("when D ≤ baseline %g (budget = D − %g), D = 1 − used share of %s%s scraped from %s (%s)",
		g.cfg.Baseline, g.cfg.Baseline, g.cfg.Metric, filterString(g.cfg.Labels), g.cfg.URL, capacity)
	if g.cfg.Fallback != nil {
		s += fmt.Sprintf("; on a failed scrape, no sample or NaN: budget %g", *g.cfg.Fallback)
	}
	return s
}

// Readings returns the last D against the baseline.
func (g *Gate) Readings() []gate.Reading { return g.readings.Readings() }

// Close drops the cache and the idle connections; later evaluations fail
// with ErrClosed. It is idempotent.
func (g *Gate) Close() error {
	g.mu.Lock()
	g.closed = true
	g.cached = nil
	g.mu.Unlock()
	g.tr.CloseIdleConnections()
	return nil
}
