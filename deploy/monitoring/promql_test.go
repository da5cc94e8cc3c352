package monitoring

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"testing"

	pmodel "github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

// grafanaVarRE matches a Grafana variable: ${name}, ${name:format},
// [[name]], [[name:format]] or $name.
var grafanaVarRE = regexp.MustCompile(`\$\{([A-Za-z0-9_]+)(?::[^}]*)?\}|\[\[([A-Za-z0-9_]+)(?::[^\]]*)?\]\]|\$([A-Za-z0-9_]+)`)

// substitute replaces Grafana's variables by what Grafana would put there:
// a duration for the interval and range variables, a plain literal for the
// dashboard's own variables (they only ever stand in label values).
func substitute(expr string) string {
	return grafanaVarRE.ReplaceAllStringFunc(expr, func(v string) string {
		sm := grafanaVarRE.FindStringSubmatch(v)
		name := sm[1] + sm[2] + sm[3]
		switch {
		case strings.HasPrefix(name, "__") && strings.HasSuffix(name, "_ms"):
			return "300000"
		case strings.HasPrefix(name, "__") && strings.HasSuffix(name, "_s"):
			return "300"
		case name == "__rate_interval", name == "__interval", name == "__range", name == "__range_interval":
			return "5m"
		default:
			return "sluice"
		}
	})
}

// labelValuesRE is Grafana's label_values(metric_selector, label).
var labelValuesRE = regexp.MustCompile(`^\s*label_values\(\s*(.+?)\s*,\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$`)

// checker checks PromQL expressions against what sluice exports.
type checker struct {
	ex *exports
	p  parser.Parser
}

func newChecker(t testing.TB) *checker {
	return &checker{ex: sluiceExports(t), p: parser.NewParser(parser.Options{})}
}

// query is the outcome of checking one expression.
type query struct {
	metrics []string        // the metric families the expression reads
	out     map[string]bool // the labels of its result (nil: unknown)
	errs    []error
}

func (q *query) errorf(format string, args ...any) {
	q.errs = append(q.errs, fmt.Errorf(format, args...))
}

// check parses expr with Prometheus's parser and checks every selector's
// metric, matchers and label values, and every label an aggregation or a
// vector matching names, against sluice's exports.
func (c *checker) check(expr string) *query {
	q := &query{}
	e, err := c.p.ParseExpr(expr)
	if err != nil {
		q.errorf("does not parse: %v", err)
		return q
	}
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		switch n := n.(type) {
		case *parser.VectorSelector:
			c.checkSelector(q, n)
		case *parser.AggregateExpr:
			if !n.Without {
				c.checkLabels(q, n.Grouping, n.Expr, "by")
			}
		case *parser.BinaryExpr:
			if vm := n.VectorMatching; vm != nil && vm.On {
				c.checkLabels(q, vm.MatchingLabels, n.LHS, "on")
				c.checkLabels(q, vm.MatchingLabels, n.RHS, "on")
			}
		}
		return nil
	})
	q.metrics = slices.Compact(slices.Sorted(slices.Values(q.metrics)))
	q.out = c.outLabels(e)
	return q
}

func (c *checker) checkSelector(q *query, vs *parser.VectorSelector) {
	name := vs.Name
	if name == "" {
		for _, m := range vs.LabelMatchers {
			if m.Name == pmodel.MetricNameLabel && m.Type == labels.MatchEqual {
				name = m.Value
			}
		}
	}
	if name == "" {
		q.errorf("selector %s names no metric", vs)
		return
	}
	ls, ok := c.ex.series[name]
	if !ok {
		q.errorf("metric %s is not one sluice exports (core/metrics, the gates' own collectors, the transport events, the Go and process collectors)", name)
		return
	}
	q.metrics = append(q.metrics, c.ex.family(name))
	for _, m := range vs.LabelMatchers {
		if m.Name == pmodel.MetricNameLabel {
			continue
		}
		if !ls[m.Name] && !slices.Contains(targetLabels, m.Name) {
			q.errorf("%s has no label %q (it has %v)", name, m.Name, slices.Sorted(maps.Keys(ls)))
			continue
		}
		if known, ok := c.ex.values[m.Name]; ok {
			checkValues(q, name, m, known)
		}
	}
}

// plainAlternation matches a regular expression that only lists words.
var plainAlternation = regexp.MustCompile(`^[A-Za-z0-9_]+(\|[A-Za-z0-9_]+)*$`)

