package monitoring

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-io/sluice/core/metrics"
)

// dashboardDir holds the Grafana dashboards the chart ships.
const dashboardDir = "../helm/sluice/files/dashboards"

// panel is the part of a Grafana panel the checks read.
type panel struct {
	ID          int             `json:"id"`
	Type        string          `json:"type"`
	Title       string          `json:"title"`
	Description string          `json:"description"`
	GridPos     gridPos         `json:"gridPos"`
	Targets     []target        `json:"targets"`
	Panels      []panel         `json:"panels"` // a collapsed row's
	FieldConfig json.RawMessage `json:"fieldConfig"`
}

type gridPos struct{ H, W, X, Y int }

type target struct {
	RefID        string `json:"refId"`
	Expr         string `json:"expr"`
	LegendFormat string `json:"legendFormat"`
	Instant      bool   `json:"instant"`
}

// model is the part of a dashboard the checks read.
type model struct {
	Title         string  `json:"title"`
	UID           string  `json:"uid"`
	SchemaVersion int     `json:"schemaVersion"`
	Editable      bool    `json:"editable"`
	GraphTooltip  int     `json:"graphTooltip"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []variable `json:"list"`
	} `json:"templating"`
	Time struct{ From, To string } `json:"time"`
}

type variable struct {
	Name       string `json:"name"`
	Type       string `json:"type"`
	Query      any    `json:"query"` // a string, or an object with a "query" field
	Refresh    int    `json:"refresh"`
	IncludeAll bool   `json:"includeAll"`
}

// queryString is the variable's query text.
func (v variable) queryString() string {
	switch q := v.Query.(type) {
	case string:
		return q
	case map[string]any:
		s, _ := q["query"].(string)
		return s
	}
	return ""
}

// allPanels is every panel of d, those inside collapsed rows included.
func (m model) allPanels() []panel {
	var out []panel
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			out = append(out, p)
			walk(p.Panels)
		}
	}
	walk(m.Panels)
	return out
}

// loadDashboards reads every dashboard the chart ships.
func loadDashboards(t *testing.T) map[string]model {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dashboardDir, "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no dashboards in %s", dashboardDir)
	}
	out := map[string]model{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var m model
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out[filepath.Base(f)] = m
	}
	return out
}

// TestDashboardQueries parses every query of every dashboard with
// Prometheus's parser (Grafana's variables substituted) and checks each
// metric, label and legend against what sluice exports.
func TestDashboardQueries(t *testing.T) {
	c := newChecker(t)
	for file, d := range loadDashboards(t) {
		t.Run(file, func(t *testing.T) {
			n := 0
			for _, p := range d.allPanels() {
				for _, tg := range p.Targets {
					if tg.Expr == "" {
						t.Errorf("panel %q, query %s: no expr", p.Title, tg.RefID)
						continue
					}
					n++
					q := c.check(substitute(tg.Expr))
					checkLegend(q, tg.LegendFormat)
					for _, err := range q.errs {
						t.Errorf("panel %q, query %s (%s): %v", p.Title, tg.RefID, tg.Expr, err)
					}
				}
			}
			for _, v := range d.Templating.List {
				if v.Type != "query" {
					continue
				}
				n++
				for _, err := range c.checkVariableQuery(v.queryString()).errs {
					t.Errorf("variable %s (%s): %v", v.Name, v.queryString(), err)
				}
			}
			if n == 0 {
				t.Errorf("no queries found")
			}
		})
	}
}

// TestDashboardSettings checks what the chart's Grafana needs of each
// dashboard: schema 39, a unique uid and title, editable, the namespace
// variable, the default data source (no panel or variable names one),
// unique panel ids, and panels that fit the 24-column grid without
// overlapping.
func TestDashboardSettings(t *testing.T) {
	uids, titles := map[string]string{}, map[string]string{}
	for file, d := range loadDashboards(t) {
		t.Run(file, func(t *testing.T) {
			if d.SchemaVersion != 39 {
				t.Errorf("schemaVersion %d, want 39", d.SchemaVersion)
			}
			if d.UID == "" || d.Title == "" {
				t.Errorf("uid %q, title %q: both are needed", d.UID, d.Title)
			}
			if other, dup := uids[d.UID]; dup {
				t.Errorf("uid %q is also %s's", d.UID, other)
			}
			if other, dup := titles[d.Title]; dup {
				t.Errorf("title %q is also %s's", d.Title, other)
			}
			uids[d.UID], titles[d.Title] = file, file
			if !d.Editable {
				t.Errorf("not editable")
			}
			if !slices.ContainsFunc(d.Templating.List, func(v variable) bool { return v.Name == "namespace" && v.Type == "query" }) {
				t.Errorf("no namespace query variable")
			}
			b, err := os.ReadFile(filepath.Join(dashboardDir, file))
			if err != nil {
				t.Fatal(err)
			}
			var raw any
			if err := json.Unmarshal(b, &raw); err != nil {
				t.Fatal(err)
			}
			for _, path := range findKey(raw, "datasource", "$") {
				t.Errorf("%s names a data source: the dashboards use the default one", path)
			}
			ids := map[int]string{}
			var boxes []panel
			for _, p := range d.allPanels() {
				if other, dup := ids[p.ID]; dup || p.ID == 0 {
					t.Errorf("panel %q: id %d is missing or also %q's", p.Title, p.ID, other)
				}
				ids[p.ID] = p.Title
				g := p.GridPos
				if g.W <= 0 || g.H <= 0 || g.X < 0 || g.Y < 0 || g.X+g.W > 24 {
					t.Errorf("panel %q: gridPos %+v does not fit the 24-column grid", p.Title, g)
				}
				for _, o := range boxes {
					h := o.GridPos
					if g.X < h.X+h.W && h.X < g.X+g.W && g.Y < h.Y+h.H && h.Y < g.Y+g.H {
						t.Errorf("panels %q %+v and %q %+v overlap", p.Title, g, o.Title, h)
					}
				}
				boxes = append(boxes, p)
				if p.Type != "row" && p.Type != "text" && len(p.Targets) == 0 {
					t.Errorf("panel %q has no query", p.Title)
				}
			}
		})
	}
}

// findKey returns the path of every key named key in v.
func findKey(v any, key, path string) []string {
	var out []string
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			p := path + "." + k
			if k == key {
				out = append(out, p)
			}
			out = append(out, findKey(e, key, p)...)
		}
	case []any:
		for i, e := range v {
			out = append(out, findKey(e, key, fmt.Sprintf("%s[%d]", path, i))...)
		}
	}
	return out
}

// upstreamPanel is one panel of upstream's dashboard (UPSTREAM-CHART.md §12).
type upstreamPanel struct {
	title, typ, unit string
	grid             gridPos
	exprs, legends   []string
	thresholds       []threshold // gauges only
}

type threshold struct {
	Color string   `json:"color"`
	Value *float64 `json:"value"`
}

// TestUpstreamDashboard pins llm-d-async.json to upstream's dashboard, panel
// for panel (UPSTREAM-CHART.md §12), so upstream's users keep theirs.
func TestUpstreamDashboard(t *testing.T) {
	d, ok := loadDashboards(t)["llm-d-async.json"]
	if !ok {
		t.Fatal("llm-d-async.json is missing")
	}
	if d.Title != "Async Processor" || d.UID != "llm-d-async" || d.SchemaVersion != 39 || d.GraphTooltip != 1 ||
		d.Time.From != "now-1h" || d.Time.To != "now" || !d.Editable {
		t.Errorf("settings: title %q, uid %q, schema %d, graphTooltip %d, time %s…%s, editable %v",
			d.Title, d.UID, d.SchemaVersion, d.GraphTooltip, d.Time.From, d.Time.To, d.Editable)
	}
	if len(d.Templating.List) != 1 {
		t.Fatalf("%d template variables, want 1", len(d.Templating.List))
	}
	if v := d.Templating.List[0]; v.Name != "namespace" || v.Type != "query" || v.Refresh != 2 || v.IncludeAll ||
		v.queryString() != "label_values("+metrics.Upstream+"request_total, namespace)" {
		t.Errorf("variable: %+v", v)
	}

	const ns = `{namespace="$namespace"}[$__rate_interval]`
	rate := func(m string) string { return "sum(rate(" + metrics.Upstream + m + ns + "))" }
	latency := func(q, by string) string {
		return "histogram_quantile(" + q + ", sum by (" + by + ") (rate(" + metrics.Upstream + "message_latency_time_millis_bucket" + ns + ")))"
	}
	f := func(v float64) *float64 { return &v }
	want := []upstreamPanel{
		{"Request Rate", "timeseries", "reqps", gridPos{8, 12, 0, 0}, []string{rate("request_total")}, []string{"total"}, nil},
		{"Request Rate by Queue", "timeseries", "reqps", gridPos{8, 12, 12, 0},
			[]string{"sum by (queue_name) (rate(" + metrics.Upstream + "request_total" + ns + "))"}, []string{"{{ queue_name }}"}, nil},
		{"Request Outcome Breakdown", "timeseries", "reqps", gridPos{8, 12, 0, 8},
			[]string{rate("successful_requests_total"), rate("failed_requests_total"), rate("request_retries_total"),
				rate("exceeded_deadline_requests_total"), rate("shedded_requests_total")},
			[]string{"successful", "failed", "retries", "deadline exceeded", "shedded"}, nil},
		{"Success Rate", "gauge", "percentunit", gridPos{8, 6, 12, 8},
			[]string{rate("successful_requests_total") + " / " + rate("request_total")}, []string{""},
			[]threshold{{"red", nil}, {"orange", f(0.9)}, {"green", f(0.95)}}},
		{"Retry Rate", "gauge", "percentunit", gridPos{8, 6, 18, 8},
			[]string{rate("request_retries_total") + " / " + rate("request_total")}, []string{""},
			[]threshold{{"green", nil}, {"orange", f(0.3)}, {"red", f(0.5)}}},
		{"Message Latency (p50 / p95 / p99)", "timeseries", "ms", gridPos{8, 12, 0, 16},
			[]string{latency("0.50", "le"), latency("0.95", "le"), latency("0.99", "le")}, []string{"p50", "p95", "p99"}, nil},
		{"Message Latency by Queue (p95)", "timeseries", "ms", gridPos{8, 12, 12, 16},
			[]string{latency("0.95", "le, queue_name")}, []string{"{{ queue_name }}"}, nil},
	}
	if len(d.Panels) != len(want) {
		t.Fatalf("%d panels, want %d", len(d.Panels), len(want))
	}
	for i, w := range want {
		p := d.Panels[i]
		var fc struct {
			Defaults struct {
				Unit       string   `json:"unit"`
				Min        *float64 `json:"min"`
				Max        *float64 `json:"max"`
				Thresholds struct {
					Steps []threshold `json:"steps"`
				} `json:"thresholds"`
				Custom struct {
					DrawStyle   string `json:"drawStyle"`
					FillOpacity int    `json:"fillOpacity"`
				} `json:"custom"`
			} `json:"defaults"`
		}
		if err := json.Unmarshal(p.FieldConfig, &fc); err != nil {
			t.Fatalf("panel %d: fieldConfig: %v", i+1, err)
		}
		if p.Title != w.title || p.Type != w.typ || fc.Defaults.Unit != w.unit || p.GridPos != w.grid {
			t.Errorf("panel %d: %q %s %s %+v, want %q %s %s %+v", i+1, p.Title, p.Type, fc.Defaults.Unit, p.GridPos, w.title, w.typ, w.unit, w.grid)
		}
		var exprs, legends []string
		for _, tg := range p.Targets {
			exprs, legends = append(exprs, tg.Expr), append(legends, tg.LegendFormat)
			if tg.Instant != (w.typ == "gauge") {
				t.Errorf("panel %q: instant %v", p.Title, tg.Instant)
			}
		}
		if !slices.Equal(exprs, w.exprs) || !slices.Equal(legends, w.legends) {
			t.Errorf("panel %q:\n queries %q\n legends %q\nwant\n queries %q\n legends %q", p.Title, exprs, legends, w.exprs, w.legends)
		}
		switch w.typ {
		case "gauge":
			if fc.Defaults.Min == nil || *fc.Defaults.Min != 0 || fc.Defaults.Max == nil || *fc.Defaults.Max != 1 {
				t.Errorf("panel %q: min/max not 0/1", p.Title)
			}
			if got, _ := json.Marshal(fc.Defaults.Thresholds.Steps); string(got) != mustJSON(w.thresholds) {
				t.Errorf("panel %q: thresholds %s, want %s", p.Title, got, mustJSON(w.thresholds))
			}
		case "timeseries":
			if fc.Defaults.Custom.DrawStyle != "line" || fc.Defaults.Custom.FillOpacity != 10 {
				t.Errorf("panel %q: draw style %q, fill opacity %d, want line and 10", p.Title, fc.Defaults.Custom.DrawStyle, fc.Defaults.Custom.FillOpacity)
			}
		}
	}
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// notOnSluiceDashboard are the metrics sluice.json leaves out, and why.
var notOnSluiceDashboard = map[string]string{
	metrics.Upstream + "queue_residence_time_millis": "near 0 by design (docs/metrics.md); the wait is sluice_dispatch_wait_millis",
}

// TestSluiceDashboardShowsEveryMetric: every metric core/metrics defines
// and the transport events are on sluice.json (a new metric needs a panel,
// or a line in notOnSluiceDashboard saying why not).
func TestSluiceDashboardShowsEveryMetric(t *testing.T) {
	c := newChecker(t)
	d, ok := loadDashboards(t)["sluice.json"]
	if !ok {
		t.Fatal("sluice.json is missing")
	}
	shown := map[string]bool{}
	for _, p := range d.allPanels() {
		for _, tg := range p.Targets {
			for _, m := range c.check(substitute(tg.Expr)).metrics {
				shown[m] = true
			}
		}
	}
	for series := range c.ex.series {
		m := c.ex.family(series)
		if strings.HasPrefix(m, "go_") || strings.HasPrefix(m, "process_") {
			continue
		}
		if _, exempt := notOnSluiceDashboard[m]; !shown[m] && !exempt {
			t.Errorf("%s is on no panel of sluice.json: add one, or say in notOnSluiceDashboard why not", m)
		}
	}
	for m := range notOnSluiceDashboard {
		if shown[m] {
			t.Errorf("%s is on sluice.json and in notOnSluiceDashboard", m)
		}
	}
}
