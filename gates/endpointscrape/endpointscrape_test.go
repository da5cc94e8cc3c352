package endpointscrape_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/gates/endpointscrape"
	"github.com/sluice-io/sluice/gates/gatetest"
	"github.com/sluice-io/sluice/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// endpoint serves a text-exposition page the test sets.
type endpoint struct {
	srv *httptest.Server

	mu     sync.Mutex
	body   string
	status int
	delay  time.Duration
	hang   chan struct{}
	hits   int
}

func startEndpoint(t testing.TB, body string) *endpoint {
	t.Helper()
	e := &endpoint{body: body, status: http.StatusOK, hang: make(chan struct{})}
	e.srv = httptest.NewServer(http.HandlerFunc(e.serve)) // 127.0.0.1
	t.Cleanup(func() {
		close(e.hang)
		e.srv.Close()
	})
	return e
}

func (e *endpoint) URL() string { return e.srv.URL + "/metrics" }

func (e *endpoint) set(body string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.body = body
}

func (e *endpoint) setStatus(code int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.status = code
}

func (e *endpoint) setDelay(d time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.delay = d
}

func (e *endpoint) Hits() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.hits
}

func (e *endpoint) serve(w http.ResponseWriter, r *http.Request) {
	e.mu.Lock()
	e.hits++
	body, status, delay := e.body, e.status, e.delay
	e.mu.Unlock()
	if delay < 0 {
		select {
		case <-e.hang:
		case <-r.Context().Done():
		}
		return
	}
	if delay > 0 {
		select {
		case <-time.After(delay):
		case <-r.Context().Done():
			return
		}
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(body))
}

func build(t testing.TB, params string) (gate.Gate, error) {
	t.Helper()
	r := gate.NewRegistry()
	if err := r.Register(endpointscrape.Type, endpointscrape.Factory); err != nil {
		t.Fatal(err)
	}
	return gatetest.Build(t, r, endpointscrape.Type, params, gate.Env{PrometheusCacheTTL: time.Nanosecond})
}

func mustBuild(t testing.TB, params string) gate.Gate {
	t.Helper()
	g, err := build(t, params)
	if err != nil {
		t.Fatalf("build %s: %v", params, err)
	}
	return g
}

func TestFree(t *testing.T) {
	tests := []struct{ value, maxCount, want float64 }{
		{16, 64, 0.75},
		{64, 64, 0},
		{100, 64, 0},   // over capacity: clamped
		{-5, 64, 1},    // negative: clamped
		{0.3, 0, 0.7},  // no capacity: the value is the used share
		{1.5, 0, 0},    // clamped
		{0.3, -4, 0.7}, // a capacity ≤ 0 counts as none
		{0, 64, 1},
	}
	for _, tt := range tests {
		if got := endpointscrape.Free(tt.value, tt.maxCount); math.Abs(got-tt.want) > 1e-12 {
			t.Errorf("Free(%v, %v) = %v, want %v", tt.value, tt.maxCount, got, tt.want)
		}
	}
	if d := endpointscrape.Free(math.NaN(), 64); !math.IsNaN(d) {
		t.Errorf("Free(NaN) = %v, want NaN (the gate falls back on it)", d)
	}
}

func TestBudgetFormula(t *testing.T) {
	tests := []struct{ d, baseline, want float64 }{
		{0.75, 0, 0.75},
		{0.75, 0.1, 0.65},
		{0.1, 0.1, 0}, // D ≤ baseline: closed
		{0.05, 0.1, 0},
		{1, 0, 1},
		{0, 0, 0},
		{math.NaN(), 0, 0},
	}
	for _, tt := range tests {
		if got := endpointscrape.Budget(tt.d, tt.baseline); math.Abs(got-tt.want) > 1e-12 {
			t.Errorf("Budget(%v, %v) = %v, want %v", tt.d, tt.baseline, got, tt.want)
		}
	}
}

const page = `# HELP vllm:num_requests_running Running requests.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="b",pod="p2"} 8
vllm:num_requests_running{model_name="a",pod="p1"} 16
vllm:num_requests_running{pod="p3"} 4
# TYPE requests_total counter
requests_total{code="200"} 1234
# TYPE plain untyped
plain 0.25
# TYPE latency histogram
latency_bucket{le="1"} 3
latency_bucket{le="+Inf"} 5
latency_sum 2
latency_count 5
# TYPE q summary
q{quantile="0.5"} 7
q_sum 1
q_count 1
# TYPE not_a_number gauge
not_a_number NaN
`

