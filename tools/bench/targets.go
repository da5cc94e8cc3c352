package main

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// comparison is how a figure is held to its bound.
type comparison string

// The comparisons a target can make, as MISS lines print them.
const (
	atLeast  comparison = ">="
	atMost   comparison = "<="
	equalTo  comparison = "="
	reported comparison = "" // a figure printed for reading, held to nothing
)

// target is one figure of a scenario and what it must be. The bound is a
// number, or, when of is set, another figure of the same line (no-herd's
// max_inflight <= limit). A target with comparison reported says in code
// that the figure has no bound, and why.
type target struct {
	key   string
	cmp   comparison
	bound float64
	of    string // the figure that is the bound, instead of bound
	why   string
}

// The constructors keep the declarations beside each scenario one line each.
func minimum(key string, bound float64, why string) target {
	return target{key, atLeast, bound, "", why}
}
func maximum(key string, bound float64, why string) target {
	return target{key, atMost, bound, "", why}
}
func exactly(key string, bound float64, why string) target {
	return target{key, equalTo, bound, "", why}
}
func noMore(key, of, why string) target   { return target{key, atMost, 0, of, why} }
func noLess(key, of, why string) target   { return target{key, atLeast, 0, of, why} }
func reportedOnly(key, why string) target { return target{key, reported, 0, "", why} }

// noFailures is the target every scenario whose gateway always answers 200
// has for each side that writes results: not one result other than a first
// 200 for its request (see resultTally).
func noFailures(key string) target {
	return exactly(key, 0, "the gateway answers every call 200: any other result is a failure, not throughput")
}

// miss is one figure that did not meet its target.
type miss struct {
	target
	value   float64
	absent  bool    // the scenario printed no such figure
	against float64 // the bound the value was compared with
}

// bounded reports whether t holds its figure to anything.
func (t target) bounded() bool { return t.cmp != reported }

// String is the target as the docs and MISS lines write it: "<=100",
// ">=limit" (when the bound is another figure), or "reported, no target".
func (t target) String() string {
	if !t.bounded() {
		return "reported, no target"
	}
	if t.of != "" {
		return string(t.cmp) + t.of
	}
	return string(t.cmp) + formatValue(t.bound)
}

// docString is the target as the docs' table writes it: "≥ 0.70",
// "≤ `limit`", "= 0", or "reported, no target".
func (t target) docString() string {
	if !t.bounded() {
		return "reported, no target"
	}
	op := map[comparison]string{atLeast: "≥", atMost: "≤", equalTo: "="}[t.cmp]
	if t.of != "" {
		return op + " `" + t.of + "`"
	}
	return op + " " + formatValue(t.bound)
}

// check returns the targets of ts that f misses, in declaration order. A
// bounded figure f does not have is a miss (a scenario that stops
// reporting a figure must not pass by silence), and so is a NaN.
func check(ts []target, f figures) []miss {
	var out []miss
	for _, t := range ts {
		if !t.bounded() {
			continue
		}
		v, ok := f[t.key]
		bound := t.bound
		if t.of != "" {
			b, bok := f[t.of]
			if !bok || math.IsNaN(b) {
				out = append(out, miss{target: t, value: v, absent: !ok, against: math.NaN()})
				continue
			}
			bound = b
		}
		if !ok || math.IsNaN(v) {
			out = append(out, miss{target: t, value: v, absent: !ok, against: bound})
			continue
		}
		met := false
		switch t.cmp {
		case atLeast:
			met = v >= bound
		case atMost:
			met = v <= bound
		case equalTo:
			met = v == bound
		}
		if !met {
			out = append(out, miss{target: t, value: v, against: bound})
		}
	}
	return out
}

// line is the MISS line of m in scenario name:
//
//	MISS <scenario> key=value target=<op><bound>
//
// where bound is the number compared with (a figure's value when the
// target names one) and value is "absent" when the figure was not printed.
func (m miss) line(name string) string {
	v := formatValue(m.value)
	if m.absent {
		v = "absent"
	}
	return fmt.Sprintf("MISS %s %s=%s target=%s%s", name, m.key, v, m.cmp, formatValue(m.against))
}

// report prints a scenario's MISS lines to w and returns how many there were.
func report(w io.Writer, name string, ts []target, f figures) int {
	ms := check(ts, f)
	for _, m := range ms {
		fmt.Fprintln(w, m.line(name))
	}
	return len(ms)
}

// exitCode is the bench's exit status: 1 when a scenario failed, or when a
// figure missed its target unless noFail (exploratory runs); 0 otherwise.
func exitCode(errors, misses int, noFail bool) int {
	if errors > 0 || (misses > 0 && !noFail) {
		return 1
	}
	return 0
}

// formatValue writes a figure as BENCH lines do: integers without a
// fraction, other numbers with two decimals.
func formatValue(v float64) string {
	switch {
	case math.IsNaN(v):
		return "NaN"
	case v == math.Trunc(v) && math.Abs(v) < 1e15:
		return strconv.FormatInt(int64(v), 10)
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}

// targetsTable renders every scenario's targets as the Markdown table of
// docs/benchmarks.md (TestTargetsTableInDocs keeps the two identical).
func targetsTable(all []scenario) string {
	var b strings.Builder
	b.WriteString("| scenario | figure | target | why |\n|---|---|---|---|\n")
	for _, s := range all {
		for _, t := range s.targets {
			fmt.Fprintf(&b, "| `%s` | `%s` | %s | %s |\n", s.name, t.key, t.docString(), t.why)
		}
	}
	return b.String()
}
