package main

import (
	"bytes"
	"context"
	"errors"
	"math"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/cmd/sluice/demo"
	"github.com/sluice-io/sluice/core/wire"
)

// check reports each bounded target the figures miss, absent and NaN
// figures included, and nothing for targets that are met or only reported.
func TestCheck(t *testing.T) {
	ts := []target{
		minimum("ratio", 0.70, ""),
		maximum("p99_ms", 5, ""),
		exactly("failed", 0, ""),
		noMore("max_inflight", "limit", ""),
		reportedOnly("throughput", ""),
	}
	tests := []struct {
		name string
		f    figures
		want []string // MISS lines
	}{
		{"all met", figures{"ratio": 0.70, "p99_ms": 5, "failed": 0, "max_inflight": 1000, "limit": 1000, "throughput": 1}, nil},
		{"every bound missed", figures{"ratio": 0.69, "p99_ms": 5.01, "failed": 3, "max_inflight": 1001, "limit": 1000}, []string{
			"MISS s ratio=0.69 target=>=0.70",
			"MISS s p99_ms=5.01 target=<=5",
			"MISS s failed=3 target==0",
			"MISS s max_inflight=1001 target=<=1000",
		}},
		{"absent figures miss", figures{"limit": 1000}, []string{
			"MISS s ratio=absent target=>=0.70",
			"MISS s p99_ms=absent target=<=5",
			"MISS s failed=absent target==0",
			"MISS s max_inflight=absent target=<=1000",
		}},
		{"NaN misses, and an absent bound figure", figures{"ratio": math.NaN(), "p99_ms": 1, "failed": 0, "max_inflight": 0}, []string{
			"MISS s ratio=NaN target=>=0.70",
			"MISS s max_inflight=0 target=<=NaN",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			for _, m := range check(ts, tt.f) {
				got = append(got, m.line("s"))
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("misses\n got %q\nwant %q", got, tt.want)
			}
			var out bytes.Buffer
			if n := report(&out, "s", ts, tt.f); n != len(tt.want) || out.String() != linesOf(tt.want) {
				t.Errorf("report printed %d:\n%s\nwant %d", n, out.String(), len(tt.want))
			}
		})
	}
}

func linesOf(ls []string) string {
	if len(ls) == 0 {
		return ""
	}
	return strings.Join(ls, "\n") + "\n"
}

// The exit status fails on any scenario error, and on any miss unless
// -no-fail.
func TestExitCode(t *testing.T) {
	tests := []struct {
		errors, misses int
		noFail         bool
		want           int
	}{
		{0, 0, false, 0},
		{0, 1, false, 1},
		{0, 1, true, 0},
		{1, 0, false, 1},
		{1, 0, true, 1},
		{1, 2, true, 1},
	}
	for _, tt := range tests {
		if got := exitCode(tt.errors, tt.misses, tt.noFail); got != tt.want {
			t.Errorf("exitCode(%d, %d, %v) = %d, want %d", tt.errors, tt.misses, tt.noFail, got, tt.want)
		}
	}
}

// The bench's loop prints each scenario's BENCH line, then its MISS lines;
// a scenario that fails is a failure, not a skip; the exit status follows.
func TestRunScenarios(t *testing.T) {
	all := []scenario{
		{"good", func(context.Context, options) (figures, error) { return figures{"ratio": 0.9, "failed": 0}, nil },
			[]target{minimum("ratio", 0.7, "x"), noFailures("failed")}},
		{"slow", func(context.Context, options) (figures, error) { return figures{"ratio": 0.5, "failed": 2}, nil },
			[]target{minimum("ratio", 0.7, "x"), noFailures("failed")}},
		{"broken", func(context.Context, options) (figures, error) { return nil, errors.New("no server") },
			[]target{minimum("ratio", 0.7, "x")}},
		{"skipped", func(context.Context, options) (figures, error) {
			t.Error("ran a scenario not asked for")
			return nil, nil
		}, nil},
	}
	want := map[string]bool{"good": true, "slow": true, "broken": true}
	var out, log bytes.Buffer
	failed, misses := runScenarios(context.Background(), &out, &log, all, want, options{runs: 1}, true)
	wantOut := `BENCH good failed=0 ratio=0.90
BENCH slow failed=2 ratio=0.50
MISS slow ratio=0.50 target=>=0.70
MISS slow failed=2 target==0
BENCH broken error="no server"
`
	if out.String() != wantOut || failed != 1 || misses != 2 {
		t.Errorf("failed %d misses %d, output:\n%s\nwant 1, 2 and:\n%s", failed, misses, out.String(), wantOut)
	}
	if exitCode(failed, misses, false) != 1 || exitCode(failed, misses, true) != 1 || exitCode(0, misses, true) != 0 {
		t.Error("exit status")
	}
	// A concurrency child does not check: its figures are one side's.
	out.Reset()
	_, misses = runScenarios(context.Background(), &out, &log, all, map[string]bool{"slow": true}, options{runs: 1}, false)
	if misses != 0 || strings.Contains(out.String(), "MISS") {
		t.Errorf("child checked its figures: %s", out.String())
	}
}

