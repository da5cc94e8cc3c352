package deploy

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/sluice-io/sluice/internal/testenv"
)

// metricName finds the names of sluice's and upstream's metrics in PromQL.
var metricName = regexp.MustCompile(`\b(llm_d_async_async_[a-z_]+|sluice_[a-z_]+)\b`)

// Every metric the alert expressions read is one docs/metrics.md lists,
// that is one sluice exports.
func TestAlertsReadExportedMetrics(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile(filepath.Join("..", "docs", "metrics.md"))
	if err != nil {
		t.Fatal(err)
	}
	listed := func(name string) bool {
		short := strings.TrimPrefix(name, "llm_d_async_async_")
		return strings.Contains(string(doc), "`"+short+"`") || strings.Contains(string(doc), "`"+short+"{")
	}
	groups := groupsOf(t, render(t, withSuite("--set", "ap.prometheusRule.enabled=true")...))
	seen := 0
	for _, g := range groups {
		for _, r := range g.Rules {
			names := metricName.FindAllString(r.Expr, -1)
			if len(names) == 0 {
				t.Errorf("%s: no metric found in %q", r.Alert, r.Expr)
			}
			for _, n := range names {
				seen++
				if !listed(n) {
					t.Errorf("%s reads %s, which docs/metrics.md does not list", r.Alert, n)
				}
			}
		}
	}
	if seen == 0 {
		t.Fatal("no metric names found")
	}
}

