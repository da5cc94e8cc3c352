package composite_test

import (
	"context"
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"go.uber.org/goleak"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/gates/composite"
	"github.com/sluice-io/sluice/gates/constant"
	"github.com/sluice-io/sluice/gates/gatecheck"
	"github.com/sluice-io/sluice/gates/gatetest"
	"github.com/sluice-io/sluice/gates/internal/fakeprom"
	"github.com/sluice-io/sluice/gates/localconcurrency"
	"github.com/sluice-io/sluice/gates/promsaturation"
	"github.com/sluice-io/sluice/gates/redisbudget"
	"github.com/sluice-io/sluice/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// tenantGate is a per-request gate for tests: it rejects tenant "blocked".
type tenantGate struct{}

func (tenantGate) Budget(ctx context.Context) (float64, error) { return 1, ctx.Err() }

func (tenantGate) Admit(_ context.Context, r *wire.Request) (gate.Decision, error) {
	if r.Metadata["tenant"] == "blocked" {
		return gate.Decision{Verdict: gate.Reject, Reason: "tenant blocked"}, nil
	}
	return gate.Admitted, nil
}

func registry(t testing.TB) *gate.Registry {
	t.Helper()
	r := gate.NewRegistry()
	for typ, f := range map[string]gate.Factory{
		composite.Type: composite.Factory, constant.Type: constant.Factory,
		redisbudget.Type: redisbudget.Factory, promsaturation.Type: promsaturation.Factory,
		"tenant": func(p gate.Params, _ gate.Env) (gate.Gate, error) { return tenantGate{}, p.Unused() },
	} {
		if err := r.Register(typ, f); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

func build(t testing.TB, params string) (gate.Gate, error) {
	t.Helper()
	return gatetest.Build(t, registry(t), composite.Type, params, gate.Env{})
}

func mustBuild(t testing.TB, params string) gate.Gate {
	t.Helper()
	g, err := build(t, params)
	if err != nil {
		t.Fatalf("build %s: %v", params, err)
	}
	return g
}

func redisSpec(addr, extra string) string {
	return `{"gate_type":"redis","gate_params":{"address":"` + addr + `"` + extra + `}}`
}

func constSpec(b float64) string {
	return `{"gate_type":"constant","gate_params":{"budget":` + strconv.FormatFloat(b, 'g', -1, 64) + `}}`
}

func TestMinimum(t *testing.T) {
	mr := miniredis.RunT(t)
	fp := fakeprom.Start(t)
	sat := `inference_extension_flow_control_pool_saturation{inference_pool="p"}`
	g := mustBuild(t, `{"gates":[`+redisSpec(mr.Addr(), "")+`,`+constSpec(0.9)+`,
		{"gate_type":"prometheus-saturation","gate_params":{"inference_pool":"p","threshold":1,"cache_ttl":"1ns","prometheus_url":"`+fp.URL()+`"}}]}`)
	tests := []struct {
		redis string
		sat   float64
		want  float64
	}{{"1", 0, 0.9}, {"0.3", 0, 0.3}, {"1", 0.6, 0.4}, {"0", 0.6, 0}, {"0.7", 0.2, 0.7}}
	for _, tt := range tests {
		_ = mr.Set(redisbudget.DefaultBudgetKey, tt.redis)
		fp.Set(sat, tt.sat)
		b, err := gatetest.Query(t, g)
		if err != nil || math.Abs(b-tt.want) > 1e-9 {
			t.Errorf("redis %s, saturation %v: Budget = %v, %v; want %v", tt.redis, tt.sat, b, err, tt.want)
		}
	}
}

// TestInnerPolicies: a failing inner gate counts with its own policy, and
// the failure is reported as a FallbackError.
func TestInnerPolicies(t *testing.T) {
	down := "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
	tests := []struct {
		name  string
		extra string
		want  float64
	}{
		{"default closed", ``, 0},
		{"open", `,"failure_policy":"open"`, 0.6},
		{"keep-last with none yet", `,"failure_policy":"keep-last"`, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := mustBuild(t, `{"gates":[`+redisSpec(down, tt.extra)+`,`+constSpec(0.6)+`]}`)
			_, err := gatetest.Query(t, g)
			var fb *gate.FallbackError
			if !errors.As(err, &fb) {
				t.Fatalf("error %v, want a FallbackError", err)
			}
			if fb.Budget != tt.want {
				t.Fatalf("fallback budget %v, want %v", fb.Budget, tt.want)
			}
			if !strings.Contains(err.Error(), "gates[0] (redis)") {
				t.Errorf("error %q does not name the failing gate", err)
			}
		})
	}
	t.Run("keep-last after a good answer", func(t *testing.T) {
		mr := miniredis.RunT(t)
		_ = mr.Set(redisbudget.DefaultBudgetKey, "0.35")
		g := mustBuild(t, `{"gates":[`+redisSpec(mr.Addr(), `,"failure_policy":"keep-last"`)+`,`+constSpec(0.6)+`]}`)
		if b, err := gatetest.Query(t, g); err != nil || b != 0.35 {
			t.Fatalf("Budget = %v, %v", b, err)
		}
		mr.Close()
		_, err := gatetest.Query(t, g)
		var fb *gate.FallbackError
		if !errors.As(err, &fb) || fb.Budget != 0.35 {
			t.Fatalf("after the outage: %v, want fallback 0.35", err)
		}
	})
}

func TestParams(t *testing.T) {
	tests := []struct{ name, params, wantErr string }{
		{"no gates", `{}`, "gates is required"},
		{"empty list", `{"gates":[]}`, "at least one"},
		{"not a list", `{"gates":{"gate_type":"constant"}}`, "gate_params.gates"},
		{"unknown spec field", `{"gates":[{"gate_type":"constant","params":{}}]}`, "unknown field"},
		{"no type", `{"gates":[{"gate_params":{}}]}`, "gate_type is required"},
		{"unknown type", `{"gates":[{"gate_type":"nope"}]}`, `unknown gate type "nope"`},
		{"inner param error", `{"gates":[{"gate_type":"constant","gate_params":{"budget":2}}]}`, "gates[0]"},
		{"inner unknown param", `{"gates":[{"gate_type":"constant","gate_params":{"budgte":1}}]}`, "unknown gate_params: budgte"},
		{"policy on the composite", `{"gates":[` + constSpec(1) + `],"failure_policy":"open"}`, "set it on the inner gates"},
		{"unknown param", `{"gates":[` + constSpec(1) + `],"mode":"min"}`, "unknown gate_params: mode"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := build(t, tt.params)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestIntervalDescribeNested(t *testing.T) {
	mr := miniredis.RunT(t)
	_ = mr.Set(redisbudget.DefaultBudgetKey, "0.5")
	g := mustBuild(t, `{"gates":[`+redisSpec(mr.Addr(), `,"refresh_interval":"30ms"`)+`,
		{"gate_type":"composite","gate_params":{"gates":[`+constSpec(0.8)+`,`+constSpec(0.2)+`]}}]}`)
	if iv := gate.IntervalOf(g); iv != 30*time.Millisecond {
		t.Errorf("interval %v, want the shortest inner one, 30ms", iv)
	}
	if b, err := gatetest.Query(t, g); err != nil || b != 0.2 {
		t.Errorf("nested Budget = %v, %v; want 0.2", b, err)
	}
	d := g.(gate.Describer).Describe()
	for _, want := range []string{"min", "gates[0] (redis)", "gates[1] (composite)", "on failure closed"} {
		if !strings.Contains(d, want) {
			t.Errorf("Describe = %q, want %q in it", d, want)
		}
	}
}

func TestAdmit(t *testing.T) {
	plain := mustBuild(t, `{"gates":[`+constSpec(1)+`]}`)
	if _, ok := plain.(gate.Admitter); ok {
		t.Error("a composite without per-request gates should not be an Admitter (no per-message cost)")
	}
	g := mustBuild(t, `{"gates":[`+constSpec(1)+`,{"gate_type":"tenant"}]}`)
	a, ok := g.(gate.Admitter)
	if !ok {
		t.Fatal("composite with a per-request gate is not an Admitter")
	}
	for tenant, want := range map[string]gate.Verdict{"ok": gate.Admit, "blocked": gate.Reject} {
		d, err := a.Admit(context.Background(), &wire.Request{ID: "x", Metadata: map[string]string{"tenant": tenant}})
		if err != nil || d.Verdict != want {
			t.Errorf("tenant %s: %v, %v; want %v", tenant, d, err, want)
		}
	}
}

func TestConformance(t *testing.T) {
	mr := miniredis.RunT(t)
	gatetest.Run(t, func(t testing.TB) gate.Gate {
		return mustBuild(t, `{"gates":[`+redisSpec(mr.Addr(), `,"budget_key":"conf"`)+`,`+constSpec(1)+`]}`)
	}, gatetest.Features{
		Set: func(t testing.TB, b float64) {
			if err := mr.Set("conf", strconv.FormatFloat(b, 'g', -1, 64)); err != nil {
				t.Fatal(err)
			}
		},
		Failing: func(t testing.TB) gate.Gate {
			return mustBuild(t, `{"gates":[`+redisSpec("127.0.0.1:"+strconv.Itoa(testenv.FreePort(t)), "")+`]}`)
		},
	})
}

// chainFixture is a registry with two scripted per-request gates and a
// local concurrency cap, for the per-request chain.
type chainFixture struct {
	reg  *gate.Registry
	a, b *gatetest.Ledger
}

func newChainFixture(t testing.TB) *chainFixture {
	t.Helper()
	f := &chainFixture{reg: registry(t), a: gatetest.NewLedger(), b: gatetest.NewLedger()}
	for typ, fac := range map[string]gate.Factory{
		"a": f.a.Factory(), "b": f.b.Factory(), localconcurrency.Type: localconcurrency.Factory,
	} {
		if err := f.reg.Register(typ, fac); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

func (f *chainFixture) build(t testing.TB, params string) gate.Admitter {
	t.Helper()
	g, err := gatetest.Build(t, f.reg, composite.Type, params, gate.Env{})
	if err != nil {
		t.Fatalf("build %s: %v", params, err)
	}
	a, ok := g.(gate.Admitter)
	if !ok {
		t.Fatalf("%T is not an Admitter", g)
	}
	return a
}

// TestChain: the per-request gates are asked in order under gate.Chain:
// the first decision other than Admit (or error) decides and what earlier
// members reserved is given back; all admitting, one Release gives back
// every reservation, once.
func TestChain(t *testing.T) {
	f := newChainFixture(t)
	g := f.build(t, `{"gates":[{"gate_type":"a"},`+constSpec(1)+`,{"gate_type":"b"}]}`)
	req := &wire.Request{ID: "x", Deadline: time.Now().Add(time.Minute)}

	d, err := g.Admit(context.Background(), req)
	if err != nil || d.Verdict != gate.Admit || d.Release == nil || f.a.Held() != 1 || f.b.Held() != 1 {
		t.Fatalf("both admit: %+v, %v (held %d, %d)", d, err, f.a.Held(), f.b.Held())
	}
	d.Release()
	d.Release()
	if f.a.Held() != 0 || f.b.Held() != 0 || f.a.ExtraReleases()+f.b.ExtraReleases() != 0 {
		t.Fatalf("after the joint release (twice): held %d, %d; extra %d, %d",
			f.a.Held(), f.b.Held(), f.a.ExtraReleases(), f.b.ExtraReleases())
	}

	res := &wire.Result{Payload: "no"}
	f.b.SetResult(res)
	boom := errors.New("boom")
	for _, c := range []struct {
		v   gate.Verdict
		err error
	}{{gate.Defer, nil}, {gate.Wait, nil}, {gate.Reject, nil}, {gate.Admit, boom}} {
		f.b.Set(c.v, time.Second, "b says", c.err)
		d, err := g.Admit(context.Background(), req)
		if !errors.Is(err, c.err) || (c.err == nil && (d.Verdict != c.v || d.Reason != "b says" || d.Delay != time.Second)) {
			t.Fatalf("b %v/%v: %+v, %v; want b's answer as it is", c.v, c.err, d, err)
		}
		if c.v == gate.Reject && d.Result != res {
			t.Fatalf("b's Reject lost its result: %+v", d)
		}
		if d.Release != nil || f.a.Held() != 0 {
			t.Fatalf("b %v: a still holds %d, decision release %v; want all given back", c.v, f.a.Held(), d.Release != nil)
		}
	}
	if f.a.Acquired() != 5 || f.a.ExtraReleases() != 0 {
		t.Fatalf("a: acquired %d, extra releases %d; want 5, 0", f.a.Acquired(), f.a.ExtraReleases())
	}

	// The first member refusing: the later ones are not asked.
	f.b.Set(gate.Admit, 0, "", nil)
	f.a.Set(gate.Defer, 0, "", nil)
	asked := f.b.Asked()
	if d, _ := g.Admit(context.Background(), req); d.Verdict != gate.Defer || f.b.Asked() != asked {
		t.Fatalf("a defers: %v, b asked %d more times", d.Verdict, f.b.Asked()-asked)
	}
}

// TestChainLeavesBudgetGatesToCredits: members without a per-request
// decision are not asked per request (they act through the budget), and a
// composite without such members is no Admitter at all.
func TestChainLeavesBudgetGatesToCredits(t *testing.T) {
	f := newChainFixture(t)
	g := f.build(t, `{"gates":[`+constSpec(0)+`,{"gate_type":"a"}]}`)
	if b, _ := gatetest.Query(t, g.(gate.Gate)); b != 0 {
		t.Fatalf("budget %v, want 0 (the closed constant)", b)
	}
	d, err := g.Admit(context.Background(), &wire.Request{ID: "x"})
	if err != nil || d.Verdict != gate.Admit {
		t.Fatalf("Admit = %+v, %v; want Admit (the closed budget acts through credits)", d, err)
	}
	d.Release()
}

// TestNestingForms: composites nest to any depth with gates as an array or
// a JSON string at every level, and the inner per-request gates chain.
func TestNestingForms(t *testing.T) {
	f := newChainFixture(t)
	lmc := `{"gate_type":"local-max-concurrency","gate_params":{"limit":2}}`
	level3 := `{"gate_type":"composite","gate_params":{"gates":[` + constSpec(0.4) + `,` + lmc + `]}}`
	level2 := `{"gate_type":"composite","gate_params":{"gates":` + strconv.Quote(`[`+constSpec(0.9)+`,`+level3+`]`) + `}}`
	forms := map[string]string{
		"array of string of array":  `{"gates":[` + level2 + `,{"gate_type":"a"}]}`,
		"string of string of array": `{"gates":` + strconv.Quote(`[`+level2+`,{"gate_type":"a"}]`) + `}`,
	}
	for name, params := range forms {
		t.Run(name, func(t *testing.T) {
			g := f.build(t, params)
			if b, err := gatetest.Query(t, g.(gate.Gate)); b != 0.4 || err != nil {
				t.Fatalf("budget %v, %v; want the deepest 0.4", b, err)
			}
			req := &wire.Request{ID: "x"}
			var held []gate.Decision
			for i, want := range []gate.Verdict{gate.Admit, gate.Admit, gate.Defer} {
				d, err := g.Admit(context.Background(), req)
				if err != nil || d.Verdict != want {
					t.Fatalf("admission %d: %+v, %v; want %v", i, d, err, want)
				}
				held = append(held, d)
			}
			if f.a.Held() != 2 {
				t.Fatalf("a holds %d, want 2 (the deferred request gave its slot back)", f.a.Held())
			}
			gatecheck.ReleaseAll(t, held)
			if f.a.Held() != 0 {
				t.Fatalf("a holds %d after every release", f.a.Held())
			}
			if b, _ := gatetest.Query(t, g.(gate.Gate)); b != 0.4 {
				t.Fatalf("budget %v after every release", b)
			}
		})
	}
}

func TestConformanceChain(t *testing.T) {
	f := newChainFixture(t)
	gatetest.Run(t, func(t testing.TB) gate.Gate {
		return f.build(t, `{"gates":[{"gate_type":"a"},{"gate_type":"local-max-concurrency","gate_params":{"limit":3}},{"gate_type":"b"}]}`).(gate.Gate)
	}, gatetest.Features{Admissions: 5})
	if f.a.Held() != 0 || f.b.Held() != 0 || f.a.ExtraReleases()+f.b.ExtraReleases() != 0 {
		t.Fatalf("after the suite: held %d, %d; extra releases %d, %d",
			f.a.Held(), f.b.Held(), f.a.ExtraReleases(), f.b.ExtraReleases())
	}
}