// Every scenario declares at least one target, bounded or explicitly
// reported, each with a reason, no key twice, and a bound figure is
// never the figure itself.
func TestEveryScenarioDeclaresTargets(t *testing.T) {
	for _, s := range scenarios() {
		if len(s.targets) == 0 {
			t.Errorf("%s declares no targets (use reportedOnly for a figure with no bound)", s.name)
		}
		seen := map[string]bool{}
		for _, tg := range s.targets {
			if tg.why == "" || strings.Contains(tg.why, "|") {
				t.Errorf("%s %s: the why must be set and hold no |: %q", s.name, tg.key, tg.why)
			}
			if seen[tg.key] {
				t.Errorf("%s declares %s twice", s.name, tg.key)
			}
			seen[tg.key] = true
			if tg.of == tg.key {
				t.Errorf("%s %s is bounded by itself", s.name, tg.key)
			}
		}
	}
}

// docs/benchmarks.md holds the targets table exactly as the code declares
// it (go run ./tools/bench -targets prints it).
func TestTargetsTableInDocs(t *testing.T) {
	doc, err := os.ReadFile("../../docs/benchmarks.md")
	if err != nil {
		t.Fatal(err)
	}
	const begin, end = "<!-- targets: generated by go run ./tools/bench -targets -->\n", "<!-- end of targets -->"
	s := string(doc)
	i, j := strings.Index(s, begin), strings.Index(s, end)
	if i < 0 || j < i {
		t.Fatalf("docs/benchmarks.md has no %q ... %q section", begin, end)
	}
	if got, want := s[i+len(begin):j], targetsTable(scenarios()); got != want {
		t.Errorf("docs/benchmarks.md's targets table differs from the code; replace it with the output of go run ./tools/bench -targets:\n%s", want)
	}
}

// no-herd: a dispatcher that never dispatches (the gate never opens) is a
// miss, not a pass; a good run passes; a herd above the limit misses.
func TestNoHerdRequiresDispatch(t *testing.T) {
	tests := []struct {
		name string
		runs []noHerdRun
		miss []string // keys that miss
	}{
		{"never dispatches", []noHerdRun{{closed: 0, after: 0, peak: 0}}, []string{"dispatched_after_open"}},
		{"good", []noHerdRun{{after: 3500, peak: 1000, ramp: 516 * time.Millisecond}, {after: 3300, peak: 1000, ramp: 530 * time.Millisecond}}, nil},
		{"one of three runs never dispatches", []noHerdRun{{after: 3500, peak: 1000, ramp: time.Second / 2}, {}, {after: 3400, peak: 1000, ramp: time.Second / 2}}, []string{"dispatched_after_open"}},
		{"herd", []noHerdRun{{after: 3500, peak: 1400, ramp: 10 * time.Millisecond}}, []string{"max_inflight"}},
		{"dispatched while closed", []noHerdRun{{closed: 2, after: 3500, peak: 1000, ramp: time.Second / 2}}, []string{"dispatched_while_closed"}},
		{"no runs", nil, []string{"dispatched_after_open"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := missedKeys(noHerdTargets(), noHerdFigures(tt.runs)); !slices.Equal(got, tt.miss) {
				t.Errorf("missed %v, want %v (figures %v)", got, tt.miss, noHerdFigures(tt.runs))
			}
		})
	}
}

// gate-reaction: with nothing dispatched before the gate closed there is
// nothing to stop (stop_ms 0), and that is a miss.
func TestGateReactionRequiresDispatch(t *testing.T) {
	tests := []struct {
		name string
		runs []gateReactionRun
		miss []string
	}{
		{"never dispatches", []gateReactionRun{{}}, []string{"dispatched_before_close"}},
		{"good", []gateReactionRun{{before: 12000, after: 200, stopMs: 30, closedMs: 25}, {before: 11800, after: 300, stopMs: 45, closedMs: 40}}, nil},
		{"slow to stop", []gateReactionRun{{before: 12000, after: 5000, stopMs: 400, closedMs: 390}}, []string{"stop_ms"}},
		{"one run never dispatched", []gateReactionRun{{before: 12000, stopMs: 30}, {stopMs: 0}, {before: 12000, stopMs: 30}}, []string{"dispatched_before_close"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := missedKeys(gateReactionTargets(), gateReactionFigures(tt.runs)); !slices.Equal(got, tt.miss) {
				t.Errorf("missed %v, want %v (figures %v)", got, tt.miss, gateReactionFigures(tt.runs))
			}
		})
	}
}

