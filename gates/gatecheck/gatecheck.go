// Package gatecheck holds the properties of the gate contract (core/gate)
// as values that run with or without `go test`: Properties returns them,
// each with a Check that takes a T, the small part of testing.TB they use.
// gates/gatetest runs them as subtests (the conformance suite every gate's
// tests run); `sluice plugin test` runs them against a plugin binary and
// prints a report. The package does not import testing, so a command that
// links it does not link the test framework.
//
// The properties: a budget is always in [0,1] (or an error, or a
// *gate.FallbackError carrying a budget in [0,1]); a cancelled or expired
// context ends a query promptly; Close is idempotent and a closed gate
// answers without panicking; the gate is safe for concurrent use (run with
// -race); optional interfaces answer sensibly. Features lets a test drive a
// gate's backend, so the properties also check that the budget follows it
// and that failures are reported. For gates that decide per request
// (gate.Admitter) they also check the decisions: a known verdict (Admit,
// Defer, Reject, Wait) with no negative delay, a Release only with Admit,
// and releases that never leak (CheckReleases).
package gatecheck

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/sluice-io/sluice/core/credit"
	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/wire"
)

// Features describe what the suite can do with a gate beyond the contract.
type Features struct {
	// Set, when non-nil, drives the gate's backend so that a gate built by
	// newGate reports budget b (within Tolerance) at most Settle later. The
	// suite calls it with 0, 1 and values in between.
	Set func(t T, b float64)
	// Levels are the budgets Set is called with (default 0, 1, 0.5, 0.25, 1).
	Levels []float64
	// Tolerance is the allowed difference from a level (default 0.01).
	Tolerance float64
	// Settle bounds how long the budget may take to follow Set (default 2s).
	Settle time.Duration
	// Failing, when non-nil, returns a gate whose backend is unreachable:
	// its Budget must report an error (or a *gate.FallbackError) promptly.
	Failing func(t T) gate.Gate
	// Hanging, when non-nil, returns a gate whose backend accepts requests
	// but never answers: its Budget must return when the context expires.
	Hanging func(t T) gate.Gate
	// Prompt bounds how long a query may outlive its context (default 1s).
	Prompt time.Duration
	// Admissions is how many requests CheckReleases admits at once, for a
	// gate that decides per request (default 10).
	Admissions int
}

func (f *Features) setDefaults() {
	if len(f.Levels) == 0 {
		f.Levels = []float64{0, 1, 0.5, 0.25, 1}
	}
	if f.Tolerance <= 0 {
		f.Tolerance = 0.01
	}
	if f.Settle <= 0 {
		f.Settle = 2 * time.Second
	}
	if f.Prompt <= 0 {
		f.Prompt = time.Second
	}
	if f.Admissions <= 0 {
		f.Admissions = 10
	}
}

// T is what the suite needs from the test running it. *testing.T and every
// testing.TB satisfy it; so does the reporter of `sluice plugin test`, which
// runs the properties outside `go test`. Errorf may be called from several
// goroutines at once; Fatalf ends the calling goroutine (runtime.Goexit) and
// is only called from the goroutine running the property; the functions
// given to Cleanup run, last registered first, when the property ends.
type T interface {
	Helper()
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	Cleanup(func())
	Name() string
}

// Property is one check of the suite.
type Property struct {
	// Name names the property (Run's subtest name), for example "BudgetInRange".
	Name string
	// Check runs the property, reporting through t. It builds the gates it
	// needs and registers their Close with t.Cleanup.
	Check func(t T)
}

