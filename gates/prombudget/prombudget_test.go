package prombudget_test

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
	"github.com/sluice-io/sluice/gates/prombudget"
	"github.com/sluice-io/sluice/internal/testenv"
)

func TestMain(m *testing.M) {
	// The end-to-end test builds the whole app, whose Pub/Sub client imports
	// opencensus; its init starts a worker goroutine that never ends.
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"))
}

func build(t testing.TB, params string, env gate.Env) (gate.Gate, error) {
	t.Helper()
	r := gate.NewRegistry()
	if err := r.Register(prombudget.Type, prombudget.Factory); err != nil {
		t.Fatal(err)
	}
	return gatetest.Build(t, r, prombudget.Type, params, env)
}

func mustBuild(t testing.TB, params string) gate.Gate {
	t.Helper()
	g, err := build(t, params, gate.Env{})
	if err != nil {
		t.Fatalf("build %s: %v", params, err)
	}
	return g
}

func TestQueries(t *testing.T) {
	q := prombudget.Config{Pool: "p", MaxConcurrency: 100}.Queries()
	want := []string{
		`1 - sum(inference_extension_flow_control_queue_size{inference_pool="p"}) / (max(inference_pool_ready_pods{name="p"}) * 100)`,
		`1 - avg(inference_pool_per_pod_queue_size{name="p"}) / 100`,
		`1 - sum(vllm:num_requests_running{inference_pool="p"}) / (max(inference_pool_ready_pods{name="p"}) * 100)`,
	}
	for i := range want {
		if q[i] != want[i] {
			t.Errorf("query %d:\n got %s\nwant %s", i, q[i], want[i])
		}
	}
	ns := prombudget.Config{Pool: `we"ird`, Namespace: "ns", MaxConcurrency: 2.5}.Queries()
	if !strings.Contains(ns[0], `inference_pool="we\"ird",namespace="ns"`) || !strings.Contains(ns[1], "/ 2.5") {
		t.Errorf("namespace/quoting/MC: %s | %s", ns[0], ns[1])
	}
}

func TestFormula(t *testing.T) {
	fp := fakeprom.Start(t)
	qs := prombudget.Config{Pool: "p", MaxConcurrency: 100}.Queries()
	type answers [3][]float64
	tests := []struct {
		name     string
		params   string
		answers  answers
		want     float64
		wantErr  bool
		fallback bool
	}{
		{"flow-control queue", ``, answers{{0.6}, {0.1}, {0.1}}, 0.55, false, false},
		{"per-pod queue when the first is missing", ``, answers{nil, {0.7}, {0.1}}, 0.65, false, false},
		{"running requests last", ``, answers{nil, nil, {0.3}}, 0.25, false, false},
		{"NaN (no ready pod) falls through", ``, answers{{math.NaN()}, nil, {0.9}}, 0.85, false, false},
		{"at the baseline: closed", ``, answers{{0.05}}, 0, false, false},
		{"overloaded: closed", ``, answers{{-2}}, 0, false, false},
		{"baseline 0, idle", `"baseline":0`, answers{{1}}, 1, false, false},
		{"small budget stays positive", ``, answers{{0.051}}, 0.001, false, false},
		{"nothing answers: closed by policy", ``, answers{}, 0, true, false},
		{"nothing answers, fallback D", `"fallback":"0.5"`, answers{}, 0.45, true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fp.Clear()
			for i, a := range tt.answers {
				if a != nil {
					fp.Set(qs[i], a...)
				}
			}
			params := `{"inference_pool":"p","prometheus_url":"` + fp.URL() + `","cache_ttl":"1ns"`
			if tt.params != "" {
				params += "," + tt.params
			}
			b, err := gatetest.Query(t, mustBuild(t, params+"}"))
			var fb *gate.FallbackError
			if errors.As(err, &fb) != tt.fallback {
				t.Fatalf("err %v: fallback %v", err, tt.fallback)
			}
			if (err != nil) != tt.wantErr {
				t.Fatalf("Budget = %v, %v; want error %v", b, err, tt.wantErr)
			}
			if fb != nil {
				b = fb.Budget
			}
			if tt.wantErr && fb == nil {
				if !errors.Is(err, promquery.ErrNoData) {
					t.Fatalf("error %v, want ErrNoData", err)
				}
				return
			}
			if math.Abs(b-tt.want) > 1e-9 {
				t.Fatalf("budget %v, want %v", b, tt.want)
			}
		})
	}
}

func TestPrometheusError(t *testing.T) {
	fp := fakeprom.Start(t)
	fp.Fail(http.StatusInternalServerError)
	b, err := gatetest.Query(t, mustBuild(t, `{"inference_pool":"p","prometheus_url":"`+fp.URL()+`"}`))
	if err == nil || errors.Is(err, promquery.ErrNoData) {
		t.Fatalf("Budget = %v, %v; want a query error", b, err)
	}
	if n := fp.Queries(); n != 1 {
		t.Fatalf("%d queries after a server error, want 1 (no fall-through on errors)", n)
	}
	if p := gate.PolicyOf(mustBuild(t, `{"inference_pool":"p","prometheus_url":"`+fp.URL()+`"}`)); p != gate.FailClosed {
		t.Fatalf("default policy %q, want closed", p)
	}
}

func TestParams(t *testing.T) {
	env := gate.Env{PrometheusURL: "http://prom:9090", PrometheusCacheTTL: time.Second}
	tests := []struct{ name, params, wantErr string }{
		{"defaults", `{"inference_pool":"p"}`, ""},
		{"strings", `{"inference_pool":"p","max_concurrency":"50","baseline":"0.1","cache_ttl":"2s"}`, ""},
		{"keep-last", `{"inference_pool":"p","failure_policy":"keep-last"}`, ""},
		{"no pool", `{}`, "inference_pool is required"},
		{"zero mc", `{"inference_pool":"p","max_concurrency":0}`, "positive"},
		{"baseline 1", `{"inference_pool":"p","baseline":1}`, "outside [0,1)"},
		{"fallback and policy", `{"inference_pool":"p","fallback":0,"failure_policy":"open"}`, "not both"},
		{"unknown", `{"inference_pool":"p","threshold":0.8}`, "unknown gate_params: threshold"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := build(t, tt.params, env)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestConformance(t *testing.T) {
	fp := fakeprom.Start(t)
	q := prombudget.Config{Pool: "p", MaxConcurrency: 100}.Queries()[0]
	gatetest.Run(t, func(t testing.TB) gate.Gate {
		return mustBuild(t, `{"inference_pool":"p","baseline":0,"cache_ttl":"10ms","prometheus_url":"`+fp.URL()+`"}`)
	}, gatetest.Features{
		Set: func(_ testing.TB, b float64) { fp.Set(q, b) },
		Failing: func(t testing.TB) gate.Gate {
			return mustBuild(t, `{"inference_pool":"p","prometheus_url":"http://127.0.0.1:`+strconv.Itoa(testenv.FreePort(t))+`"}`)
		},
		Hanging: func(t testing.TB) gate.Gate {
			hang := fakeprom.Start(t)
			hang.Hang()
			return mustBuild(t, `{"inference_pool":"p","prometheus_url":"`+hang.URL()+`"}`)
		},
	})
}
