// Package gatetest is the conformance suite every dispatch gate passes:
// built-in gates run it from their tests, and plugin authors run it against
// theirs.
//
//	func TestConformance(t *testing.T) {
//		gatetest.Run(t, func(t testing.TB) gate.Gate { return newMyGate(t) }, gatetest.Features{})
//	}
//
// The suite checks the contract of core/gate: a budget is always in [0,1]
// (or an error, or a *gate.FallbackError carrying a budget in [0,1]); a
// cancelled or expired context ends a query promptly; Close is idempotent
// and a closed gate answers without panicking; the gate is safe for
// concurrent use (run the suite with -race); optional interfaces answer
// sensibly. Features lets a gate's test drive its backend, so the suite can
// also check that the budget follows it and that failures are reported.
//
// For gates that decide per request (gate.Admitter) it also checks the
// decisions: a known verdict (Admit, Defer, Reject, Wait) with no negative
// delay, a Release only with Admit, and releases that never leak: N
// requests admitted and given back (each Release called twice, the second
// call doing nothing) leave the gate where it was (gatecheck.CheckReleases). Ledger
// is a scripted per-request gate for testing gates that wrap others.
//
// The properties themselves live in gates/gatecheck, which does not import
// testing, so that `sluice plugin test` can run them against a plugin binary.
package gatetest

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/gates/gatecheck"
)

// Features describe what the suite can do with a gate beyond the contract
// (gatecheck.Features, with callbacks that take the testing.TB of the subtest).
type Features struct {
	// Set, when non-nil, drives the gate's backend so that a gate built by
	// newGate reports budget b (within Tolerance) at most Settle later. The
	// suite calls it with 0, 1 and values in between.
	Set func(t testing.TB, b float64)
	// Levels are the budgets Set is called with (default 0, 1, 0.5, 0.25, 1).
	Levels []float64
	// Tolerance is the allowed difference from a level (default 0.01).
	Tolerance float64
	// Settle bounds how long the budget may take to follow Set (default 2s).
	Settle time.Duration
	// Failing, when non-nil, returns a gate whose backend is unreachable:
	// its Budget must report an error (or a *gate.FallbackError) promptly.
	Failing func(t testing.TB) gate.Gate
	// Hanging, when non-nil, returns a gate whose backend accepts requests
	// but never answers: its Budget must return when the context expires.
	Hanging func(t testing.TB) gate.Gate
	// Prompt bounds how long a query may outlive its context (default 1s).
	Prompt time.Duration
	// Admissions is how many requests CheckReleases admits at once, for a
	// gate that decides per request (default 10).
	Admissions int
}

// check is f as gatecheck takes it: its callbacks get the *testing.T of
// the subtest, which is the T Run's properties run with.
func (f Features) check() gatecheck.Features {
	c := gatecheck.Features{
		Levels: f.Levels, Tolerance: f.Tolerance, Settle: f.Settle,
		Prompt: f.Prompt, Admissions: f.Admissions,
	}
	if f.Set != nil {
		c.Set = func(t gatecheck.T, b float64) { f.Set(t.(testing.TB), b) }
	}
	if f.Failing != nil {
		c.Failing = func(t gatecheck.T) gate.Gate { return f.Failing(t.(testing.TB)) }
	}
	if f.Hanging != nil {
		c.Hanging = func(t gatecheck.T) gate.Gate { return f.Hanging(t.(testing.TB)) }
	}
	return c
}

// T is what the suite needs from the test running it (gatecheck.T).
type T = gatecheck.T

var _ T = (testing.TB)(nil)

// Run runs the suite. newGate builds a fresh gate for each subtest; the
// subtest closes it (Run's own checks call Close, and the suite registers a
// Close at cleanup too).
func Run(t *testing.T, newGate func(t testing.TB) gate.Gate, f Features) {
	t.Helper()
	// Every T the properties see here is a *testing.T.
	build := func(t gatecheck.T) gate.Gate { return newGate(t.(testing.TB)) }
	g := build(t)
	if g == nil {
		t.Fatal("newGate returned nil")
	}
	t.Cleanup(func() { _ = gatecheck.CloseGate(g) })
	_, admitter := g.(gate.Admitter)
	for _, p := range gatecheck.Properties(build, f.check(), admitter) {
		t.Run(p.Name, func(t *testing.T) { p.Check(t) })
	}
}

// Build builds a gate the way sluice does from a queue's configuration:
// params is the JSON object of gate_params, parsed by gate.ParseParams and
// passed with env to the factory registered as typ in r. The gate is closed
// when the test ends. Params that are not a JSON object fail the test; the
// factory's error is returned.
func Build(t T, r *gate.Registry, typ, params string, env gate.Env) (gate.Gate, error) {
	t.Helper()
	var obj map[string]json.RawMessage
	if err := json.Unmarshal([]byte(params), &obj); err != nil {
		t.Fatalf("gate_params %s: %v", params, err)
	}
	p, err := gate.ParseParams(obj)
	if err != nil {
		t.Fatalf("gate_params %s: %v", params, err)
	}
	g, err := r.New(typ, p, env)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { _ = gatecheck.CloseGate(g) })
	return g, nil
}

// Query asks g for its budget once, bounded by 5 s (gatecheck.Query).
func Query(t T, g gate.Gate) (float64, error) {
	t.Helper()
	return gatecheck.Query(t, g)
}