// checkValues checks a matcher on a label whose values are a closed set:
// each value it names must be one sluice writes, and a matcher that is a
// pattern must match at least one of them.
func checkValues(q *query, metric string, m *labels.Matcher, known []string) {
	switch {
	case m.Type == labels.MatchEqual || m.Type == labels.MatchNotEqual:
		if m.Value != "" && !slices.Contains(known, m.Value) {
			q.errorf("%s{%s}: sluice writes no %s %q (it writes %v)", metric, m, m.Name, m.Value, known)
		}
	case plainAlternation.MatchString(m.Value):
		for v := range strings.SplitSeq(m.Value, "|") {
			if !slices.Contains(known, v) {
				q.errorf("%s{%s}: sluice writes no %s %q (it writes %v)", metric, m, m.Name, v, known)
			}
		}
	default:
		if !slices.ContainsFunc(known, func(v string) bool { return m.Matches(v) != (m.Type == labels.MatchNotRegexp) }) {
			q.errorf("%s{%s} matches none of the values sluice writes (%v)", metric, m, known)
		}
	}
}

// checkLabels checks that every label of names exists on some series that
// expr reads.
func (c *checker) checkLabels(q *query, names []string, expr parser.Expr, clause string) {
	avail := c.available(expr)
	for _, l := range names {
		if !avail[l] {
			q.errorf("%s (%s): no series it reads has label %q", clause, strings.Join(names, ", "), l)
		}
	}
}

// available is every label some series expr reads carries, and the target
// labels.
func (c *checker) available(expr parser.Expr) map[string]bool {
	avail := map[string]bool{}
	for _, l := range targetLabels {
		avail[l] = true
	}
	parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			for l := range c.ex.series[vs.Name] {
				avail[l] = true
			}
		}
		return nil
	})
	return avail
}

// outLabels are the labels of expr's result, as far as they can be told
// (nil: unknown, any label may be there).
func (c *checker) outLabels(e parser.Expr) map[string]bool {
	switch e := e.(type) {
	case *parser.VectorSelector:
		return c.available(e)
	case *parser.MatrixSelector:
		return c.outLabels(e.VectorSelector)
	case *parser.ParenExpr:
		return c.outLabels(e.Expr)
	case *parser.UnaryExpr:
		return c.outLabels(e.Expr)
	case *parser.SubqueryExpr:
		return c.outLabels(e.Expr)
	case *parser.StepInvariantExpr:
		return c.outLabels(e.Expr)
	case *parser.NumberLiteral, *parser.StringLiteral:
		return map[string]bool{}
	case *parser.AggregateExpr:
		in := c.outLabels(e.Expr)
		switch {
		case e.Op == parser.TOPK || e.Op == parser.BOTTOMK || e.Op == parser.LIMITK || e.Op == parser.LIMIT_RATIO:
			return in
		case e.Without:
			if in == nil {
				return nil
			}
			out := maps.Clone(in)
			for _, l := range e.Grouping {
				delete(out, l)
			}
			return out
		default:
			out := map[string]bool{}
			for _, l := range e.Grouping {
				out[l] = true
			}
			if e.Op == parser.COUNT_VALUES {
				if s, ok := e.Param.(*parser.StringLiteral); ok {
					out[s.Val] = true
				}
			}
			return out
		}
	case *parser.Call:
		switch e.Func.Name {
		case "scalar", "time", "vector", "pi":
			return map[string]bool{}
		case "histogram_quantile":
			out := c.outLabels(e.Args[1])
			if out != nil {
				out = maps.Clone(out)
				delete(out, "le")
			}
			return out
		case "label_replace", "label_join":
			return nil
		}
		for i, a := range e.Args {
			if t := e.Func.ArgTypes; i < len(t) && (t[i] == parser.ValueTypeVector || t[i] == parser.ValueTypeMatrix) {
				return c.outLabels(a)
			}
		}
		return nil
	case *parser.BinaryExpr:
		l, r := c.outLabels(e.LHS), c.outLabels(e.RHS)
		if e.LHS.Type() == parser.ValueTypeScalar {
			return r
		}
		if e.RHS.Type() == parser.ValueTypeScalar || e.VectorMatching == nil || e.VectorMatching.Card != parser.CardOneToMany {
			out := l
			if vm := e.VectorMatching; out != nil && vm != nil && vm.Card == parser.CardManyToOne {
				out = maps.Clone(out)
				for _, i := range vm.Include {
					out[i] = true
				}
			}
			return out
		}
		if r != nil {
			r = maps.Clone(r)
			for _, i := range e.VectorMatching.Include {
				r[i] = true
			}
		}
		return r
	}
	return nil
}

// legendRE matches a label in a legend: {{ name }}.
var legendRE = regexp.MustCompile(`\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}`)

// checkLegend checks that every label a legend shows is in the query's
// result.
func checkLegend(q *query, legend string) {
	if q.out == nil {
		return
	}
	for _, sm := range legendRE.FindAllStringSubmatch(legend, -1) {
		if !q.out[sm[1]] {
			q.errorf("legend %q shows label %q, which the result does not have (it has %v)", legend, sm[1], slices.Sorted(maps.Keys(q.out)))
		}
	}
}

