package promql_test

import (
	"errors"
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/gates/gatetest"
	"github.com/sluice-io/sluice/gates/internal/fakeprom"
	"github.com/sluice-io/sluice/gates/internal/promquery"
	"github.com/sluice-io/sluice/gates/promql"
	"github.com/sluice-io/sluice/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const query = `clamp(1 - inference_extension_flow_control_pool_saturation{inference_pool="p"} / 0.5, 0, 1)`

func build(t testing.TB, params string, env gate.Env) (gate.Gate, error) {
	t.Helper()
	r := gate.NewRegistry()
	if err := r.Register(promql.Type, promql.Factory); err != nil {
		t.Fatal(err)
	}
	return gatetest.Build(t, r, promql.Type, params, env)
}

func mustBuild(t testing.TB, params string, env gate.Env) gate.Gate {
	t.Helper()
	g, err := build(t, params, env)
	if err != nil {
		t.Fatalf("build %s: %v", params, err)
	}
	return g
}

func TestBudgetFormula(t *testing.T) {
	for v, want := range map[float64]float64{
		0.4: 0.4, 1: 1, 1.7: 1, 0: 0, -0.3: 0, 1e-9: 1e-9, math.NaN(): 0,
	} {
		if got := promql.Budget(v); got != want {
			t.Errorf("Budget(%v) = %v, want %v", v, got, want)
		}
	}
}

// TestQuery: the first sample is the budget; a failed query, no sample, or
// a NaN or infinite first sample give the fallback as a FallbackError.
func TestQuery(t *testing.T) {
	fp := fakeprom.Start(t)
	tests := []struct {
		name     string
		extra    string
		answer   []float64
		fail     int
		want     float64
		fallback bool
	}{
		{"a share", ``, []float64{0.4}, 0, 0.4, false},
		{"first sample of several", ``, []float64{0.2, 0.9}, 0, 0.2, false},
		{"above 1", ``, []float64{3}, 0, 1, false},
		{"zero closes", ``, []float64{0}, 0, 0, false},
		{"negative closes", ``, []float64{-1}, 0, 0, false},
		{"no sample: default fallback 0", ``, nil, 0, 0, true},
		{"NaN: fallback", `,"fallback":0.6`, []float64{math.NaN()}, 0, 0.6, true},
		{"+Inf: fallback", `,"fallback":0.6`, []float64{math.Inf(1)}, 0, 0.6, true},
		{"-Inf: fallback", `,"fallback":"0.6"`, []float64{math.Inf(-1)}, 0, 0.6, true},
		{"server error: fallback", `,"fallback":0.25`, nil, http.StatusInternalServerError, 0.25, true},
		{"fallback above 1 is clamped", `,"fallback":1.5`, nil, 0, 1, true},
		{"fallback below 0 is clamped", `,"fallback":-2`, nil, 0, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fp.Clear()
			fp.Fail(tt.fail)
			if tt.answer != nil {
				fp.Set(query, tt.answer...)
			}
			g := mustBuild(t, `{"query":`+strconv.Quote(query)+`,"pool":"p","cache_ttl":"1ns"`+tt.extra+`}`,
				gate.Env{PrometheusURL: fp.URL()})
			b, err := gatetest.Query(t, g)
			var fb *gate.FallbackError
			if errors.As(err, &fb) != tt.fallback || (!tt.fallback && err != nil) {
				t.Fatalf("Budget = %v, %v; want fallback %v", b, err, tt.fallback)
			}
			if fb != nil {
				b = fb.Budget
			}
			if b != tt.want {
				t.Fatalf("budget %v, want %v", b, tt.want)
			}
			r := gate.ReadingsOf(g)
			if len(r) != 1 || r[0].Pool != "p" || r[0].Threshold != 0 || r[0].Available == tt.fallback {
				t.Fatalf("readings %+v", r)
			}
			if !tt.fallback && r[0].Value != tt.answer[0] {
				t.Fatalf("reading value %v, want the raw sample %v", r[0].Value, tt.answer[0])
			}
		})
	}
}

