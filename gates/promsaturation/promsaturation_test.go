package promsaturation_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/gates/gatetest"
	"github.com/sluice-io/sluice/gates/internal/fakeprom"
	"github.com/sluice-io/sluice/gates/promsaturation"
	"github.com/sluice-io/sluice/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	query       = `llm_d_epp_flow_control_pool_saturation{inference_pool="p"}`
	legacyQuery = `inference_extension_flow_control_pool_saturation{inference_pool="p"}`
)

func build(t testing.TB, params string, env gate.Env) (gate.Gate, error) {
	t.Helper()
	r := gate.NewRegistry()
	if err := r.Register(promsaturation.Type, promsaturation.Factory); err != nil {
		t.Fatal(err)
	}
	return gatetest.Build(t, r, promsaturation.Type, params, env)
}

func mustBuild(t testing.TB, params string) gate.Gate {
	t.Helper()
	g, err := build(t, params, gate.Env{})
	if err != nil {
		t.Fatalf("build %s: %v", params, err)
	}
	return g
}

func TestFormula(t *testing.T) {
	fp := fakeprom.Start(t)
	tests := []struct {
		name      string
		params    string
		samples   []float64
		want      float64
		wantErr   bool
		wantFback bool
	}{
		{"idle pool: budget is the threshold", `"threshold":0.8`, []float64{0}, 0.8, false, false},
		{"half saturated", `"threshold":"0.8"`, []float64{0.5}, 0.3, false, false},
		{"at the threshold: closed", ``, []float64{0.8}, 0, false, false},
		{"above: closed", ``, []float64{1.5}, 0, false, false},
		{"several EPP replicas: the highest counts", ``, []float64{0.1, 0.6, 0.3}, 0.2, false, false},
		{"threshold 1", `"threshold":1`, []float64{0.25}, 0.75, false, false},
		{"negative saturation counts as 0", `"threshold":1`, []float64{-3}, 1, false, false},
		{"missing metric: upstream fallback 0 → threshold", ``, nil, 0.8, true, true},
		{"missing metric with fallback 0.5", `"fallback":0.5`, nil, 0.3, true, true},
		{"missing metric with a failure policy: plain error", `"failure_policy":"closed"`, nil, 0, true, false},
		{"only NaN", ``, []float64{math.NaN()}, 0.8, true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fp.Set(query, tt.samples...)
			params := `{"inference_pool":"p","prometheus_url":"` + fp.URL() + `","cache_ttl":"1ns"`
			if tt.params != "" {
				params += "," + tt.params
			}
			g := mustBuild(t, params+"}")
			b, err := gatetest.Query(t, g)
			var fb *gate.FallbackError
			isFb := errors.As(err, &fb)
			switch {
			case (err != nil) != tt.wantErr:
				t.Fatalf("Budget = %v, %v; want error %v", b, err, tt.wantErr)
			case isFb != tt.wantFback:
				t.Fatalf("error %v: fallback %v, want %v", err, isFb, tt.wantFback)
			case isFb:
				b = fb.Budget
			}
			if tt.wantErr && !tt.wantFback {
				return
			}
			if math.Abs(b-tt.want) > 1e-9 {
				t.Fatalf("budget %v, want %v", b, tt.want)
			}
		})
	}
}