// TestValues: series in exposition order, every filter must match, a ""
// filter also matches a series without the label, gauge/counter/untyped
// only.
func TestValues(t *testing.T) {
	fams, err := endpointscrape.Parse(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		metric  string
		filters map[string]string
		want    []float64
	}{
		{"vllm:num_requests_running", nil, []float64{8, 16, 4}},
		{"vllm:num_requests_running", map[string]string{"model_name": "a"}, []float64{16}},
		{"vllm:num_requests_running", map[string]string{"model_name": ""}, []float64{4}},
		{"vllm:num_requests_running", map[string]string{"model_name": "a", "pod": "p2"}, nil},
		{"vllm:num_requests_running", map[string]string{"absent": ""}, []float64{8, 16, 4}},
		{"requests_total", nil, []float64{1234}},
		{"plain", nil, []float64{0.25}},
		{"latency", nil, nil},
		{"q", nil, nil},
		{"missing", nil, nil},
	}
	for _, tt := range tests {
		if got := endpointscrape.Values(fams[tt.metric], tt.filters); !slices.Equal(got, tt.want) {
			t.Errorf("%s %v: %v, want %v", tt.metric, tt.filters, got, tt.want)
		}
	}
	if _, err := endpointscrape.Parse(strings.NewReader("ok 1\nbad line here\n")); err == nil {
		t.Error("a bad line must fail the whole page")
	}
}