// Properties returns the suite's properties in the order Run runs them, for
// gates built by newGate; admitter says whether those gates decide per
// request (gate.Admitter), which adds the Releases property. The properties
// driving the backend (FollowsBackend, FailingBackend, HangingBackend) are
// included only when f has Set, Failing or Hanging.
func Properties(newGate func(t T) gate.Gate, f Features, admitter bool) []Property {
	f.setDefaults()
	build := func(t T) gate.Gate {
		t.Helper()
		return buildClosed(t, newGate)
	}
	ps := []Property{
		{"BudgetInRange", func(t T) { testBudgetInRange(t, build(t)) }},
		{"CancelledContext", func(t T) { testCancelled(t, build(t), f) }},
		{"CloseIdempotent", func(t T) { testClose(t, build(t), f) }},
		{"Concurrent", func(t T) { testConcurrent(t, build(t)) }},
		{"OptionalInterfaces", func(t T) { testOptional(t, build(t)) }},
		{"Refresher", func(t T) { testRefresher(t, build(t)) }},
	}
	if admitter {
		ps = append(ps, Property{"Releases", func(t T) { CheckReleases(t, build(t), f.Admissions) }})
	}
	if f.Set != nil {
		ps = append(ps, Property{"FollowsBackend", func(t T) { testFollows(t, build(t), f) }})
	}
	if f.Failing != nil {
		ps = append(ps, Property{"FailingBackend", func(t T) {
			g := f.Failing(t)
			t.Cleanup(func() { _ = CloseGate(g) })
			testFailing(t, g, f)
		}})
	}
	if f.Hanging != nil {
		ps = append(ps, Property{"HangingBackend", func(t T) {
			g := f.Hanging(t)
			t.Cleanup(func() { _ = CloseGate(g) })
			testHanging(t, g, f)
		}})
	}
	return ps
}

// buildClosed builds a gate, failing t when there is none, and closes it
// when t ends.
func buildClosed(t T, newGate func(t T) gate.Gate) gate.Gate {
	t.Helper()
	g := newGate(t)
	if g == nil {
		t.Fatalf("newGate returned nil")
	}
	t.Cleanup(func() { _ = CloseGate(g) })
	return g
}

// CloseGate closes g when it has a Close method.
func CloseGate(g gate.Gate) error {
	if c, ok := g.(interface{ Close() error }); ok {
		return c.Close()
	}
	return nil
}

// CheckAnswer reports what is wrong with one answer of Budget, or nil: a
// value outside [0,1] without an error, or a FallbackError whose budget is
// outside [0,1].
func CheckAnswer(b float64, err error) error {
	var fb *gate.FallbackError
	switch {
	case errors.As(err, &fb):
		if !inRange(fb.Budget) {
			return errors.New("fallback budget outside [0,1]")
		}
	case err == nil && !inRange(b):
		return errors.New("budget outside [0,1]")
	}
	return nil
}

func inRange(b float64) bool { return !math.IsNaN(b) && b >= 0 && b <= 1 }

// budget runs one query with a timeout and checks the answer.
func budget(t T, g gate.Gate, timeout time.Duration) (float64, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	b, err := g.Budget(ctx)
	if cerr := CheckAnswer(b, err); cerr != nil {
		t.Errorf("Budget = %v, %v: %v", b, err, cerr)
	}
	return b, err
}

func testBudgetInRange(t T, g gate.Gate) {
	for range 20 {
		budget(t, g, 5*time.Second)
	}
}

func testCancelled(t T, g gate.Gate, f Features) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start := time.Now()
	b, err := g.Budget(ctx)
	if el := time.Since(start); el > f.Prompt {
		t.Errorf("Budget with a cancelled context took %v (want ≤ %v)", el, f.Prompt)
	}
	if cerr := CheckAnswer(b, err); cerr != nil {
		t.Errorf("Budget with a cancelled context = %v, %v: %v", b, err, cerr)
	}
	if a, ok := g.(gate.Admitter); ok {
		start = time.Now()
		d, _ := a.Admit(ctx, testRequest())
		if el := time.Since(start); el > f.Prompt {
			t.Errorf("Admit with a cancelled context took %v (want ≤ %v)", el, f.Prompt)
		}
		checkDecision(t, d)
		release(d)
	}
}

func testClose(t T, g gate.Gate, f Features) {
	budget(t, g, 5*time.Second)
	c, ok := g.(interface{ Close() error })
	if !ok {
		return // holds nothing
	}
	if err := c.Close(); err != nil {
		t.Errorf("first Close: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close: %v (Close must be idempotent)", err)
	}
	start := time.Now()
	budget(t, g, f.Prompt) // no panic, an answer in range or an error
	if el := time.Since(start); el > 2*f.Prompt {
		t.Errorf("Budget after Close took %v", el)
	}
}