// checkVariableQuery checks the query of a Grafana query variable:
// label_values(selector, label) is Grafana's, not PromQL, so its selector is
// checked as PromQL and its label against the selector's metric; any other
// query is checked as PromQL.
func (c *checker) checkVariableQuery(s string) *query {
	s = substitute(s)
	sm := labelValuesRE.FindStringSubmatch(s)
	if sm == nil {
		if strings.HasPrefix(strings.TrimSpace(s), "label_values(") {
			q := &query{}
			q.errorf("label_values without a metric: it would read every series of the data source")
			return q
		}
		return c.check(s)
	}
	q := c.check(sm[1])
	if len(q.errs) > 0 {
		return q
	}
	e, _ := c.p.ParseExpr(sm[1])
	vs, ok := e.(*parser.VectorSelector)
	if !ok {
		q.errorf("label_values reads %s, not a series selector", sm[1])
		return q
	}
	if !c.available(vs)[sm[2]] {
		q.errorf("label_values: %s has no label %q", vs.Name, sm[2])
	}
	return q
}

func TestSubstitute(t *testing.T) {
	for in, want := range map[string]string{
		`rate(x{namespace="$namespace"}[$__rate_interval])`:         `rate(x{namespace="sluice"}[5m])`,
		`rate(x{queue_name=~"${queue_name:regex}"}[${__interval}])`: `rate(x{queue_name=~"sluice"}[5m])`,
		`x{a="[[namespace]]"} offset $__range`:                      `x{a="sluice"} offset 5m`,
		`x > $__range_s`:                                            `x > 300`,
	} {
		if got := substitute(in); got != want {
			t.Errorf("substitute(%s) = %s, want %s", in, got, want)
		}
	}
}

// TestCheckerCatches makes sure the checks fail where they should: a check
// that passes everything proves nothing.
func TestCheckerCatches(t *testing.T) {
	c := newChecker(t)
	for _, tc := range []struct{ expr, legend, want string }{
		{`sum(rate(sluice_results_total{namespace="x"}[5m])`, "", "does not parse"},
		{`sum(rate(sluice_result_total[5m]))`, "", "not one sluice exports"},
		{`histogram_quantile(0.9, sum by (le) (rate(sluice_dispatch_wait_millis[5m])))`, "", "not one sluice exports"},
		{`sum(sluice_results_total{queue="a"})`, "", `no label "queue"`},
		{`sum by (queue) (sluice_results_total)`, "", `no series it reads has label "queue"`},
		{`sluice_results_total{code="OK"}`, "", `no code "OK"`},
		{`sluice_transport_events_total{event=~"late_result|reclaimed"}`, "", `no event "late_result"`},
		{`sum by (code) (rate(sluice_results_total[5m]))`, "{{queue_name}}", `shows label "queue_name"`},
		{`{queue_name="a"}`, "", "names no metric"},
	} {
		q := c.check(tc.expr)
		checkLegend(q, tc.legend)
		if !slices.ContainsFunc(q.errs, func(err error) bool { return strings.Contains(err.Error(), tc.want) }) {
			t.Errorf("check(%s) = %v, want an error containing %q", tc.expr, q.errs, tc.want)
		}
	}
	for _, tc := range []struct{ expr, legend string }{
		{`histogram_quantile(0.95, sum by (le, queue_name) (rate(llm_d_async_async_inference_latency_time_millis_bucket{namespace="x"}[5m])))`, "{{queue_name}}"},
		{`sum by (code) (rate(sluice_results_total{code!="ok"}[5m])) / scalar(sum(rate(sluice_results_total[5m])))`, "{{ code }}"},
		{`sum by (transport, event) (rate(sluice_transport_events_total{event=~"late_.*"}[5m]))`, "{{transport}} {{event}}"},
		{`sum by (pod) (go_goroutines)`, "{{pod}}"},
	} {
		q := c.check(tc.expr)
		checkLegend(q, tc.legend)
		if len(q.errs) > 0 {
			t.Errorf("check(%s): %v", tc.expr, q.errs)
		}
	}
	for query, want := range map[string]string{
		`label_values(sluice_results_total, namespace)`:                     "",
		`label_values(sluice_results_total{namespace="$namespace"}, queue)`: `no label "queue"`,
		`label_values(sluice_result_total, namespace)`:                      "not one sluice exports",
		`label_values(namespace)`:                                           "without a metric",
	} {
		q := c.checkVariableQuery(query)
		if want == "" && len(q.errs) > 0 || want != "" && !slices.ContainsFunc(q.errs, func(err error) bool { return strings.Contains(err.Error(), want) }) {
			t.Errorf("checkVariableQuery(%s) = %v, want %q", query, q.errs, want)
		}
	}
}