func TestParams(t *testing.T) {
	tests := []struct {
		name, params, wantErr string
		env                   gate.Env
	}{
		{"from env", `{"inference_pool":"p"}`, "", gate.Env{PrometheusURL: "http://127.0.0.1:9090"}},
		{"pool alias and namespace", `{"pool":"p","namespace":"ns","prometheus_url":"http://prom:9090"}`, "", gate.Env{}},
		{"no pool", `{"prometheus_url":"http://prom:9090"}`, "inference_pool is required", gate.Env{}},
		{"no url", `{"inference_pool":"p"}`, "no Prometheus URL", gate.Env{}},
		{"bad url", `{"inference_pool":"p","prometheus_url":"prom:9090"}`, "want http(s)", gate.Env{}},
		{"threshold 0", `{"inference_pool":"p","threshold":0}`, "outside (0,1]", gate.Env{PrometheusURL: "http://x:1"}},
		{"threshold text", `{"inference_pool":"p","threshold":"high"}`, "not a number", gate.Env{PrometheusURL: "http://x:1"}},
		{"fallback and policy", `{"inference_pool":"p","fallback":0,"failure_policy":"open"}`, "not both", gate.Env{PrometheusURL: "http://x:1"}},
		{"fallback out of range", `{"inference_pool":"p","fallback":2}`, "outside [0,1]", gate.Env{PrometheusURL: "http://x:1"}},
		{"unknown param", `{"inference_pool":"p","treshold":0.5}`, "unknown gate_params: treshold", gate.Env{PrometheusURL: "http://x:1"}},
		{"pool and alias disagree", `{"inference_pool":"p","pool":"q"}`, "disagree", gate.Env{PrometheusURL: "http://x:1"}},
		{"negative ttl", `{"inference_pool":"p","cache_ttl":"-1s"}`, "negative", gate.Env{PrometheusURL: "http://x:1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := build(t, tt.params, tt.env)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestNamespaceAndDescribe(t *testing.T) {
	fp := fakeprom.Start(t)
	fp.Set(`llm_d_epp_flow_control_pool_saturation{inference_pool="p",namespace="team-a"}`, 0.1)
	g := mustBuild(t, `{"inference_pool":"p","namespace":"team-a","threshold":0.5,"prometheus_url":"`+fp.URL()+`"}`)
	if b, err := gatetest.Query(t, g); err != nil || math.Abs(b-0.4) > 1e-9 {
		t.Fatalf("Budget = %v, %v; want 0.4", b, err)
	}
	d := g.(gate.Describer).Describe()
	for _, want := range []string{`namespace="team-a"`, "≥ 0.5", "saturation 0"} {
		if !strings.Contains(d, want) {
			t.Errorf("Describe = %q, want it to contain %q", d, want)
		}
	}
}

func TestCache(t *testing.T) {
	fp := fakeprom.Start(t)
	fp.Set(query, 0.2)
	g := mustBuild(t, `{"inference_pool":"p","prometheus_url":"`+fp.URL()+`","cache_ttl":"1h"}`)
	for range 10 {
		if _, err := gatetest.Query(t, g); err != nil {
			t.Fatal(err)
		}
	}
	if n := fp.Queries(); n != 1 {
		t.Fatalf("%d queries for 10 budgets within the TTL, want 1", n)
	}
}

func TestConformance(t *testing.T) {
	fp := fakeprom.Start(t)
	gatetest.Run(t, func(t testing.TB) gate.Gate {
		return mustBuild(t, `{"inference_pool":"p","threshold":1,"cache_ttl":"10ms","prometheus_url":"`+fp.URL()+`"}`)
	}, gatetest.Features{
		Set: func(_ testing.TB, b float64) { fp.Set(query, 1-b) },
		Failing: func(t testing.TB) gate.Gate {
			return mustBuild(t, `{"inference_pool":"p","prometheus_url":"http://127.0.0.1:`+strconv.Itoa(testenv.FreePort(t))+`"}`)
		},
		Hanging: func(t testing.TB) gate.Gate {
			hang := fakeprom.Start(t)
			hang.Hang()
			return mustBuild(t, `{"inference_pool":"p","failure_policy":"closed","prometheus_url":"`+hang.URL()+`"}`)
		},
	})
}

// TestRealPrometheus: a real prometheus scrapes a fake endpoint-picker
// endpoint; the budget follows the saturation the endpoint reports under
// either name (the new one wins where both exist; the old one alone is read
// and said once in the log), and a metric that disappears makes the gate
// fall back (open, at the threshold).
func TestRealPrometheus(t *testing.T) {
	epp := testenv.StartGauges(t)
	epp.Set(promsaturation.Metric, 0.1, "inference_pool", "p")
	prom := testenv.StartPrometheus(t, []string{epp.URL()}, 500*time.Millisecond)
	var logs lockedBuffer
	g, err := build(t, `{"inference_pool":"p","threshold":0.8,"cache_ttl":"100ms","prometheus_url":"`+prom.URL+`"}`,
		gate.Env{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	r := gate.NewRefresher(g, gate.RefresherConfig{Name: "sat", Interval: 50 * time.Millisecond})
	r.Start(context.Background())
	defer r.Close()
	const (
		set = iota
		del
	)
	steps := []struct {
		what   string
		op     int
		metric string
		sat    float64
		want   float64
	}{
		{"new name", set, promsaturation.Metric, 0.1, 0.7},
		{"new name rises", set, promsaturation.Metric, 0.5, 0.3},
		{"new name above the threshold", set, promsaturation.Metric, 0.95, 0},
		{"old name beside the new: the new one counts", set, promsaturation.LegacyMetric, 0.1, 0},
		{"new name gone: the old one is read", del, promsaturation.Metric, 0, 0.7},
		{"old name alone moves", set, promsaturation.LegacyMetric, 0.6, 0.2},
		{"new name back", set, promsaturation.Metric, 0.2, 0.6},
		{"new name gone again: the old one (0.6) is read", del, promsaturation.Metric, 0, 0.2},
		{"both gone: fallback", del, promsaturation.LegacyMetric, 0, 0.8},
	}
	for _, s := range steps {
		if s.op == del {
			epp.Delete(s.metric, "inference_pool", "p")
		} else {
			epp.Set(s.metric, s.sat, "inference_pool", "p")
		}
		deadline := time.Now().Add(10 * time.Second)
		for math.Abs(r.Budget()-s.want) > 1e-6 {
			if time.Now().After(deadline) {
				t.Fatalf("%s: budget %v, want %v", s.what, r.Budget(), s.want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if n := strings.Count(logs.String(), promsaturation.LegacyMetric+" (an endpoint picker"); n != 1 {
		t.Errorf("the fallback to the old name was logged %d times, want once:\n%s", n, logs.String())
	}
}

// TestLegacyName: the old name is read only where the new one has no
// sample, a failure of the new query is not hidden by the old one, and the
// fallback is logged once.
func TestLegacyName(t *testing.T) {
	tests := []struct {
		name        string
		cur, legacy []float64 // nil: no sample
		fail        int       // HTTP status of every query (0: none)
		want        float64
		wantErr     bool
		wantLog     bool
	}{
		{"new name only", []float64{0.2}, nil, 0, 0.6, false, false},
		{"both: the new one counts", []float64{0.2}, []float64{0.7}, 0, 0.6, false, false},
		{"old name only", nil, []float64{0.7}, 0, 0.1, false, true},
		{"neither: fallback", nil, nil, 0, 0.8, true, false},
		{"query fails: fallback, the old name not asked", nil, []float64{0.7}, 500, 0.8, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fp := fakeprom.Start(t)
			fp.Set(query, tt.cur...)
			fp.Set(legacyQuery, tt.legacy...)
			if tt.fail != 0 {
				fp.Fail(tt.fail)
			}
			var logs lockedBuffer
			g, err := build(t, `{"inference_pool":"p","cache_ttl":"1ns","prometheus_url":"`+fp.URL()+`"}`,
				gate.Env{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			if err != nil {
				t.Fatal(err)
			}
			for range 3 {
				b, err := gatetest.Query(t, g)
				var fb *gate.FallbackError
				if errors.As(err, &fb) {
					b = fb.Budget
				}
				if (err != nil) != tt.wantErr || math.Abs(b-tt.want) > 1e-9 {
					t.Fatalf("Budget = %v, %v; want %v (error %v)", b, err, tt.want, tt.wantErr)
				}
			}
			n := strings.Count(logs.String(), "deprecated")
			if want := map[bool]int{false: 0, true: 1}[tt.wantLog]; n != want {
				t.Errorf("%d log lines about the old name after 3 reads, want %d:\n%s", n, want, logs.String())
			}
			if tt.fail != 0 && fp.Queries() != 3 {
				t.Errorf("%d queries for 3 failed reads, want 3 (the old name is not asked after a failure)", fp.Queries())
			}
		})
	}
}

// lockedBuffer is a log destination safe for concurrent writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