func testConcurrent(t T, g gate.Gate) {
	const workers, calls = 8, 25
	adm, _ := g.(gate.Admitter)
	desc, _ := g.(gate.Describer)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range calls {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				b, err := g.Budget(ctx)
				if cerr := CheckAnswer(b, err); cerr != nil {
					t.Errorf("concurrent Budget = %v, %v: %v", b, err, cerr)
				}
				if adm != nil {
					d, err := adm.Admit(ctx, testRequest())
					if err == nil {
						checkDecision(t, d)
					}
					release(d)
				}
				if desc != nil && w == 0 {
					_ = desc.Describe()
				}
				cancel()
			}
		}()
	}
	wg.Wait()
	// Close while queries run: no panic, no race, every answer valid.
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 5 {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				b, err := g.Budget(ctx)
				cancel()
				if cerr := CheckAnswer(b, err); cerr != nil {
					t.Errorf("Budget racing Close = %v, %v: %v", b, err, cerr)
				}
			}
		}()
	}
	wg.Add(2)
	for range 2 {
		go func() {
			defer wg.Done()
			if err := CloseGate(g); err != nil {
				t.Errorf("Close racing queries: %v", err)
			}
		}()
	}
	wg.Wait()
}

func testOptional(t T, g gate.Gate) {
	if d, ok := g.(gate.Describer); ok && d.Describe() == "" {
		t.Errorf("Describe returned an empty string")
	}
	if p, ok := g.(gate.PolicyReporter); ok {
		if _, err := gate.ParseFailurePolicy(string(p.FailurePolicy())); err != nil {
			t.Errorf("FailurePolicy: %v", err)
		}
	}
	if iv, ok := g.(gate.Intervaler); ok && iv.RefreshInterval() < 0 {
		t.Errorf("RefreshInterval = %v, want ≥ 0", iv.RefreshInterval())
	}
	if a, ok := g.(gate.Admitter); ok {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		d, err := a.Admit(ctx, testRequest())
		if err == nil {
			checkDecision(t, d)
		}
		release(d)
	}
}

// testRefresher runs the gate under a Refresher, as the pipeline does.
func testRefresher(t T, g gate.Gate) {
	r := gate.NewRefresher(g, gate.RefresherConfig{Name: "gatetest", Interval: 10 * time.Millisecond})
	c := credit.NewPool(100, credit.Ramp{})
	r.Attach(c)
	r.Start(context.Background())
	time.Sleep(50 * time.Millisecond)
	if b := r.Budget(); !inRange(b) {
		t.Errorf("Refresher budget %v outside [0,1]", b)
	}
	if _, limit, _ := c.Snapshot(); limit < 0 || limit > 100 {
		t.Errorf("credit limit %d outside [0,100]", limit)
	}
	if err := r.Close(); err != nil {
		t.Errorf("Refresher.Close: %v", err)
	}
	if err := r.Close(); err != nil {
		t.Errorf("second Refresher.Close: %v", err)
	}
}

