package app

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/metrics"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/transports/memory"
)

// upstreamAlerts are the four alert rules of upstream's Helm chart
// (UPSTREAM-CHART.md §11), with the chart's default thresholds and `for`
// durations; namespace "ns" stands for the release namespace.
var upstreamAlerts = []struct {
	name, outcome, op string
	threshold         float64
	forDur            string
	severity          string
}{
	{"AsyncProcessorHighRetryRate", "request_retries_total", ">", 0.5, "15m", "warning"},
	{"AsyncProcessorHighDeadlineExceededRate", "exceeded_deadline_requests_total", ">", 0.1, "10m", "warning"},
	{"AsyncProcessorLowSuccessRate", "successful_requests_total", "<", 0.9, "10m", "critical"},
	{"AsyncProcessorHighShedRate", "shedded_requests_total", ">", 0.1, "10m", "warning"},
}

// alertRules renders upstream's rule group.
func alertRules() string {
	var b strings.Builder
	b.WriteString("groups:\n- name: llm-d-async.rules\n  rules:\n")
	for _, a := range upstreamAlerts {
		fmt.Fprintf(&b, "  - alert: %s\n    expr: ( sum(rate(%s%s{namespace=\"ns\"}[5m])) / sum(rate(%srequest_total{namespace=\"ns\"}[5m])) ) %s %g\n    for: %s\n    labels:\n      severity: %s\n",
			a.name, metrics.Upstream, a.outcome, metrics.Upstream, a.op, a.threshold, a.forDur, a.severity)
	}
	return b.String()
}

// counts are the counters the alerts read, after one replay of the mix.
type counts map[string]float64

// firing returns the alerts counts should fire, by plain arithmetic.
func (c counts) firing() map[string]bool {
	out := map[string]bool{}
	for _, a := range upstreamAlerts {
		r := c[a.outcome] / c["request_total"]
		out[a.name] = (a.op == ">" && r > a.threshold) || (a.op == "<" && r < a.threshold)
	}
	return out
}

// promtoolCheck evaluates upstream's rules with the real PromQL engine
// (promtool test rules) over series that repeat c every minute for 40
// minutes, and checks that exactly the alerts of want fire.
func promtoolCheck(t *testing.T, promtool, label string, c counts, want map[string]bool) {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), []byte(alertRules()), 0o600); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	b.WriteString("rule_files: [rules.yaml]\nevaluation_interval: 1m\ntests:\n- interval: 1m\n  input_series:\n")
	for name, v := range c {
		fmt.Fprintf(&b, "  - series: '%s%s{namespace=\"ns\"}'\n    values: '0+%gx40'\n", metrics.Upstream, name, v)
	}
	b.WriteString("  alert_rule_test:\n")
	for _, a := range upstreamAlerts {
		fmt.Fprintf(&b, "  - eval_time: 40m\n    alertname: %s\n", a.name)
		if want[a.name] {
			fmt.Fprintf(&b, "    exp_alerts:\n    - exp_labels:\n        severity: %s\n", a.severity)
		} else {
			b.WriteString("    exp_alerts: []\n")
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "test.yaml"), []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(promtool, "test", "rules", "test.yaml")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("%s: upstream's alerts over these numbers (%v) do not fire as %v:\n%s", label, c, want, out)
	}
}

// gathered sums sluice's upstream-named counters over their labels.
func gathered(t *testing.T, reg *prometheus.Registry) counts {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	c := counts{}
	for _, mf := range mfs {
		name, ok := strings.CutPrefix(mf.GetName(), metrics.Upstream)
		if !ok || mf.GetType().String() != "COUNTER" || name == "gate_decisions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			c[name] += m.GetCounter().GetValue()
		}
	}
	return c
}

