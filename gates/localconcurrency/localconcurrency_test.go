package localconcurrency_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/gates/gatecheck"
	"github.com/sluice-io/sluice/gates/gatetest"
	"github.com/sluice-io/sluice/gates/localconcurrency"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func build(t testing.TB, params string) (gate.Gate, error) {
	t.Helper()
	r := gate.NewRegistry()
	if err := r.Register(localconcurrency.Type, localconcurrency.Factory); err != nil {
		t.Fatal(err)
	}
	return gatetest.Build(t, r, localconcurrency.Type, params, gate.Env{})
}

func mustBuild(t testing.TB, params string) *localconcurrency.Gate {
	t.Helper()
	g, err := build(t, params)
	if err != nil {
		t.Fatalf("build %s: %v", params, err)
	}
	return g.(*localconcurrency.Gate)
}

func req() *wire.Request { return &wire.Request{ID: "r", Deadline: time.Now().Add(time.Minute)} }

func admit(t testing.TB, g *localconcurrency.Gate) gate.Decision {
	t.Helper()
	d, err := g.Admit(context.Background(), req())
	if err != nil {
		t.Fatalf("Admit: %v", err)
	}
	return d
}

func TestParams(t *testing.T) {
	tests := []struct{ name, params, wantErr string }{
		{"limit", `{"limit":3}`, ""},
		{"limit as a string", `{"limit":"3"}`, ""},
		{"blocking", `{"limit":3,"gating_mode":"blocking"}`, ""},
		{"classifying", `{"limit":3,"gating_mode":"classifying"}`, ""},
		{"empty mode is the default", `{"limit":3,"gating_mode":""}`, ""},
		{"no limit", `{}`, "gate_params.limit is required"},
		{"null limit", `{"limit":null}`, "gate_params.limit is required"},
		{"zero limit", `{"limit":0}`, "gate_params.limit: 0 must be > 0"},
		{"negative limit", `{"limit":-1}`, "gate_params.limit: -1 must be > 0"},
		{"fractional limit", `{"limit":2.5}`, "gate_params.limit: 2.5 is not an integer"},
		{"limit not a number", `{"limit":"many"}`, "gate_params.limit"},
		{"unknown mode", `{"limit":3,"gating_mode":"Blocking"}`, `gate_params.gating_mode: "Blocking"`},
		{"unknown param", `{"limit":3,"mode":"blocking"}`, "unknown gate_params: mode"},
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

// TestDefaultModeIsClassifying: the default defers when full (upstream's
// default here is classifying, the opposite of redis-quota's).
func TestDefaultModeIsClassifying(t *testing.T) {
	g := mustBuild(t, `{"limit":1}`)
	held := admit(t, g)
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // a blocking gate would fail at once with this; classifying defers
	d, err := g.Admit(ctx, req())
	if err != nil || d.Verdict != gate.Defer || d.Release != nil {
		t.Fatalf("full, default mode: %+v, %v; want Defer holding nothing", d, err)
	}
	held.Release()
}

// TestBudgetFormula: budget 1 while a slot is free, 0 when full (not
// upstream's free share: see Budget).
func TestBudgetFormula(t *testing.T) {
	g := mustBuild(t, `{"limit":4}`)
	var held []gate.Decision
	for inFlight, want := range []float64{1, 1, 1, 1, 0} {
		b, err := gatetest.Query(t, g)
		if err != nil || math.Abs(b-want) > 1e-12 {
			t.Fatalf("%d in flight: budget %v, %v; want %v", inFlight, b, err, want)
		}
		if g.InFlight() != inFlight {
			t.Fatalf("InFlight = %d, want %d", g.InFlight(), inFlight)
		}
		if inFlight < 4 {
			d := admit(t, g)
			if d.Verdict != gate.Admit || d.Release == nil {
				t.Fatalf("%d in flight of 4: %+v, want Admit with a Release", inFlight, d)
			}
			held = append(held, d)
		}
	}
	if d := admit(t, g); d.Verdict != gate.Defer || d.Release != nil {
		t.Fatalf("full: %+v, want Defer holding nothing", d)
	}
	held[0].Release()
	held[0].Release() // a second call gives back nothing more
	if b, _ := gatetest.Query(t, g); b != 1 || g.InFlight() != 3 {
		t.Fatalf("after one release (called twice): budget %v, in flight %d; want 1 and 3", b, g.InFlight())
	}
	gatecheck.ReleaseAll(t, held)
	if b, _ := gatetest.Query(t, g); b != 1 || g.InFlight() != 0 {
		t.Fatalf("all released: budget %v, in flight %d", b, g.InFlight())
	}
}

// TestBlockingWaitsForASlot: a blocked Admit takes the slot a release frees.
func TestBlockingWaitsForASlot(t *testing.T) {
	g := mustBuild(t, `{"limit":1,"gating_mode":"blocking"}`)
	held := admit(t, g)
	got := make(chan gate.Decision, 1)
	go func() {
		d, err := g.Admit(context.Background(), req())
		if err != nil {
			t.Errorf("blocked Admit: %v", err)
		}
		got <- d
	}()
	select {
	case d := <-got:
		t.Fatalf("Admit returned %+v while the only slot was held", d)
	case <-time.After(50 * time.Millisecond):
	}
	held.Release()
	select {
	case d := <-got:
		if d.Verdict != gate.Admit || d.Release == nil {
			t.Fatalf("after the release: %+v, want Admit with a Release", d)
		}
		d.Release()
	case <-time.After(5 * time.Second):
		t.Fatal("blocked Admit did not take the freed slot")
	}
	if g.InFlight() != 0 {
		t.Fatalf("in flight %d after every release", g.InFlight())
	}
}

// TestBlockingEndsWithTheContext: when ctx ends first, Admit returns an
// error wrapping the context's (upstream's), holding nothing.
func TestBlockingEndsWithTheContext(t *testing.T) {
	g := mustBuild(t, `{"limit":1,"gating_mode":"blocking"}`)
	held := admit(t, g)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	d, err := g.Admit(ctx, req())
	if !errors.Is(err, context.DeadlineExceeded) || d.Release != nil {
		t.Fatalf("Admit = %+v, %v; want an error wrapping DeadlineExceeded", d, err)
	}
	if el := time.Since(start); el < 90*time.Millisecond || el > 2*time.Second {
		t.Fatalf("Admit returned after %v; want at the 100ms deadline", el)
	}
	if g.InFlight() != 1 {
		t.Fatalf("in flight %d, want 1 (the failed wait holds nothing)", g.InFlight())
	}
	// Full and the context already ended: the error comes at once.
	start = time.Now()
	if _, err := g.Admit(ctx, req()); !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 50*time.Millisecond {
		t.Fatalf("full, ended context: %v after %v; want DeadlineExceeded at once", err, time.Since(start))
	}
	// A free slot is taken without waiting: only a wait needs the context.
	held.Release()
	d, err = g.Admit(ctx, req())
	if err != nil || d.Verdict != gate.Admit {
		t.Fatalf("free slot, ended context: %+v, %v; want Admit", d, err)
	}
	d.Release()
}

// TestNeverOverLimit: many concurrent requests never hold more than limit
// slots, in either mode, and every slot comes back.
func TestNeverOverLimit(t *testing.T) {
	for _, mode := range []string{"classifying", "blocking"} {
		t.Run(mode, func(t *testing.T) {
			const limit, workers, calls = 3, 16, 50
			g := mustBuild(t, `{"limit":3,"gating_mode":"`+mode+`"}`)
			var cur, peak, admitted atomic.Int64
			var wg sync.WaitGroup
			for range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range calls {
						ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
						d, err := g.Admit(ctx, req())
						cancel()
						if err != nil || d.Verdict != gate.Admit {
							continue
						}
						n := cur.Add(1)
						for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
						}
						admitted.Add(1)
						time.Sleep(100 * time.Microsecond)
						cur.Add(-1)
						d.Release()
						d.Release()
					}
				}()
			}
			wg.Wait()
			if peak.Load() > limit {
				t.Fatalf("%d requests held slots at once, limit %d", peak.Load(), limit)
			}
			if mode == "blocking" && admitted.Load() != workers*calls {
				t.Fatalf("blocking: %d of %d admitted", admitted.Load(), workers*calls)
			}
			if g.InFlight() != 0 {
				t.Fatalf("%d slots leaked", g.InFlight())
			}
		})
	}
}

func TestDescribe(t *testing.T) {
	for params, want := range map[string]string{
		`{"limit":7}`:                          "defers requests (classifying)",
		`{"limit":7,"gating_mode":"blocking"}`: "until a slot frees or their deadline (blocking)",
	} {
		if d := mustBuild(t, params).Describe(); !strings.Contains(d, want) || !strings.Contains(d, "7") {
			t.Errorf("Describe = %q, want %q and the limit", d, want)
		}
	}
}

func TestConformance(t *testing.T) {
	for _, mode := range []string{"classifying", "blocking"} {
		t.Run(mode, func(t *testing.T) {
			gatetest.Run(t, func(t testing.TB) gate.Gate {
				return mustBuild(t, `{"limit":4,"gating_mode":"`+mode+`"}`)
			}, gatetest.Features{Admissions: 6})
		})
	}
}