// TestScrape: the gate end to end against an exposition endpoint.
func TestScrape(t *testing.T) {
	ep := startEndpoint(t, page)
	epp := startEndpoint(t, "# TYPE inference_pool_ready_pods gauge\ninference_pool_ready_pods{name=\"other\"} 5\ninference_pool_ready_pods{name=\"p\"} 2\n")
	zero := startEndpoint(t, "inference_pool_ready_pods 0\n")
	broken := startEndpoint(t, "x{ 1\n")
	failing := startEndpoint(t, page)
	failing.setStatus(http.StatusServiceUnavailable)
	m := `"url":"` + ep.URL() + `","metric":"vllm:num_requests_running"`
	tests := []struct {
		name     string
		params   string
		want     float64
		wantD    float64
		fallback bool
	}{
		{"first series, static capacity", m + `,"max_count_per_pod":64`, 1 - 8.0/64, 1 - 8.0/64, false},
		{"filtered", m + `,"labels":{"model_name":"a"},"max_count_per_pod":64`, 0.75, 0.75, false},
		{"filters as a JSON string", m + `,"labels":"{\"model_name\":\"a\"}","max_count_per_pod":"64"`, 0.75, 0.75, false},
		{"baseline", m + `,"labels":{"model_name":"a"},"max_count_per_pod":64,"baseline":0.25`, 0.5, 0.75, false},
		{"at the baseline: closed", m + `,"labels":{"model_name":"a"},"max_count_per_pod":64,"baseline":0.75`, 0, 0.75, false},
		{"over capacity: closed", m + `,"max_count_per_pod":4`, 0, 0, false},
		{"no capacity: value is the share", `"url":"` + ep.URL() + `","metric":"plain"`, 0.75, 0.75, false},
		{"counter", `"url":"` + ep.URL() + `","metric":"requests_total","max_count_per_pod":10000`, 1 - 0.1234, 1 - 0.1234, false},
		{"dynamic capacity", m + `,"labels":{"model_name":"a"},"max_count_per_pod":16,"pods_url":"` + epp.URL() + `","pods_metric":"inference_pool_ready_pods","pods_labels":{"name":"p"}`, 0.5, 0.5, false},
		{"dynamic capacity, first pods series", m + `,"labels":{"model_name":"a"},"max_count_per_pod":16,"pods_url":"` + epp.URL() + `","pods_metric":"inference_pool_ready_pods"`, 0.8, 0.8, false},
		{"pods on the same page", `"url":"` + ep.URL() + `","metric":"plain","max_count_per_pod":0.125,"pods_url":"` + ep.URL() + `","pods_metric":"requests_total"`, 1 - 0.25/(1234*0.125), 1 - 0.25/(1234*0.125), false},
		{"pods ≤ 0: fallback", m + `,"max_count_per_pod":16,"pods_url":"` + zero.URL() + `","pods_metric":"inference_pool_ready_pods","fallback":0.4`, 0.4, 0, true},
		{"pods missing: fallback", m + `,"max_count_per_pod":16,"pods_url":"` + epp.URL() + `","pods_metric":"nope","fallback":0.4`, 0.4, 0, true},
		{"metric missing: default fallback 0", `"url":"` + ep.URL() + `","metric":"nope"`, 0, 0, true},
		{"no matching series", m + `,"labels":{"model_name":"z"},"fallback":0.5`, 0.5, 0, true},
		{"histogram only: no sample", `"url":"` + ep.URL() + `","metric":"latency","fallback":0.5`, 0.5, 0, true},
		{"NaN: fallback", `"url":"` + ep.URL() + `","metric":"not_a_number","fallback":0.5`, 0.5, 0, true},
		{"status 503: fallback", `"url":"` + failing.URL() + `","metric":"plain","fallback":0.5`, 0.5, 0, true},
		{"bad exposition: fallback", `"url":"` + broken.URL() + `","metric":"x","fallback":0.5`, 0.5, 0, true},
		{"fallback clamped", `"url":"` + ep.URL() + `","metric":"nope","fallback":7`, 1, 0, true},
		{"value_type budget: the value is the free share", `"url":"` + ep.URL() + `","metric":"plain","value_type":"budget"`, 0.25, 0.25, false},
		{"value_type budget over a capacity", m + `,"labels":{"model_name":"a"},"max_count_per_pod":64,"value_type":"budget"`, 0.25, 0.25, false},
		{"value_type budget, clamped", `"url":"` + ep.URL() + `","metric":"requests_total","value_type":"budget"`, 1, 1, false},
		{"absent_value for a missing metric", `"url":"` + ep.URL() + `","metric":"nope","max_count_per_pod":64,"absent_value":16`, 0.75, 0.75, false},
		{"absent_value for no matching series", m + `,"labels":{"model_name":"z"},"max_count_per_pod":64,"absent_value":0`, 1, 1, false},
		{"absent_value does not cover a failed scrape", `"url":"` + failing.URL() + `","metric":"plain","absent_value":0,"fallback":0.5`, 0.5, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := mustBuild(t, `{`+tt.params+`,"pool":"p"}`)
			b, err := gatetest.Query(t, g)
			var fb *gate.FallbackError
			if errors.As(err, &fb) != tt.fallback || (!tt.fallback && err != nil) {
				t.Fatalf("Budget = %v, %v; want fallback %v", b, err, tt.fallback)
			}
			if fb != nil {
				b = fb.Budget
			}
			if math.Abs(b-tt.want) > 1e-12 {
				t.Fatalf("budget %v, want %v", b, tt.want)
			}
			r := gate.ReadingsOf(g)
			if len(r) != 1 || r[0].Pool != "p" || r[0].Available == tt.fallback {
				t.Fatalf("readings %+v", r)
			}
			if !tt.fallback && (math.Abs(r[0].Value-tt.wantD) > 1e-12 || !r[0].Read) {
				t.Fatalf("reading %+v, want D %v", r[0], tt.wantD)
			}
		})
	}
}

// TestFailurePolicyInstead: with failure_policy and no fallback a failure
// is a plain error for the refresh loop's policy.
func TestFailurePolicyInstead(t *testing.T) {
	ep := startEndpoint(t, page)
	g := mustBuild(t, `{"url":"`+ep.URL()+`","metric":"nope","failure_policy":"open"}`)
	_, err := gatetest.Query(t, g)
	var fb *gate.FallbackError
	if !errors.Is(err, endpointscrape.ErrNoSample) || errors.As(err, &fb) {
		t.Fatalf("err %v, want a plain ErrNoSample", err)
	}
	if gate.PolicyOf(g) != gate.FailOpen {
		t.Fatalf("policy %q", gate.PolicyOf(g))
	}
}