// One traffic mix replayed through sluice: its counters equal what
// upstream's counting rules (UPSTREAM.md §6) give for the same per-request
// history, and upstream's alert rules, evaluated by promtool, fire the
// same alerts on both. Upstream itself cannot run here, so its numbers are
// its rules applied to what the gateway saw: every request of the mix is
// picked up once with retry_count 0; a retry is counted per failed attempt
// that had time left; 429s are counted per attempt; success is a final
// status below 400; a final 4xx is a failure; a deadline that passed
// before dispatch or cut retries short is an exceeded deadline.
func TestUpstreamAlertsOnReplayedMix(t *testing.T) {
	promtool := testenv.LookPath(t, "promtool", "prometheus")
	gw, url := newGateway(t)
	reg := prometheus.NewRegistry()
	mem := memory.New(memory.Options{})
	cfg := &config.Config{
		Transport: memory.Name, Concurrency: 16, MetricsPort: -1, HealthPort: -1,
		DrainTimeout: config.Duration(time.Second),
		Retry:        config.Retry{Base: config.Duration(50 * time.Millisecond), Max: config.Duration(200 * time.Millisecond), Jitter: 0.1},
		TransportConfig: config.TransportConfig{ResultQueueName: e2eResults,
			Queues: []config.Queue{{Queue: transport.Queue{Name: e2eQueue}, IGWBaseURL: url}}},
	}
	h := startAppWith(t, cfg, Options{Transport: mem, Registry: reg})

	// The mix: 100 requests.
	type kind struct {
		n        int
		script   map[string]any
		deadline time.Duration
	}
	mix := map[string]kind{
		"ok":      {71, nil, time.Minute},
		"shed":    {12, map[string]any{"fail_times": 1, "fail_status": 429}, time.Minute}, // one 429, then success
		"busy":    {8, map[string]any{"fail_times": 2}, time.Minute},                      // two 503s, then success
		"bad":     {2, map[string]any{"status": 400}, time.Minute},                        // a final 4xx
		"expired": {4, nil, -time.Second},                                                 // deadline passed before dispatch
		"down":    {3, map[string]any{"fail_times": 1000}, 700 * time.Millisecond},        // 503s until the deadline
	}
	total := 0
	for name, k := range mix {
		for i := range k.n {
			if err := h.mem.Enqueue(e2eQueue, request(fmt.Sprintf("%s-%d", name, i), time.Now().Add(k.deadline), k.script)); err != nil {
				t.Fatal(err)
			}
		}
		total += k.n
	}
	res := h.waitResults(total, 20*time.Second)

	// Upstream's numbers, from the history the gateway recorded.
	up := counts{"request_total": float64(total)}
	deliveries := 0.0 // what sluice counted before (every delivery), for the sensitivity check below
	for name, k := range mix {
		for i := range k.n {
			id := fmt.Sprintf("%s-%d", name, i)
			attempts := len(gw.attempts(id))
			deliveries += float64(max(attempts, 1))
			r := res[id]
			switch name {
			case "ok", "shed", "busy":
				if !r.OK() {
					t.Fatalf("%s: %+v", id, r)
				}
				up["successful_requests_total"]++
				up["request_retries_total"] += float64(attempts - 1)
				if name == "shed" {
					up["shedded_requests_total"]++
				}
			case "bad":
				up["failed_requests_total"]++
			case "expired":
				if r.ErrorCode != wire.CodeDeadlineExceeded || attempts != 0 {
					t.Fatalf("%s: %+v after %d attempts", id, r, attempts)
				}
				up["exceeded_deadline_requests_total"]++
			case "down":
				if r.StatusCode != 503 || attempts < 2 {
					t.Fatalf("%s: %+v after %d attempts", id, r, attempts)
				}
				// every failed attempt but the last had time left to retry
				up["request_retries_total"] += float64(attempts - 1)
				up["exceeded_deadline_requests_total"]++
			}
		}
	}
	got := gathered(t, reg)
	for name, want := range up {
		if got[name] != want {
			t.Errorf("%s%s = %v, upstream's rules give %v", metrics.Upstream, name, got[name], want)
		}
	}
	for _, name := range []string{"failed_requests_total", "shedded_requests_total"} {
		if _, ok := up[name]; !ok && got[name] != 0 {
			t.Errorf("%s%s = %v, upstream's rules give 0", metrics.Upstream, name, got[name])
		}
	}

	want := up.firing()
	if !want["AsyncProcessorHighShedRate"] || want["AsyncProcessorLowSuccessRate"] {
		t.Fatalf("the mix no longer exercises both a firing and a quiet alert: %v", want)
	}
	promtoolCheck(t, promtool, "upstream's numbers", up, want)
	promtoolCheck(t, promtool, "sluice's numbers", got, want)

	// The check can fail: with request_total counting every delivery (as
	// sluice did before), the critical LowSuccessRate fires falsely.
	old := counts{}
	for k, v := range got {
		old[k] = v
	}
	old["request_total"] = deliveries
	if !old.firing()["AsyncProcessorLowSuccessRate"] {
		t.Fatalf("the sensitivity check is void: %v", old)
	}
	promtoolCheck(t, promtool, "every-delivery request_total", old, old.firing())
}
