package waitonrefuse_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/gates/composite"
	"github.com/sluice-io/sluice/gates/constant"
	"github.com/sluice-io/sluice/gates/gatecheck"
	"github.com/sluice-io/sluice/gates/gatetest"
	"github.com/sluice-io/sluice/gates/localconcurrency"
	"github.com/sluice-io/sluice/gates/waitonrefuse"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// meter is a budget-only gate that reads a metric and holds a resource.
type meter struct{ closed atomic.Int32 }

func (m *meter) Budget(ctx context.Context) (float64, error) { return 0.5, ctx.Err() }
func (m *meter) Readings() []gate.Reading {
	return []gate.Reading{{Pool: "p", Value: 0.7, Threshold: 0.2, Read: true, Available: true}}
}
func (m *meter) Close() error { m.closed.Add(1); return nil }

type fixture struct {
	reg    *gate.Registry
	ledger *gatetest.Ledger
	meter  *meter
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	f := &fixture{reg: gate.NewRegistry(), ledger: gatetest.NewLedger(), meter: &meter{}}
	for typ, fac := range map[string]gate.Factory{
		waitonrefuse.Type: waitonrefuse.Factory, localconcurrency.Type: localconcurrency.Factory,
		constant.Type: constant.Factory, composite.Type: composite.Factory,
		"ledger": f.ledger.Factory(),
		"meter":  func(p gate.Params, _ gate.Env) (gate.Gate, error) { return f.meter, p.Unused() },
	} {
		if err := f.reg.Register(typ, fac); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

func (f *fixture) build(t testing.TB, params string) (gate.Gate, error) {
	t.Helper()
	return gatetest.Build(t, f.reg, waitonrefuse.Type, params, gate.Env{})
}

func (f *fixture) mustBuild(t testing.TB, params string) gate.Admitter {
	t.Helper()
	g, err := f.build(t, params)
	if err != nil {
		t.Fatalf("build %s: %v", params, err)
	}
	return g.(gate.Admitter)
}

func admit(t testing.TB, a gate.Admitter) (gate.Decision, error) {
	t.Helper()
	d, err := a.Admit(context.Background(), &wire.Request{ID: "r", Deadline: time.Now().Add(time.Minute)})
	if cerr := gatecheck.CheckDecision(d); cerr != nil {
		t.Errorf("decision %+v: %v", d, cerr)
	}
	return d, err
}

func TestParams(t *testing.T) {
	tests := []struct{ name, params, wantErr string }{
		{"object", `{"gate":{"gate_type":"local-max-concurrency","gate_params":{"limit":2}}}`, ""},
		{"JSON string", `{"gate":"{\"gate_type\":\"local-max-concurrency\",\"gate_params\":{\"limit\":2}}"}`, ""},
		{"no params", `{"gate":{"gate_type":"constant"}}`, ""},
		{"missing", `{}`, "gate_params.gate is required"},
		{"null", `{"gate":null}`, "gate_params.gate is required"},
		{"not an object", `{"gate":5}`, "gate_params.gate: want an object"},
		{"plain string", `{"gate":"local-max-concurrency"}`, "gate_params.gate: want an object"},
		{"bad JSON string", `{"gate":"{\"gate_type\":"}`, "gate_params.gate"},
		{"array", `{"gate":[{"gate_type":"constant"}]}`, "gate_params.gate"},
		{"no type", `{"gate":{"gate_params":{}}}`, "gate_params.gate: gate_type is required"},
		{"unknown spec field", `{"gate":{"gate_type":"constant","params":{}}}`, "unknown field"},
		{"unknown inner type", `{"gate":{"gate_type":"nope"}}`, `gate_params.gate: unknown gate type "nope"`},
		{"inner param error", `{"gate":{"gate_type":"local-max-concurrency"}}`, "gate_params.gate: gate local-max-concurrency: gate_params.limit is required"},
		{"unknown param", `{"gate":{"gate_type":"constant"},"mode":"x"}`, "unknown gate_params: mode"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := newFixture(t).build(t, tt.params)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

// TestVerdicts: Defer becomes Wait (its delay and reason kept); an error is
// wrapped; everything else passes through, Release and Result included.
func TestVerdicts(t *testing.T) {
	f := newFixture(t)
	g := f.mustBuild(t, `{"gate":{"gate_type":"ledger"}}`)
	l := f.ledger

	d, err := admit(t, g)
	if err != nil || d.Verdict != gate.Admit || d.Release == nil || l.Held() != 1 {
		t.Fatalf("inner Admit: %+v, %v (held %d); want Admit with the inner Release", d, err, l.Held())
	}
	d.Release()
	d.Release() // a second call must not reach the inner gate
	if l.Held() != 0 || l.ExtraReleases() != 0 {
		t.Fatalf("after the release (called twice): held %d, extra %d", l.Held(), l.ExtraReleases())
	}

	l.Set(gate.Defer, 3*time.Second, "quota", nil)
	if d, err := admit(t, g); err != nil || d.Verdict != gate.Wait || d.Delay != 3*time.Second || d.Reason != "quota" {
		t.Fatalf("inner Defer: %+v, %v; want Wait, 3s, quota", d, err)
	}
	l.Set(gate.Defer, 0, "", nil)
	if d, _ := admit(t, g); d.Verdict != gate.Wait || !strings.Contains(d.Reason, "ledger refused") {
		t.Fatalf("inner Defer without a reason: %+v", d)
	}

	res := &wire.Result{Payload: "custom"}
	l.SetResult(res)
	l.Set(gate.Reject, 0, "banned", nil)
	if d, err := admit(t, g); err != nil || d.Verdict != gate.Reject || d.Result != res || d.Reason != "banned" {
		t.Fatalf("inner Reject: %+v, %v; want it unchanged", d, err)
	}
	l.Set(gate.Wait, time.Second, "w", nil)
	if d, err := admit(t, g); err != nil || d.Verdict != gate.Wait || d.Delay != time.Second {
		t.Fatalf("inner Wait: %+v, %v; want it unchanged", d, err)
	}

	boom := errors.New("boom")
	l.Set(gate.Admit, 0, "", boom)
	if d, err := admit(t, g); !errors.Is(err, boom) || !strings.Contains(err.Error(), "wait-on-refuse") || d.Release != nil {
		t.Fatalf("inner error: %+v, %v; want the error wrapped, nothing held", d, err)
	}
	if l.Held() != 0 {
		t.Fatalf("%d reservations held", l.Held())
	}
}

// TestNothingLeaks: an inner gate that breaks the contract (a Release with
// a refusal or an error) still gets it back, exactly once.
func TestNothingLeaks(t *testing.T) {
	f := newFixture(t)
	g := f.mustBuild(t, `{"gate":{"gate_type":"ledger"}}`)
	f.ledger.Leaky(true)
	for _, c := range []struct {
		v   gate.Verdict
		err error
	}{{gate.Defer, nil}, {gate.Admit, errors.New("x")}, {gate.Defer, errors.New("y")}} {
		f.ledger.Set(c.v, 0, "", c.err)
		d, _ := admit(t, g)
		if d.Release != nil {
			t.Fatalf("inner %v/%v: the decision carries a Release", c.v, c.err)
		}
	}
	if f.ledger.Acquired() != 3 || f.ledger.Held() != 0 || f.ledger.ExtraReleases() != 0 {
		t.Fatalf("acquired %d, held %d, extra releases %d; want 3, 0, 0",
			f.ledger.Acquired(), f.ledger.Held(), f.ledger.ExtraReleases())
	}
}

// TestAroundLocalConcurrency: upstream's typical pool gate. Full, it waits
// instead of deferring; a release lets the next one in; the budget is the
// inner gate's.
func TestAroundLocalConcurrency(t *testing.T) {
	f := newFixture(t)
	g := f.mustBuild(t, `{"gate":{"gate_type":"local-max-concurrency","gate_params":{"limit":2}}}`)
	a, _ := admit(t, g)
	b, _ := admit(t, g)
	if a.Verdict != gate.Admit || b.Verdict != gate.Admit {
		t.Fatalf("%v, %v; want two admissions", a.Verdict, b.Verdict)
	}
	if d, _ := admit(t, g); d.Verdict != gate.Wait {
		t.Fatalf("full: %v, want wait", d.Verdict)
	}
	if v, err := gatetest.Query(t, g.(gate.Gate)); v != 0 || err != nil {
		t.Fatalf("full: budget %v, %v; want 0", v, err)
	}
	a.Release()
	if v, _ := gatetest.Query(t, g.(gate.Gate)); v != 1 {
		t.Fatalf("one free: budget %v, want 1 (the inner gate is open)", v)
	}
	c, _ := admit(t, g)
	if c.Verdict != gate.Admit {
		t.Fatalf("after a release: %v, want admit", c.Verdict)
	}
	gatecheck.ReleaseAll(t, []gate.Decision{b, c})
}

// TestBudgetOnlyInner: a gate without its own Admit refuses while its budget
// is 0 (gate.BudgetAdmitter), which becomes Wait.
func TestBudgetOnlyInner(t *testing.T) {
	f := newFixture(t)
	if d, _ := admit(t, f.mustBuild(t, `{"gate":{"gate_type":"constant","gate_params":{"budget":0}}}`)); d.Verdict != gate.Wait {
		t.Fatalf("closed inner: %v, want wait", d.Verdict)
	}
	if d, _ := admit(t, f.mustBuild(t, `{"gate":{"gate_type":"constant","gate_params":{"budget":0.1}}}`)); d.Verdict != gate.Admit || d.Release != nil {
		t.Fatalf("open inner: %+v, want admit holding nothing", d)
	}
}

// TestNesting: the inner gate may itself be a composite or another
// wait-on-refuse, in either form, to any depth; budgets, readings, the
// chain and Close go through.
func TestNesting(t *testing.T) {
	f := newFixture(t)
	inner := `{\"gate_type\":\"composite\",\"gate_params\":{\"gates\":\"[{\\\"gate_type\\\":\\\"meter\\\"},{\\\"gate_type\\\":\\\"local-max-concurrency\\\",\\\"gate_params\\\":{\\\"limit\\\":1}}]\"}}`
	g := f.mustBuild(t, `{"gate":{"gate_type":"wait-on-refuse","gate_params":{"gate":"`+inner+`"}}}`)
	if v, err := gatetest.Query(t, g.(gate.Gate)); v != 0.5 || err != nil {
		t.Fatalf("budget %v, %v; want min(0.5, 1)", v, err)
	}
	d, _ := admit(t, g)
	if d.Verdict != gate.Admit {
		t.Fatalf("first: %v, want admit", d.Verdict)
	}
	if w, _ := admit(t, g); w.Verdict != gate.Wait {
		t.Fatalf("second (limit 1): %v, want wait", w.Verdict)
	}
	d.Release()
	if r := gate.ReadingsOf(g.(gate.Gate)); len(r) != 1 || r[0].Pool != "p" || r[0].Value != 0.7 {
		t.Fatalf("readings through two wrappers and a composite: %+v", r)
	}
	if err := g.(interface{ Close() error }).Close(); err != nil {
		t.Fatal(err)
	}
	if f.meter.closed.Load() != 1 {
		t.Fatalf("inner gate closed %d times, want 1", f.meter.closed.Load())
	}
	if !strings.Contains(g.(gate.Describer).Describe(), "waits (instead of deferring)") {
		t.Errorf("Describe = %q", g.(gate.Describer).Describe())
	}
}

func TestConformance(t *testing.T) {
	f := newFixture(t)
	gatetest.Run(t, func(t testing.TB) gate.Gate {
		g, err := f.build(t, `{"gate":{"gate_type":"local-max-concurrency","gate_params":{"limit":3}}}`)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}, gatetest.Features{Admissions: 5})
}