// TestCache: evaluations, failures included, are reused for the TTL, and
// concurrent callers share one scrape.
func TestCache(t *testing.T) {
	ep := startEndpoint(t, "m 0.5\n")
	now := time.Unix(1000, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	g, err := endpointscrape.New(endpointscrape.Config{URL: ep.URL(), Metric: "m", TTL: 5 * time.Second, Now: clock, Fallback: new(float64)})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	for range 3 {
		if b, err := gatetest.Query(t, g); b != 0.5 || err != nil {
			t.Fatalf("Budget = %v, %v", b, err)
		}
	}
	if ep.Hits() != 1 {
		t.Fatalf("%d scrapes within the TTL, want 1", ep.Hits())
	}
	ep.set("m 0.2\n")
	advance(4 * time.Second)
	if b, _ := gatetest.Query(t, g); b != 0.5 {
		t.Fatalf("budget %v before the TTL ran out, want the cached 0.5", b)
	}
	advance(time.Second)
	if b, _ := gatetest.Query(t, g); b != 0.8 {
		t.Fatalf("budget %v after the TTL, want 0.8", b)
	}

	// A failure is cached too (upstream's cache stores errors).
	ep.setStatus(http.StatusInternalServerError)
	advance(5 * time.Second)
	hits := ep.Hits()
	for range 3 {
		if _, err := gatetest.Query(t, g); err == nil {
			t.Fatal("no error from a failing endpoint")
		}
	}
	if ep.Hits() != hits+1 {
		t.Fatalf("%d scrapes of a failing endpoint within the TTL, want 1", ep.Hits()-hits)
	}

	// Concurrent callers share one scrape.
	ep.setStatus(http.StatusOK)
	ep.setDelay(200 * time.Millisecond)
	advance(5 * time.Second)
	hits = ep.Hits()
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if b, err := gatetest.Query(t, g); b != 0.8 || err != nil {
				t.Errorf("concurrent Budget = %v, %v", b, err)
			}
		}()
	}
	wg.Wait()
	if ep.Hits() != hits+1 {
		t.Fatalf("%d scrapes for 20 concurrent callers, want 1", ep.Hits()-hits)
	}
}