func missedKeys(ts []target, f figures) []string {
	var out []string
	for _, m := range check(ts, f) {
		out = append(out, m.key)
	}
	return out
}

// alternate runs sluice first on odd runs and the baseline first on even
// ones, and stops at the first error.
func TestAlternate(t *testing.T) {
	var order []string
	rec := func(name string) side {
		return func(_ context.Context, run int) error {
			order = append(order, name+string(rune('1'+run)))
			return nil
		}
	}
	if err := alternate(context.Background(), 4, rec("s"), rec("d"), rec("b")); err != nil {
		t.Fatal(err)
	}
	want := []string{"s1", "d1", "b1", "b2", "d2", "s2", "s3", "d3", "b3", "b4", "d4", "s4"}
	if !slices.Equal(order, want) {
		t.Errorf("order %v, want %v", order, want)
	}
	boom := errors.New("boom")
	calls := 0
	err := alternate(context.Background(), 3, func(context.Context, int) error { calls++; return boom }, rec("b"))
	if !errors.Is(err, boom) || calls != 1 {
		t.Errorf("alternate returned %v after %d calls, want boom after 1", err, calls)
	}
}

// medianRatio is the median of each run's own ratio, not the ratio of the
// medians, and does not reorder its inputs.
func TestMedianRatio(t *testing.T) {
	num := []float64{100, 50, 90}
	den := []float64{100, 100, 60}
	// Per run: 1.00, 0.50, 1.50: median 1.00. The ratio of the medians
	// would be 90 / 100 = 0.90.
	if got := medianRatio(num, den); got != 1 {
		t.Errorf("medianRatio = %v, want 1", got)
	}
	if median(num) != 90 || !slices.Equal(num, []float64{100, 50, 90}) {
		t.Errorf("median reordered its input: %v", num)
	}
	if got := medianRatio([]float64{1}, nil); !math.IsNaN(got) {
		t.Errorf("unpaired runs: %v, want NaN", got)
	}
	if got := medianRatio([]float64{1, 2}, []float64{2, 2}); got != 0.75 {
		t.Errorf("even count: %v, want 0.75", got)
	}
}

// Only the first 200 of a request with no error code counts as ok; error
// results, other statuses, messages that are no result and repeats fail.
func TestResultTally(t *testing.T) {
	res := func(r wire.Result) []byte { return r.Marshal() }
	var tl resultTally
	tl.addAll([][]byte{
		res(wire.Result{ID: "a", StatusCode: 200, Payload: "{}"}),
		res(wire.Result{ID: "b", StatusCode: 200, Payload: "{}"}),
		res(wire.Result{ID: "a", StatusCode: 200, Payload: "{}"}), // a second result for a
		res(wire.Result{ID: "c", StatusCode: 503, Payload: "{}"}),
		res(*wire.ErrorResult(&wire.Request{ID: "d"}, wire.CodeInferenceError, "no answer")),
		res(wire.Result{ID: "e", StatusCode: 200, Payload: "{}", ErrorCode: wire.CodeGateDropped}),
		res(wire.Result{ID: "", StatusCode: 200}), // no id: not a result
		[]byte(`not json`),
		[]byte(`{"id":"f","status_code":"200"}`), // wrong type
	})
	if tl.ok != 2 || tl.failed != 7 || tl.total() != 9 {
		t.Errorf("ok %d failed %d total %d, want 2, 7, 9", tl.ok, tl.failed, tl.total())
	}
	ss := samples{{ok: 100, failed: 1, seconds: 2}, {ok: 30, failed: 0, seconds: 1}}
	if r := ss.rates(); !slices.Equal(r, []float64{50, 30}) || ss.failed() != 1 {
		t.Errorf("rates %v failed %v", r, ss.failed())
	}
}

// A demo load's failed results are counted from the results, and missing
// ones count as failed.
func TestMemoryRate(t *testing.T) {
	ok := (&wire.Result{ID: "a", StatusCode: 200}).Marshal()
	bad := (&wire.Result{ID: "b", StatusCode: 500}).Marshal()
	rate, failed := memoryRate(demo.LoadResult{Requests: 4, Seconds: 2, Results: [][]byte{ok, bad}})
	if rate != 0.5 || failed != 3 {
		t.Errorf("rate %v failed %d, want 0.5 and 3 (one error result, two missing)", rate, failed)
	}
}
