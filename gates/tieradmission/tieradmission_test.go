package tieradmission_test

import (
	"context"
	"errors"
	"strings"
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
	"github.com/sluice-io/sluice/gates/tieradmission"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type fixture struct {
	reg    *gate.Registry
	ledger *gatetest.Ledger
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	f := &fixture{reg: gate.NewRegistry(), ledger: gatetest.NewLedger()}
	for typ, fac := range map[string]gate.Factory{
		tieradmission.Type: tieradmission.Factory, localconcurrency.Type: localconcurrency.Factory,
		constant.Type: constant.Factory, composite.Type: composite.Factory, "ledger": f.ledger.Factory(),
	} {
		if err := f.reg.Register(typ, fac); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

func (f *fixture) build(t testing.TB, params string) (gate.Gate, error) {
	t.Helper()
	return gatetest.Build(t, f.reg, tieradmission.Type, params, gate.Env{})
}

func (f *fixture) mustBuild(t testing.TB, params string) gate.Admitter {
	t.Helper()
	g, err := f.build(t, params)
	if err != nil {
		t.Fatalf("build %s: %v", params, err)
	}
	return g.(gate.Admitter)
}

// request returns a request with the given labels (name, value pairs).
func request(labels ...string) *wire.Request {
	r := &wire.Request{ID: "req-7", Deadline: time.Now().Add(time.Minute)}
	for i := 0; i+1 < len(labels); i += 2 {
		r.SetLabel(labels[i], labels[i+1])
	}
	return r
}

func admit(t testing.TB, a gate.Admitter, r *wire.Request) (gate.Decision, error) {
	t.Helper()
	d, err := a.Admit(context.Background(), r)
	if cerr := gatecheck.CheckDecision(d); cerr != nil {
		t.Errorf("decision %+v: %v", d, cerr)
	}
	return d, err
}

func TestParams(t *testing.T) {
	tests := []struct{ name, params, wantErr string }{
		{"type only", `{"saturation_gate":"constant"}`, ""},
		{"params object", `{"saturation_gate":"constant","saturation_gate_params":{"budget":0.5}}`, ""},
		{"params JSON string", `{"saturation_gate":"constant","saturation_gate_params":"{\"budget\":0.5}"}`, ""},
		{"tier label", `{"saturation_gate":"constant","tier_label":"class"}`, ""},
		{"missing type", `{"saturation_gate_params":{"budget":0.5}}`, "gate_params.saturation_gate is required"},
		{"unknown type", `{"saturation_gate":"nope"}`, `gate_params.saturation_gate: unknown gate type "nope"`},
		{"params not an object", `{"saturation_gate":"constant","saturation_gate_params":"budget=1"}`, "gate_params.saturation_gate_params: want an object"},
		{"params an array", `{"saturation_gate":"constant","saturation_gate_params":[1]}`, "gate_params.saturation_gate_params: want an object"},
		{"params bad JSON", `{"saturation_gate":"constant","saturation_gate_params":"{\"budget\":"}`, "gate_params.saturation_gate_params"},
		{"inner param error", `{"saturation_gate":"constant","saturation_gate_params":{"budget":2}}`, "gate_params.saturation_gate: gate constant: budget 2 outside [0,1]"},
		{"inner unknown param", `{"saturation_gate":"constant","saturation_gate_params":{"budgte":1}}`, "unknown gate_params: budgte"},
		{"unknown param", `{"saturation_gate":"constant","tier":"x"}`, "unknown gate_params: tier"},
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

// TestSaturated: upstream's table of decisions while the saturation gate
// refuses, by classification and tier.
func TestSaturated(t *testing.T) {
	f := newFixture(t)
	g := f.mustBuild(t, `{"saturation_gate":"ledger"}`)
	f.ledger.Set(gate.Defer, 2*time.Second, "saturated pool", nil)
	tests := []struct {
		name   string
		labels []string
		want   gate.Verdict
	}{
		{"reserved interactive waits", []string{"classification", "reserved", "tier", "interactive"}, gate.Wait},
		{"reserved batch waits", []string{"classification", "reserved", "tier", "batch"}, gate.Wait},
		{"reserved without tier waits", []string{"classification", "reserved"}, gate.Wait},
		{"overflow interactive is rejected", []string{"classification", "overflow", "tier", "interactive"}, gate.Reject},
		{"overflow async defers", []string{"classification", "overflow", "tier", "async"}, gate.Defer},
		{"overflow batch defers", []string{"classification", "overflow", "tier", "batch"}, gate.Defer},
		{"overflow without tier defers", []string{"classification", "overflow"}, gate.Defer},
		{"unclassified interactive defers", []string{"tier", "interactive"}, gate.Defer},
		{"nothing defers", nil, gate.Defer},
		{"tier case matters", []string{"classification", "overflow", "tier", "Interactive"}, gate.Defer},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := admit(t, g, request(tt.labels...))
			if err != nil || d.Verdict != tt.want {
				t.Fatalf("%+v, %v; want %v", d, err, tt.want)
			}
			switch d.Verdict {
			case gate.Reject:
				if d.Result == nil || d.Result.Payload != `{"error": "Too Many Requests", "code": 429}` ||
					d.Result.StatusCode != 0 || d.Result.ErrorCode != wire.CodeNone || d.Result.ErrorMessage != "" || d.Result.ID != "req-7" {
					t.Fatalf("reject result %+v; want upstream's 429 payload, no status or error code", d.Result)
				}
			case gate.Wait, gate.Defer:
				if d.Delay != 2*time.Second {
					t.Fatalf("delay %v, want the saturation gate's 2s", d.Delay)
				}
			}
		})
	}
}

// TestTierLabel: tier_label names the label holding the tier.
func TestTierLabel(t *testing.T) {
	f := newFixture(t)
	g := f.mustBuild(t, `{"saturation_gate":"ledger","tier_label":"priority"}`)
	f.ledger.Set(gate.Defer, 0, "", nil)
	if d, _ := admit(t, g, request("classification", "overflow", "priority", "interactive")); d.Verdict != gate.Reject {
		t.Fatalf("interactive in the configured label: %v, want reject", d.Verdict)
	}
	if d, _ := admit(t, g, request("classification", "overflow", "tier", "interactive")); d.Verdict != gate.Defer {
		t.Fatalf("interactive in the default label only: %v, want defer", d.Verdict)
	}
}

// TestRoom: any inner verdict but Defer admits, carrying the inner
// reservation; an inner error is "saturation gate failed".
func TestRoom(t *testing.T) {
	f := newFixture(t)
	g := f.mustBuild(t, `{"saturation_gate":"ledger"}`)
	r := request("classification", "overflow", "tier", "interactive")
	d, err := admit(t, g, r)
	if err != nil || d.Verdict != gate.Admit || d.Release == nil || f.ledger.Held() != 1 {
		t.Fatalf("inner Admit: %+v, %v, held %d; want Admit carrying the inner Release", d, err, f.ledger.Held())
	}
	d.Release()
	for _, v := range []gate.Verdict{gate.Wait, gate.Reject} {
		f.ledger.Set(v, time.Second, "x", nil)
		if d, err := admit(t, g, r); err != nil || d.Verdict != gate.Admit {
			t.Fatalf("inner %v: %+v, %v; want admit (upstream)", v, d, err)
		}
	}
	boom := errors.New("prometheus down")
	f.ledger.Set(gate.Admit, 0, "", boom)
	d, err = admit(t, g, r)
	if !errors.Is(err, boom) || !strings.HasPrefix(err.Error(), "saturation gate failed: ") {
		t.Fatalf("inner error: %+v, %v; want \"saturation gate failed: …\"", d, err)
	}
	if f.ledger.Held() != 0 || f.ledger.ExtraReleases() != 0 {
		t.Fatalf("held %d, extra releases %d", f.ledger.Held(), f.ledger.ExtraReleases())
	}
}

// TestNothingLeaks: an inner gate breaking the contract (a Release with a
// refusal, an error, a Wait or a Reject) loses nothing and gives back
// nothing twice: a refusal's reservation is given back at once, an inner
// Wait's or Reject's goes with the admission.
func TestNothingLeaks(t *testing.T) {
	f := newFixture(t)
	g := f.mustBuild(t, `{"saturation_gate":"ledger"}`)
	f.ledger.Leaky(true)
	var held []gate.Decision
	for _, c := range []struct {
		v   gate.Verdict
		err error
	}{{gate.Defer, nil}, {gate.Wait, nil}, {gate.Reject, nil}, {gate.Admit, errors.New("x")}} {
		for _, labels := range [][]string{{"classification", "reserved"}, {"classification", "overflow", "tier", "interactive"}, nil} {
			f.ledger.Set(c.v, 0, "", c.err)
			d, _ := admit(t, g, request(labels...))
			held = append(held, d)
		}
	}
	gatecheck.ReleaseAll(t, held)
	if f.ledger.Acquired() != 12 || f.ledger.Held() != 0 || f.ledger.ExtraReleases() != 0 {
		t.Fatalf("acquired %d, held %d, extra releases %d; want 12, 0, 0",
			f.ledger.Acquired(), f.ledger.Held(), f.ledger.ExtraReleases())
	}
}

// TestBudgetOnlySaturationGate: upstream's usual inner gate reports only a
// budget; it refuses while that is 0 (gate.BudgetAdmitter). The budget is
// the inner gate's.
func TestBudgetOnlySaturationGate(t *testing.T) {
	f := newFixture(t)
	closed := f.mustBuild(t, `{"saturation_gate":"constant","saturation_gate_params":"{\"budget\":0}"}`)
	if d, _ := admit(t, closed, request("classification", "reserved")); d.Verdict != gate.Wait {
		t.Fatalf("closed, reserved: %v, want wait", d.Verdict)
	}
	open := f.mustBuild(t, `{"saturation_gate":"constant","saturation_gate_params":{"budget":0.3}}`)
	if v, err := gatetest.Query(t, open.(gate.Gate)); v != 0.3 || err != nil {
		t.Fatalf("budget %v, %v; want the inner 0.3", v, err)
	}
	if d, _ := admit(t, open, request("classification", "overflow", "tier", "interactive")); d.Verdict != gate.Admit {
		t.Fatalf("open: %v, want admit", d.Verdict)
	}
}

// TestNestedComposite: the saturation gate may be a composite (its params a
// JSON string holding a JSON-string gate list); a local-max-concurrency
// member's slot travels with the admission and comes back on release.
func TestNestedComposite(t *testing.T) {
	f := newFixture(t)
	g := f.mustBuild(t, `{"saturation_gate":"composite","saturation_gate_params":
		"{\"gates\":\"[{\\\"gate_type\\\":\\\"constant\\\"},{\\\"gate_type\\\":\\\"local-max-concurrency\\\",\\\"gate_params\\\":{\\\"limit\\\":1}}]\"}"}`)
	d, _ := admit(t, g, request("classification", "reserved"))
	if d.Verdict != gate.Admit || d.Release == nil {
		t.Fatalf("first: %+v, want admit holding the slot", d)
	}
	if w, _ := admit(t, g, request("classification", "reserved")); w.Verdict != gate.Wait {
		t.Fatalf("full, reserved: %v, want wait", w.Verdict)
	}
	if r, _ := admit(t, g, request("classification", "overflow", "tier", "interactive")); r.Verdict != gate.Reject {
		t.Fatalf("full, interactive overflow: %v, want reject", r.Verdict)
	}
	d.Release()
	if again, _ := admit(t, g, request()); again.Verdict != gate.Admit {
		t.Fatalf("after the release: %v, want admit", again.Verdict)
	} else {
		again.Release()
	}
	if s := g.(gate.Describer).Describe(); !strings.Contains(s, "composite saturation gate") {
		t.Errorf("Describe = %q", s)
	}
}

func TestConformance(t *testing.T) {
	f := newFixture(t)
	gatetest.Run(t, func(t testing.TB) gate.Gate {
		g, err := f.build(t, `{"saturation_gate":"local-max-concurrency","saturation_gate_params":{"limit":4}}`)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}, gatetest.Features{Admissions: 6})
}