// TestCallerGone: a scrape that ends with its caller's context is not
// cached, and a caller that waited on it scrapes again with its own.
func TestCallerGone(t *testing.T) {
	ep := startEndpoint(t, "m 0.5\n")
	ep.setDelay(300 * time.Millisecond)
	g, err := endpointscrape.New(endpointscrape.Config{URL: ep.URL(), Metric: "m", TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	waiter := make(chan error, 1)
	go func() {
		time.Sleep(10 * time.Millisecond) // joins the short caller's scrape
		_, err := gatetest.Query(t, g)
		waiter <- err
	}()
	if _, err := g.Budget(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("short caller: %v, want DeadlineExceeded", err)
	}
	if err := <-waiter; err != nil {
		t.Fatalf("waiting caller: %v; want its own scrape's answer", err)
	}
	if b, err := gatetest.Query(t, g); b != 0.5 || err != nil {
		t.Fatalf("then: %v, %v; want the cached 0.5", b, err)
	}
}

func TestParams(t *testing.T) {
	u := `"url":"http://vllm:8000/metrics","metric":"m"`
	tests := []struct{ name, params, wantErr string }{
		{"required only", `{` + u + `}`, ""},
		{"all", `{` + u + `,"labels":{"a":"1","b":2},"max_count_per_pod":"64","baseline":"0.1","fallback":0.5,
			"pods_url":"http://epp:9090/metrics","pods_metric":"pods","pods_labels":"{\"name\":\"p\"}","pool":"p","cache_ttl":"2s"}`, ""},
		{"no url", `{"metric":"m"}`, "gate_params.url is required"},
		{"bad url", `{"url":"vllm:8000","metric":"m"}`, "gate_params.url"},
		{"no metric", `{"url":"http://vllm:8000/metrics"}`, "gate_params.metric is required"},
		{"labels not a map", `{` + u + `,"labels":"a=1"}`, "gate_params.labels"},
		{"labels an array", `{` + u + `,"labels":["a"]}`, "gate_params.labels"},
		{"negative capacity", `{` + u + `,"max_count_per_pod":-1}`, "gate_params.max_count_per_pod"},
		{"capacity not a number", `{` + u + `,"max_count_per_pod":"lots"}`, "gate_params.max_count_per_pod"},
		{"baseline 1", `{` + u + `,"baseline":1}`, "gate_params.baseline: 1 outside [0,1)"},
		{"negative baseline", `{` + u + `,"baseline":-0.1}`, "gate_params.baseline"},
		{"fallback not a number", `{` + u + `,"fallback":true}`, "gate_params.fallback"},
		{"fallback and policy", `{` + u + `,"fallback":0.5,"failure_policy":"open"}`, "not both"},
		{"pods url alone", `{` + u + `,"pods_url":"http://epp/metrics"}`, "gate_params.pods_url and pods_metric"},
		{"pods metric alone", `{` + u + `,"pods_metric":"pods"}`, "gate_params.pods_url and pods_metric"},
		{"pods labels alone", `{` + u + `,"pods_labels":{"a":"b"}}`, "gate_params.pods_labels"},
		{"bad pods url", `{` + u + `,"pods_url":"ftp://epp","pods_metric":"pods"}`, "gate_params.pods_url"},
		{"pool and alias disagree", `{` + u + `,"pool":"a","inference_pool":"b"}`, "disagree"},
		{"negative cache_ttl", `{` + u + `,"cache_ttl":"-1s"}`, "gate_params.cache_ttl"},
		{"zero cache_ttl", `{` + u + `,"cache_ttl":"0s"}`, "gate_params.cache_ttl"},
		{"unknown param", `{` + u + `,"threshold":0.5}`, "unknown gate_params: threshold"},
		{"value_type budget", `{` + u + `,"value_type":"budget"}`, ""},
		{"value_type unknown", `{` + u + `,"value_type":"share"}`, "gate_params.value_type"},
		{"absent_value", `{` + u + `,"absent_value":0}`, ""},
		{"absent_value not a number", `{` + u + `,"absent_value":"none"}`, "gate_params.absent_value"},
		{"admission counted", `{` + u + `,"admission":"counted","max_count_per_pod":8}`, ""},
		{"admission unknown", `{` + u + `,"admission":"strict"}`, "gate_params.admission"},
		{"counted without capacity", `{` + u + `,"admission":"counted"}`, "needs max_count_per_pod > 0"},
		{"counted on a budget value", `{` + u + `,"admission":"counted","max_count_per_pod":8,"value_type":"budget"}`, "needs value_type saturation"},
		{"counted with a baseline", `{` + u + `,"admission":"counted","max_count_per_pod":8,"baseline":0.1}`, "takes no baseline"},
		{"counted with a fallback", `{` + u + `,"admission":"counted","max_count_per_pod":8,"fallback":1}`, "takes no baseline, fallback"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := build(t, tt.params)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

// TestDefaultTTL: without cache_ttl the deployment's --prometheus-cache-ttl
// applies (and without that, 5 s).
func TestDefaultTTL(t *testing.T) {
	ep := startEndpoint(t, "m 0.5\n")
	r := gate.NewRegistry()
	if err := r.Register(endpointscrape.Type, endpointscrape.Factory); err != nil {
		t.Fatal(err)
	}
	for _, env := range []gate.Env{{}, {PrometheusCacheTTL: time.Hour}} {
		g, err := gatetest.Build(t, r, endpointscrape.Type, `{"url":"`+ep.URL()+`","metric":"m"}`, env)
		if err != nil {
			t.Fatal(err)
		}
		hits := ep.Hits()
		for range 5 {
			_, _ = gatetest.Query(t, g)
		}
		if ep.Hits() != hits+1 {
			t.Fatalf("env TTL %v: %d scrapes, want 1", env.PrometheusCacheTTL, ep.Hits()-hits)
		}
	}
}

func TestDescribe(t *testing.T) {
	g := mustBuild(t, `{"url":"http://vllm/metrics","metric":"m","labels":{"b":"2","a":"1"},"max_count_per_pod":8,
		"pods_url":"http://epp/metrics","pods_metric":"pods","baseline":0.1}`)
	d := g.(gate.Describer).Describe()
	for _, want := range []string{`m{a="1",b="2"}`, "http://vllm/metrics", "pods at http://epp/metrics × 8", "baseline 0.1", "budget 0"} {
		if !strings.Contains(d, want) {
			t.Errorf("Describe = %q, want %q in it", d, want)
		}
	}
}

func TestConformance(t *testing.T) {
	ep := startEndpoint(t, "")
	gatetest.Run(t, func(t testing.TB) gate.Gate {
		return mustBuild(t, `{"url":"`+ep.URL()+`","metric":"busy","max_count_per_pod":100,"cache_ttl":"10ms"}`)
	}, gatetest.Features{
		Set: func(_ testing.TB, b float64) {
			ep.set(fmt.Sprintf("# TYPE busy gauge\nbusy %s\n", strconv.FormatFloat(100*(1-b), 'g', -1, 64)))
		},
		Failing: func(t testing.TB) gate.Gate {
			return mustBuild(t, `{"url":"http://127.0.0.1:`+strconv.Itoa(testenv.FreePort(t))+`/metrics","metric":"busy"}`)
		},
		Hanging: func(t testing.TB) gate.Gate {
			hang := startEndpoint(t, "")
			hang.setDelay(-1)
			return mustBuild(t, `{"url":"`+hang.URL()+`","metric":"busy"}`)
		},
	})
}

// TestOnePagePerEvaluation: when the pods metric lives on the same page,
// an evaluation fetches it once.
func TestOnePagePerEvaluation(t *testing.T) {
	ep := startEndpoint(t, "busy 8\nready_pods 2\n")
	g := mustBuild(t, `{"url":"`+ep.URL()+`","metric":"busy","max_count_per_pod":8,"pods_url":"`+ep.URL()+`","pods_metric":"ready_pods"}`)
	b, err := gatetest.Query(t, g)
	if err != nil || b != 0.5 {
		t.Fatalf("Budget = %v, %v; want 1 − 8/(2×8)", b, err)
	}
	if ep.Hits() != 1 {
		t.Fatalf("%d fetches for one evaluation, want 1", ep.Hits())
	}
}

// TestCounted: admission counted admits floor(max − value) requests per
// read, reads at most once per cache_ttl, defers the rest until the next
// read, and admits nothing after a failed read; admission budget has no
// per-request decision at all.
func TestCounted(t *testing.T) {
	ep := startEndpoint(t, "running 60\n")
	g := mustBuild(t, `{"url":"`+ep.URL()+`","metric":"running","max_count_per_pod":64,"admission":"counted","cache_ttl":"300ms"}`)
	adm, ok := g.(gate.Admitter)
	if !ok {
		t.Fatal("admission counted: the gate decides no request")
	}
	admits := func() (n int, delay time.Duration) {
		t.Helper()
		for range 10 {
			d, err := adm.Admit(context.Background(), nil)
			if err != nil {
				t.Fatal(err)
			}
			switch d.Verdict {
			case gate.Admit:
				n++
			case gate.Defer:
				delay = d.Delay
			default:
				t.Fatalf("verdict %v", d.Verdict)
			}
		}
		return n, delay
	}
	start := time.Now()
	if n, delay := admits(); n != 4 || delay <= 0 || delay > 300*time.Millisecond {
		t.Fatalf("value 60 of 64: %d admitted (delay %v), want 4 and a delay up to the next read", n, delay)
	}
	ep.set("running 62.5\n")
	if n, _ := admits(); n != 0 && time.Since(start) < 300*time.Millisecond {
		t.Fatalf("within the TTL: %d more admitted, want 0 (one read per cache_ttl)", n)
	}
	if h := ep.Hits(); h != 1 {
		t.Fatalf("%d reads within the TTL, want 1", h)
	}
	time.Sleep(350 * time.Millisecond)
	if n, _ := admits(); n != 1 {
		t.Fatalf("value 62.5 of 64: %d admitted, want floor(1.5) = 1", n)
	}
	ep.setStatus(http.StatusServiceUnavailable)
	time.Sleep(350 * time.Millisecond)
	if n, _ := admits(); n != 0 {
		t.Fatalf("failed read: %d admitted, want 0", n)
	}
	if h := ep.Hits(); h != 3 {
		t.Fatalf("%d reads, want 3", h)
	}
	plain := mustBuild(t, `{"url":"`+ep.URL()+`","metric":"running","max_count_per_pod":64}`)
	if _, ok := plain.(gate.Admitter); ok {
		t.Fatal("admission budget: the gate must not decide per request (the pipeline would skip its budget at pool level)")
	}
}