func testFollows(t T, g gate.Gate, f Features) {
	for _, level := range f.Levels {
		f.Set(t, level)
		var b float64
		var err error
		deadline := time.Now().Add(f.Settle)
		for {
			b, err = budget(t, g, 5*time.Second)
			if err == nil && math.Abs(b-level) <= f.Tolerance {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("backend set to %v: budget %v, err %v after %v", level, b, err, f.Settle)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

func testFailing(t T, g gate.Gate, f Features) {
	start := time.Now()
	b, err := budget(t, g, 5*time.Second)
	if err == nil {
		t.Errorf("Budget with an unreachable backend = %v and no error; a failure must be reported", b)
	}
	if el := time.Since(start); el > 5*time.Second+f.Prompt {
		t.Errorf("Budget with an unreachable backend took %v", el)
	}
}

func testHanging(t T, g gate.Gate, f Features) {
	const timeout = 200 * time.Millisecond
	start := time.Now()
	b, err := budget(t, g, timeout)
	if el := time.Since(start); el > timeout+f.Prompt {
		t.Errorf("Budget with a hanging backend took %v, past its %v deadline", el, timeout)
	}
	if err == nil {
		t.Errorf("Budget with a hanging backend = %v and no error", b)
	}
}

func checkDecision(t T, d gate.Decision) {
	t.Helper()
	if err := CheckDecision(d); err != nil {
		t.Errorf("Admit = %+v: %v", d, err)
	}
}

// CheckDecision reports what is wrong with one decision of Admit, or nil:
// an unknown verdict, a negative delay, or a Release with a decision other
// than Admit (a gate that does not admit must hold nothing), or an Observe
// with a decision other than Admit.
func CheckDecision(d gate.Decision) error {
	switch d.Verdict {
	case gate.Admit, gate.Reject, gate.Defer, gate.Wait:
	default:
		return fmt.Errorf("unknown verdict %v", d.Verdict)
	}
	if d.Delay < 0 {
		return fmt.Errorf("%v with a negative delay %v", d.Verdict, d.Delay)
	}
	if d.Verdict != gate.Admit && d.Release != nil {
		return fmt.Errorf("%v carries a Release: a gate that does not admit must hold nothing", d.Verdict)
	}
	if d.Verdict != gate.Admit && d.Observe != nil {
		return fmt.Errorf("%v carries an Observe: only an admitted request is dispatched", d.Verdict)
	}
	return nil
}

// release gives back what d reserved, if anything.
func release(d gate.Decision) {
	if d.Release != nil {
		d.Release()
	}
}

// outcome is one Admit's answer, as CheckReleases compares them.
type outcome struct {
	verdict gate.Verdict
	failed  bool
}

// AdmitN asks a for n decisions on fresh requests, one after another,
// holding every reservation; each Admit is bounded by timeout. errs holds
// each call's error (nil where there was none); a decision that came with
// an error holds nothing (a Release it carried anyway is called, and the
// test fails).
func AdmitN(t T, a gate.Admitter, n int, timeout time.Duration) (ds []gate.Decision, errs []error) {
	t.Helper()
	for i := range n {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		req := testRequest()
		req.ID = fmt.Sprintf("gatetest-%d", i)
		d, err := a.Admit(ctx, req)
		cancel()
		if err != nil {
			if d.Release != nil {
				t.Errorf("Admit %d: an error (%v) with a Release: nothing may be held", i, err)
				d.Release()
				d.Release = nil
			}
		} else {
			checkDecision(t, d)
		}
		ds, errs = append(ds, d), append(errs, err)
	}
	return ds, errs
}

// ReleaseAll gives back every reservation in ds, calling each Release twice
// (the pipeline calls it once; a second call must do nothing), and fails
// the test when a call does not return within a second.
func ReleaseAll(t T, ds []gate.Decision) {
	t.Helper()
	for i, d := range ds {
		if d.Release == nil {
			continue
		}
		for call := 1; call <= 2; call++ {
			done := make(chan struct{})
			go func() { defer close(done); d.Release() }()
			select {
			case <-done:
			case <-time.After(time.Second):
				t.Fatalf("decision %d: Release call %d did not return within 1s", i, call)
			}
		}
	}
}

// CheckReleases checks that g's reservations never leak: it admits n
// requests holding every reservation, gives them all back (ReleaseAll),
// and checks the gate is back where it started: a second round of n
// admissions gets the same verdicts, and after giving those back the
// budget is what it was before the first. g must be an Admitter whose
// backend does not change meanwhile.
func CheckReleases(t T, g gate.Gate, n int) {
	t.Helper()
	a, ok := g.(gate.Admitter)
	if !ok {
		t.Fatalf("%T does not decide per request", g)
	}
	const timeout = 250 * time.Millisecond
	before, beforeErr := Query(t, g)
	var rounds [2][]outcome
	for r := range rounds {
		ds, errs := AdmitN(t, a, n, timeout)
		for i, d := range ds {
			rounds[r] = append(rounds[r], outcome{verdict: d.Verdict, failed: errs[i] != nil})
		}
		ReleaseAll(t, ds)
	}
	if !slices.Equal(rounds[0], rounds[1]) {
		t.Errorf("admissions after giving back every reservation differ (a reservation leaked or was given back twice):\n first %v\nsecond %v",
			rounds[0], rounds[1])
	}
	after, afterErr := Query(t, g)
	if (beforeErr == nil) != (afterErr == nil) || math.Abs(before-after) > 1e-9 {
		t.Errorf("budget %v (err %v) after giving back every reservation, %v (err %v) before", after, afterErr, before, beforeErr)
	}
}

func (o outcome) String() string {
	if o.failed {
		return "error"
	}
	return o.verdict.String()
}

func testRequest() *wire.Request {
	return &wire.Request{ID: "gatetest-1", Deadline: time.Now().Add(time.Minute)}
}

// Query asks g for its budget once, bounded by 5 s, and returns the answer
// as it is.
func Query(t T, g gate.Gate) (float64, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return g.Budget(ctx)
}
