package promsaturation_test

import (
	"context"
	"errors"
	"math"
	"strconv"
	"strings"
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

const query = `inference_extension_flow_control_pool_saturation{inference_pool="p"}`

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
	fp.Set(`inference_extension_flow_control_pool_saturation{inference_pool="p",namespace="team-a"}`, 0.1)
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
// endpoint; the budget follows the saturation the endpoint reports, and a
// metric that disappears makes the gate fall back (open, at the threshold).
func TestRealPrometheus(t *testing.T) {
	epp := testenv.StartGauges(t)
	epp.Set(promsaturation.Metric, 0.1, "inference_pool", "p")
	prom := testenv.StartPrometheus(t, []string{epp.URL()}, 500*time.Millisecond)
	g := mustBuild(t, `{"inference_pool":"p","threshold":0.8,"cache_ttl":"100ms","prometheus_url":"`+prom.URL+`"}`)
	r := gate.NewRefresher(g, gate.RefresherConfig{Name: "sat", Interval: 50 * time.Millisecond})
	r.Start(context.Background())
	defer r.Close()
	steps := []struct {
		sat  float64 // -1: metric removed
		want float64
	}{{0.1, 0.7}, {0.5, 0.3}, {0.95, 0}, {0.2, 0.6}, {-1, 0.8}}
	for _, s := range steps {
		if s.sat < 0 {
			epp.Delete(promsaturation.Metric, "inference_pool", "p")
		} else {
			epp.Set(promsaturation.Metric, s.sat, "inference_pool", "p")
		}
		deadline := time.Now().Add(10 * time.Second)
		for math.Abs(r.Budget()-s.want) > 1e-6 {
			if time.Now().After(deadline) {
				t.Fatalf("saturation %v: budget %v, want %v", s.sat, r.Budget(), s.want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}
