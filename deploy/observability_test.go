package deploy

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// rule is one rule of a PrometheusRule group.
type rule struct {
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	For         string            `json:"for"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

type ruleGroup struct {
	Name  string `json:"name"`
	Rules []rule `json:"rules"`
}

// groupsOf returns the groups of the one PrometheusRule of objs.
func groupsOf(t *testing.T, objs objects) []ruleGroup {
	t.Helper()
	var pr struct {
		Spec struct {
			Groups []ruleGroup `json:"groups"`
		} `json:"spec"`
	}
	decode(t, objs.one(t, "PrometheusRule"), &pr)
	return pr.Spec.Groups
}

func alertNames(g ruleGroup) []string {
	var names []string
	for _, r := range g.Rules {
		names = append(names, r.Alert)
	}
	return names
}

// upstreamExpr is upstream's alert expression (UPSTREAM-CHART.md §11).
func upstreamExpr(outcome, op, threshold string) string {
	return `( sum(rate(llm_d_async_async_` + outcome + `{namespace="` + namespace + `"}[5m])) / sum(rate(llm_d_async_async_request_total{namespace="` +
		namespace + `"}[5m])) ) ` + op + ` ` + threshold
}

// The observability suite of upstream's chart tests, plus sluice's alerts
// and PodMonitor endpoint settings.
func TestChartObservability(t *testing.T) {
	t.Parallel()
	t.Run("nothing by default", func(t *testing.T) {
		t.Parallel()
		objs := render(t, withSuite()...)
		for _, k := range []string{"PodMonitor", "PrometheusRule"} {
			if n := len(objs.ofKind(k)); n != 0 {
				t.Errorf("%d %s rendered by default", n, k)
			}
		}
		if objs.find("ConfigMap", "release-name-sluice-dashboards") != nil {
			t.Errorf("dashboards ConfigMap rendered by default")
		}
	})
	t.Run("pod monitor", func(t *testing.T) {
		t.Parallel()
		objs := render(t, withSuite("--set", "ap.podMonitor.enabled=true", "--set", "ap.podMonitor.interval=15s", "--set", "ap.podMonitor.labels.monitoring\\.opendatahub\\.io/scrape=true")...)
		pm := objs.find("PodMonitor", "release-name-sluice")
		if pm == nil {
			t.Fatalf("no PodMonitor (rendered %s)", objs.summary())
		}
		want := map[string]any{"port": "metrics", "path": "/metrics", "interval": "15s"}
		if got := pm.get("spec.podMetricsEndpoints[0]"); !reflect.DeepEqual(got, want) {
			t.Errorf("endpoint %v, want %v", got, want)
		}
		if got := str(pm.get(`metadata.labels["monitoring.opendatahub.io/scrape"]`)); got != "true" {
			t.Errorf("label %q, want \"true\"", got)
		}
		sel := map[string]any{"app.kubernetes.io/name": "sluice", "app.kubernetes.io/instance": release}
		if got := pm.get("spec.selector.matchLabels"); !reflect.DeepEqual(got, sel) {
			t.Errorf("selector %v, want %v", got, sel)
		}
		if pm.get("metadata.namespace") != namespace {
			t.Errorf("namespace %v", pm.get("metadata.namespace"))
		}
	})
	t.Run("pod monitor default interval and endpoint settings", func(t *testing.T) {
		t.Parallel()
		objs := render(t, append(withSuite("--set", "ap.podMonitor.enabled=true"),
			values(t, "sluice:\n  podMonitor:\n    endpoint:\n      authorization: {type: Bearer, credentials: {name: prom-token, key: token}}\n      scheme: http\n")...)...)
		ep := objs.one(t, "PodMonitor").get("spec.podMetricsEndpoints[0]").(map[string]any)
		if ep["interval"] != "30s" || ep["scheme"] != "http" || ep["port"] != "metrics" || ep["authorization"] == nil {
			t.Errorf("endpoint %v", ep)
		}
	})
	t.Run("prometheus rule", func(t *testing.T) {
		t.Parallel()
		objs := render(t, withSuite("--set", "ap.prometheusRule.enabled=true", "--set", "ap.prometheusRule.labels.team=inference")...)
		pr := objs.find("PrometheusRule", "release-name-sluice")
		if pr == nil || str(pr.get("metadata.labels.team")) != "inference" || pr.get("metadata.namespace") != namespace {
			t.Fatalf("PrometheusRule %v", pr)
		}
		groups := groupsOf(t, objs)
		if len(groups) != 2 || groups[0].Name != "llm-d-async.rules" || groups[1].Name != "sluice.rules" {
			t.Fatalf("groups %+v, want llm-d-async.rules and sluice.rules", groups)
		}
		want := []rule{
			{"AsyncProcessorHighRetryRate", upstreamExpr("request_retries_total", ">", "0.5"), "15m", map[string]string{"severity": "warning"}, nil},
			{"AsyncProcessorHighDeadlineExceededRate", upstreamExpr("exceeded_deadline_requests_total", ">", "0.1"), "10m", map[string]string{"severity": "warning"}, nil},
			{"AsyncProcessorLowSuccessRate", upstreamExpr("successful_requests_total", "<", "0.9"), "10m", map[string]string{"severity": "critical"}, nil},
			{"AsyncProcessorHighShedRate", upstreamExpr("shedded_requests_total", ">", "0.1"), "10m", map[string]string{"severity": "warning"}, nil},
		}
		if len(groups[0].Rules) != 4 {
			t.Fatalf("upstream group %q, want 4 alerts", alertNames(groups[0]))
		}
		for i, w := range want {
			got := groups[0].Rules[i]
			if got.Alert != w.Alert || got.Expr != w.Expr || got.For != w.For || !reflect.DeepEqual(got.Labels, w.Labels) {
				t.Errorf("rule %d:\n got %+v\nwant %+v", i, got, w)
			}
			if got.Annotations["summary"] == "" || !strings.Contains(got.Annotations["description"], namespace) {
				t.Errorf("%s annotations %v: want a summary and a description naming the namespace", got.Alert, got.Annotations)
			}
		}
		wantSluice := []rule{
			{"SluiceGateFailing", `max by (namespace, gate) (sluice_gate_failing{namespace="` + namespace + `"}) == 1`, "5m", map[string]string{"severity": "warning"}, nil},
			{"SluiceLateResults", `sum by (namespace, transport) (rate(sluice_transport_events_total{namespace="` + namespace + `",event="late_results"}[5m])) > 0`, "1m", map[string]string{"severity": "warning"}, nil},
			{"SluiceDeadLettered", `sum by (namespace, queue_name) (increase(sluice_dead_lettered_total{namespace="` + namespace + `"}[15m])) > 0`, "0m", map[string]string{"severity": "warning"}, nil},
			{"SluicePluginRestarting", `sum by (namespace, gate) (increase(sluice_gate_events_total{namespace="` + namespace + `",event=~"plugin_losses|plugin_start_failures"}[10m])) > 0`, "10m", map[string]string{"severity": "warning"}, nil},
		}
		if len(groups[1].Rules) != len(wantSluice) {
			t.Fatalf("sluice group %q", alertNames(groups[1]))
		}
		for i, w := range wantSluice {
			got := groups[1].Rules[i]
			if got.Alert != w.Alert || got.Expr != w.Expr || got.For != w.For || !reflect.DeepEqual(got.Labels, w.Labels) {
				t.Errorf("rule %d:\n got %+v\nwant %+v", i, got, w)
			}
		}
	})
	t.Run("prometheus rule tuning", func(t *testing.T) {
		t.Parallel()
		objs := render(t, withSuite("--set", "ap.prometheusRule.enabled=true",
			"--set", "ap.prometheusRule.rules.highRetryRate.enabled=false", "--set", "ap.prometheusRule.rules.highShedRate.enabled=false",
			"--set", "ap.prometheusRule.rules.lowSuccessRate.threshold=0.75", "--set", "ap.prometheusRule.rules.lowSuccessRate.for=20m",
			"--set", "sluice.alerts.gateFailing.enabled=false", "--set", "sluice.alerts.deadLettered.window=1h", "--set", "sluice.alerts.deadLettered.severity=critical",
			"--set", "sluice.alerts.lateResults.for=10m")...)
		groups := groupsOf(t, objs)
		if got := alertNames(groups[0]); !slices.Equal(got, []string{"AsyncProcessorHighDeadlineExceededRate", "AsyncProcessorLowSuccessRate"}) {
			t.Errorf("upstream alerts %q, want 2", got)
		}
		low := groups[0].Rules[1]
		if low.Expr != upstreamExpr("successful_requests_total", "<", "0.75") || low.For != "20m" || !strings.Contains(low.Annotations["description"], "0.75") {
			t.Errorf("tuned rule %+v", low)
		}
		if got := alertNames(groups[1]); !slices.Equal(got, []string{"SluiceLateResults", "SluiceDeadLettered", "SluicePluginRestarting"}) {
			t.Errorf("sluice alerts %q", got)
		}
		dl := groups[1].Rules[1]
		if !strings.Contains(dl.Expr, "[1h]") || dl.Labels["severity"] != "critical" || groups[1].Rules[0].For != "10m" {
			t.Errorf("tuned sluice rules %+v", groups[1].Rules)
		}
		objs = render(t, withSuite("--set", "ap.prometheusRule.enabled=true", "--set", "sluice.alerts.gateFailing.enabled=false",
			"--set", "sluice.alerts.lateResults.enabled=false", "--set", "sluice.alerts.deadLettered.enabled=false",
			"--set", "sluice.alerts.pluginRestarting.enabled=false")...)
		if groups := groupsOf(t, objs); len(groups) != 1 {
			t.Errorf("groups %+v: want no sluice group when its alerts are off", groups)
		}
	})
	t.Run("dashboards", func(t *testing.T) {
		t.Parallel()
		objs := render(t, withSuite("--set", "ap.grafana.dashboards.enabled=true")...)
		cm := objs.find("ConfigMap", "release-name-sluice-dashboards")
		if cm == nil || str(cm.get("metadata.labels.grafana_dashboard")) != "1" || cm.get("metadata.namespace") != namespace {
			t.Fatalf("dashboards ConfigMap %v", cm)
		}
		files, _ := filepath.Glob(filepath.Join(chartDir, "files", "dashboards", "*.json"))
		data, _ := cm.get("data").(map[string]any)
		if len(data) != len(files) {
			t.Errorf("data holds %d keys, the chart %d dashboards (%q)", len(data), len(files), files)
		}
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			if got := str(data[filepath.Base(f)]); got != string(b) {
				t.Errorf("data[%s] differs from %s", filepath.Base(f), f)
			}
		}
		objs = render(t, withSuite("--set", "ap.grafana.dashboards.enabled=true", "--set", "ap.grafana.dashboards.label=custom_label", "--set", "ap.grafana.dashboards.labelValue=custom")...)
		if got := str(objs.find("ConfigMap", "release-name-sluice-dashboards").get("metadata.labels.custom_label")); got != "custom" {
			t.Errorf("custom label %q", got)
		}
	})
	t.Run("model server monitor", func(t *testing.T) {
		t.Parallel()
		objs := render(t, withSuite("--set", "ap.modelServerMonitor.enabled=true")...)
		pm := objs.find("PodMonitor", "release-name-sluice-modelserver")
		if pm == nil {
			t.Fatalf("no model-server PodMonitor (rendered %s)", objs.summary())
		}
		if pm.get("metadata.namespace") != nil || pm.get("spec.namespaceSelector") != nil {
			t.Errorf("namespace %v, namespaceSelector %v: want neither (upstream)", pm.get("metadata.namespace"), pm.get("spec.namespaceSelector"))
		}
		if got := pm.get("spec.selector.matchLabels"); !reflect.DeepEqual(got, map[string]any{"llm-d.ai/role": "decode"}) {
			t.Errorf("selector %v", got)
		}
		want := map[string]any{"port": "modelserver", "path": "/metrics", "interval": "15s", "relabelings": []any{
			map[string]any{"sourceLabels": []any{"__meta_kubernetes_pod_label_inference_pool"}, "targetLabel": "inference_pool"}}}
		if got := pm.get("spec.podMetricsEndpoints[0]"); !reflect.DeepEqual(got, want) {
			t.Errorf("endpoint %v, want %v", got, want)
		}
		objs = render(t, append(withSuite("--set", "ap.modelServerMonitor.enabled=true", "--set", "ap.modelServerMonitor.inferencePool=pool-a"),
			values(t, "ap:\n  modelServerMonitor:\n    namespaceSelector:\n      matchNames: [llm-d-optimized-baseline]\n")...)...)
		pm = objs.one(t, "PodMonitor")
		if got := pm.get("spec.namespaceSelector"); !reflect.DeepEqual(got, map[string]any{"matchNames": []any{"llm-d-optimized-baseline"}}) {
			t.Errorf("namespaceSelector %v", got)
		}
		second := map[string]any{"sourceLabels": []any{"inference_pool"}, "regex": "^$", "targetLabel": "inference_pool", "replacement": "pool-a"}
		if got := pm.get("spec.podMetricsEndpoints[0].relabelings[1]"); !reflect.DeepEqual(got, second) {
			t.Errorf("second relabeling %v, want %v", got, second)
		}
	})
}