// TestFailurePolicyInstead: with failure_policy and no fallback, a failure
// is a plain error for the refresh loop's policy.
func TestFailurePolicyInstead(t *testing.T) {
	fp := fakeprom.Start(t)
	g := mustBuild(t, `{"query":"up","failure_policy":"keep-last"}`, gate.Env{PrometheusURL: fp.URL()})
	_, err := gatetest.Query(t, g)
	var fb *gate.FallbackError
	if err == nil || errors.As(err, &fb) || !errors.Is(err, promquery.ErrNoData) {
		t.Fatalf("err %v, want a plain ErrNoData", err)
	}
	if p := gate.PolicyOf(g); p != gate.FailKeepLast {
		t.Fatalf("policy %q", p)
	}
}

// TestReadingKeepsLastValue: a failed evaluation marks the reading
// unavailable and keeps the last value, as upstream's gauges.
func TestReadingKeepsLastValue(t *testing.T) {
	fp := fakeprom.Start(t)
	g := mustBuild(t, `{"query":"q","inference_pool":"pool-b","cache_ttl":"1ns"}`, gate.Env{PrometheusURL: fp.URL()})
	if r := gate.ReadingsOf(g); r != nil {
		t.Fatalf("readings before any evaluation: %+v", r)
	}
	fp.Set("q", 0.8)
	_, _ = gatetest.Query(t, g)
	fp.Clear()
	_, _ = gatetest.Query(t, g)
	r := gate.ReadingsOf(g)
	if len(r) != 1 || r[0].Available || !r[0].Read || r[0].Value != 0.8 || r[0].Pool != "pool-b" {
		t.Fatalf("readings %+v; want unavailable, keeping 0.8 of pool-b", r)
	}
}

func TestParams(t *testing.T) {
	env := gate.Env{PrometheusURL: "http://prom:9090", PrometheusCacheTTL: time.Second}
	tests := []struct {
		name, params string
		env          gate.Env
		wantErr      string
	}{
		{"query only", `{"query":"up"}`, env, ""},
		{"all", `{"query":"up","fallback":"0.5","pool":"p","cache_ttl":"2s","prometheus_url":"http://other:9090"}`, env, ""},
		{"own URL without a deployment one", `{"query":"up","prometheus_url":"http://other:9090"}`, gate.Env{}, ""},
		{"pool and alias agree", `{"query":"up","pool":"p","inference_pool":"p"}`, env, ""},
		{"no query", `{"pool":"p"}`, env, "gate_params.query is required"},
		{"empty query", `{"query":""}`, env, "gate_params.query is required"},
		{"no Prometheus URL", `{"query":"up"}`, gate.Env{}, "no Prometheus URL"},
		{"fallback not a number", `{"query":"up","fallback":"high"}`, env, `gate_params.fallback: "high" is not a number`},
		{"fallback and policy", `{"query":"up","fallback":0,"failure_policy":"open"}`, env, "not both"},
		{"pool and alias disagree", `{"query":"up","pool":"p","inference_pool":"q"}`, env, "disagree"},
		{"negative cache_ttl", `{"query":"up","cache_ttl":"-1s"}`, env, "gate_params.cache_ttl"},
		{"unknown param", `{"query":"up","threshold":0.5}`, env, "unknown gate_params: threshold"},
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

func TestDescribe(t *testing.T) {
	g := mustBuild(t, `{"query":"up","fallback":0.2}`, gate.Env{PrometheusURL: "http://prom:9090"})
	d := g.(gate.Describer).Describe()
	if !strings.Contains(d, "up ≤ 0") || !strings.Contains(d, "budget 0.2") {
		t.Fatalf("Describe = %q", d)
	}
}

func TestConformance(t *testing.T) {
	fp := fakeprom.Start(t)
	gatetest.Run(t, func(t testing.TB) gate.Gate {
		return mustBuild(t, `{"query":"q","cache_ttl":"10ms"}`, gate.Env{PrometheusURL: fp.URL()})
	}, gatetest.Features{
		Set: func(_ testing.TB, b float64) { fp.Set("q", b) },
		Failing: func(t testing.TB) gate.Gate {
			return mustBuild(t, `{"query":"q"}`, gate.Env{PrometheusURL: "http://127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))})
		},
		Hanging: func(t testing.TB) gate.Gate {
			hang := fakeprom.Start(t)
			hang.Hang()
			return mustBuild(t, `{"query":"q"}`, gate.Env{PrometheusURL: hang.URL()})
		},
	})
}