// promRules writes the rendered groups as a Prometheus rule file.
func promRules(t *testing.T, dir string, groups []ruleGroup) string {
	t.Helper()
	type out struct {
		Alert       string            `yaml:"alert"`
		Expr        string            `yaml:"expr"`
		For         string            `yaml:"for"`
		Labels      map[string]string `yaml:"labels"`
		Annotations map[string]string `yaml:"annotations"`
	}
	type group struct {
		Name  string `yaml:"name"`
		Rules []out  `yaml:"rules"`
	}
	var doc struct {
		Groups []group `yaml:"groups"`
	}
	for _, g := range groups {
		og := group{Name: g.Name}
		for _, r := range g.Rules {
			og.Rules = append(og.Rules, out(r))
		}
		doc.Groups = append(doc.Groups, og)
	}
	b, err := yaml.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(f, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// The rendered PrometheusRule is valid for Prometheus (promtool check
// rules), and its alerts fire on series that should fire them, with the
// labels and annotations they promise, and stay quiet otherwise (promtool
// test rules).
func TestAlertsFire(t *testing.T) {
	t.Parallel()
	promtool := testenv.LookPath(t, "promtool", "prometheus")
	groups := groupsOf(t, render(t, withSuite("--set", "ap.prometheusRule.enabled=true")...))
	dir := t.TempDir()
	rules := promRules(t, dir, groups)
	if out, err := exec.Command(promtool, "check", "rules", rules).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	byName := map[string]rule{}
	for _, g := range groups {
		for _, r := range g.Rules {
			byName[r.Alert] = r
		}
	}
	ns := `namespace="` + namespace + `"`
	// One minute per sample, 40 minutes: 100 first attempts a minute, 80
	// retries, 20 successes, 50 shed, no deadline exceeded; one gate
	// failing from the start and one healthy; late results from minute 2;
	// one dead-lettered message at minute 21 on queue q (evaluated at 30m).
	series := map[string]string{
		`llm_d_async_async_request_total{` + ns + `,pod="p"}`:                                                "0+100x40",
		`llm_d_async_async_request_retries_total{` + ns + `,pod="p"}`:                                        "0+80x40",
		`llm_d_async_async_successful_requests_total{` + ns + `,pod="p"}`:                                    "0+20x40",
		`llm_d_async_async_shedded_requests_total{` + ns + `,pod="p"}`:                                       "0+50x40",
		`llm_d_async_async_exceeded_deadline_requests_total{` + ns + `,pod="p"}`:                             "0x40",
		`sluice_gate_failing{` + ns + `,pod="p",gate="prometheus-budget#1"}`:                                 "1x40",
		`sluice_gate_failing{` + ns + `,pod="p",gate="constant#1"}`:                                          "0x40",
		`sluice_transport_events_total{` + ns + `,pod="p",transport="redis-sortedset",event="late_results"}`: "0 0 1+1x38",
		`sluice_transport_events_total{` + ns + `,pod="p",transport="redis-sortedset",event="reclaimed"}`:    "0+5x40",
		`sluice_dead_lettered_total{` + ns + `,pod="p",queue_id="q",queue_name="q",pool_name="default"}`:     "0x20 1x20",
		`sluice_dead_lettered_total{` + ns + `,pod="p",queue_id="r",queue_name="r",pool_name="default"}`:     "0x40",
		`sluice_gate_events_total{` + ns + `,pod="p",gate="plugin",event="plugin_losses"}`:                   "0+1x40",
		`sluice_gate_events_total{` + ns + `,pod="p",gate="plugin",event="plugin_starts"}`:                   "1+1x40",
		`sluice_gate_events_total{` + ns + `,pod="p",gate="steady",event="plugin_losses"}`:                   "0x40",
	}
	type alert struct {
		labels map[string]string
	}
	fire := map[string][]alert{
		"AsyncProcessorHighRetryRate":            {{map[string]string{"severity": "warning"}}},
		"AsyncProcessorHighDeadlineExceededRate": nil,
		"AsyncProcessorLowSuccessRate":           {{map[string]string{"severity": "critical"}}},
		"AsyncProcessorHighShedRate":             {{map[string]string{"severity": "warning"}}},
		"SluiceGateFailing":                      {{map[string]string{"severity": "warning", "namespace": namespace, "gate": "prometheus-budget#1"}}},
		"SluiceLateResults":                      {{map[string]string{"severity": "warning", "namespace": namespace, "transport": "redis-sortedset"}}},
		"SluiceDeadLettered":                     {{map[string]string{"severity": "warning", "namespace": namespace, "queue_name": "q"}}},
		"SluicePluginRestarting":                 {{map[string]string{"severity": "warning", "namespace": namespace, "gate": "plugin"}}},
	}
	var b strings.Builder
	fmt.Fprintf(&b, "rule_files: [%s]\nevaluation_interval: 1m\ntests:\n- interval: 1m\n  input_series:\n", filepath.Base(rules))
	keys := make([]string, 0, len(series))
	for k := range series {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "  - series: %q\n    values: %q\n", k, series[k])
	}
	b.WriteString("  alert_rule_test:\n")
	names := make([]string, 0, len(fire))
	for n := range fire {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		r, ok := byName[name]
		if !ok {
			t.Fatalf("alert %s not rendered", name)
		}
		fmt.Fprintf(&b, "  - eval_time: 30m\n    alertname: %s\n", name)
		if len(fire[name]) == 0 {
			b.WriteString("    exp_alerts: []\n")
			continue
		}
		b.WriteString("    exp_alerts:\n")
		for _, a := range fire[name] {
			b.WriteString("    - exp_labels:\n")
			for _, k := range sortedKeys(a.labels) {
				fmt.Fprintf(&b, "        %s: %q\n", k, a.labels[k])
			}
			b.WriteString("      exp_annotations:\n")
			for _, k := range sortedKeys(r.Annotations) {
				fmt.Fprintf(&b, "        %s: %q\n", k, expand(r.Annotations[k], a.labels))
			}
		}
	}
	test := filepath.Join(dir, "test.yaml")
	if err := os.WriteFile(test, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(promtool, "test", "rules", filepath.Base(test))
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("promtool test rules: %v\n%s\ntest file:\n%s", err, out, b.String())
	}
}

// expand replaces {{ $labels.x }} in an annotation by the label's value,
// as Prometheus does.
func expand(s string, labels map[string]string) string {
	return regexp.MustCompile(`\{\{ \$labels\.([a-z_]+) \}\}`).ReplaceAllStringFunc(s, func(m string) string {
		name := regexp.MustCompile(`\$labels\.([a-z_]+)`).FindStringSubmatch(m)[1]
		return labels[name]
	})
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
