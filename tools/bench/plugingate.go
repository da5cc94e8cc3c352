package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-io/sluice/core/app"
	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/plugins/host"
	"github.com/sluice-io/sluice/transports/memory"
)

// pluginGateTargets: a budget-only plugin must cost little against the
// built-in constant gate, and a per-request Admit round trip stay short.
func pluginGateTargets() []target {
	return []target{
		minimum("ratio", 0.95, "a budget-only plugin gate against the constant gate: its budget is off the hot path"),
		maximum("admit_us_p50", 150, "one Admit round trip to the plugin, at 500 req/s"),
		maximum("admit_us_p99", 1000, "the same, 99th percentile"),
		reportedOnly("ratio_admit", "Admit on every request, under a saturating load"),
		noFailures("failed"),
	}
}

// runPluginGate measures what a plugin gate costs. Requests go through the
// memory transport to a 0-ms simulator on loopback, 64 in flight, three
// ways: with the constant gate (the baseline), with the example plugin
// (examples/gate-plugin, built here) asked for budgets only, and with the
// same plugin asked per request (admit on). ratio is the budget-only
// throughput over the baseline's (target ≥ 0.95). admit_us_p50 and
// admit_us_p99 are the Admit round trips as the pipeline saw them
// (targets ≤ 150 and ≤ 1000 µs) with requests arriving at 500 a second,
// well below what sluice can take, so that they measure the round trip;
// admit_sat_us_p50 and _p99 are the same under the saturating load of the
// throughput runs, where Admit calls also queue for the CPU. The order
// alternates run by run (the plugin first on odd runs, the constant gate on
// even ones); ratios are medians of each run's ratio; failed counts every
// result other than a 200 in all the loads.
func runPluginGate(ctx context.Context, o options) (figures, error) {
	const n = 30_000
	dir, err := os.MkdirTemp("", "sluice-bench-plugin-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	bin, err := buildExamplePlugin(ctx, dir)
	if err != nil {
		return nil, err
	}
	budget := filepath.Join(dir, "budget")
	if err := os.WriteFile(budget, []byte("1"), 0o600); err != nil {
		return nil, err
	}
	url, stop, err := zeroLatencyGateway()
	if err != nil {
		return nil, err
	}
	defer stop()
	plugin := map[string]string{"path": bin, "file": budget}
	admit := map[string]string{"path": bin, "file": budget, "admit": "true"}
	var base, budgetOnly, withAdmit, p50, p99, satP50, satP99 []float64
	failed := 0
	load := func(what string, n, rate int, gateType string, params map[string]string, into *[]float64) side {
		return func(ctx context.Context, _ int) error {
			r, err := pluginLoad(ctx, n, rate, url, gateType, params)
			if err != nil {
				return fmt.Errorf("%s: %w", what, err)
			}
			failed += r.failed
			switch {
			case into != nil:
				*into = append(*into, r.perSecond)
				if gateType == host.Type && params["admit"] == "true" {
					satP50, satP99 = append(satP50, r.admitP50), append(satP99, r.admitP99)
				}
			default: // paced: the round trip alone
				p50, p99 = append(p50, r.admitP50), append(p99, r.admitP99)
			}
			return nil
		}
	}
	err = alternate(ctx, o.runs,
		load("plugin gate", n, 0, host.Type, plugin, &budgetOnly),
		load("plugin gate with admit", n, 0, host.Type, admit, &withAdmit),
		load("plugin gate with admit, paced", 1500, 500, host.Type, admit, nil),
		load("constant gate", n, 0, "constant", map[string]string{"budget": "1"}, &base))
	if err != nil {
		return nil, err
	}
	return figures{
		"requests":            n,
		"throughput_constant": median(base),
		"throughput_plugin":   median(budgetOnly),
		"ratio":               medianRatio(budgetOnly, base),
		"throughput_admit":    median(withAdmit),
		"ratio_admit":         medianRatio(withAdmit, base),
		"admit_us_p50":        median(p50),
		"admit_us_p99":        median(p99),
		"admit_sat_us_p50":    median(satP50),
		"admit_sat_us_p99":    median(satP99),
		"failed":              float64(failed),
	}, nil
}

// buildExamplePlugin builds examples/gate-plugin (a module of its own)
// into dir.
func buildExamplePlugin(ctx context.Context, dir string) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		return "", fmt.Errorf("find the repository (run the bench from it): %w", err)
	}
	bin := filepath.Join(dir, "gate-plugin")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, ".")
	build.Dir = filepath.Join(strings.TrimSpace(string(out)), "examples", "gate-plugin")
	if msg, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build the example plugin: %w: %s", err, msg)
	}
	return bin, nil
}

// pluginRun is what one pluginLoad measured.
type pluginRun struct {
	perSecond          float64 // ok results per second
	failed             int     // results other than a first 200
	admitP50, admitP99 float64 // µs; 0 without Admit
}

// timedPluginAdmit is the plugin gate with admit on, timing every Admit.
type timedPluginAdmit struct {
	*host.AdmitGate
	mu    sync.Mutex
	times []time.Duration
}

// Admit times the plugin's Admit.
func (t *timedPluginAdmit) Admit(ctx context.Context, req *wire.Request) (gate.Decision, error) {
	start := time.Now()
	d, err := t.AdmitGate.Admit(ctx, req)
	el := time.Since(start)
	t.mu.Lock()
	t.times = append(t.times, el)
	t.mu.Unlock()
	return d, err
}

// pluginLoad pushes n requests through one queue gated by gateType, waiting
// for the gate to open before timing: all at once, or rate a second.
func pluginLoad(ctx context.Context, n, rate int, url, gateType string, params map[string]string) (pluginRun, error) {
	ad, err := adapters()
	if err != nil {
		return pluginRun{}, err
	}
	var timed *timedPluginAdmit
	err = ad.Gates.Register(host.Type, func(p gate.Params, env gate.Env) (gate.Gate, error) {
		g, err := host.Factory(p, env)
		if ag, ok := g.(*host.AdmitGate); ok {
			timed = &timedPluginAdmit{AdmitGate: ag}
			return timed, nil
		}
		return g, err
	})
	if err != nil {
		return pluginRun{}, err
	}
	raw := map[string]json.RawMessage{}
	for k, v := range params {
		raw[k], _ = json.Marshal(v)
	}
	mem := memory.New(memory.Options{})
	const q, res = "bench:requests", "bench:results"
	cfg := &config.Config{
		Transport: memory.Name, Concurrency: 64, MetricsPort: -1, HealthPort: -1,
		DrainTimeout: config.Duration(10 * time.Second),
		TransportConfig: config.TransportConfig{ResultQueueName: res, Queues: []config.Queue{{
			Queue: transport.Queue{Name: q}, IGWBaseURL: url, GateType: gateType, GateParams: raw,
		}}},
	}
	a, err := app.New(cfg, app.Options{Adapters: ad, Transport: mem, Registry: prometheus.NewRegistry()})
	if err != nil {
		return pluginRun{}, err
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- a.Run(runCtx) }()
	deadline := float64(time.Now().Add(time.Hour).UnixMilli()) / 1000
	enqueue := func(i int) error {
		b, _ := json.Marshal(map[string]any{
			"id": "r" + strconv.Itoa(i), "deadline": deadline,
			"payload":  json.RawMessage(`{"model":"m","prompt":"hello","max_tokens":8}`),
			"metadata": map[string]string{"job_id": "bench", "tenant": "t" + strconv.Itoa(i%16)},
		})
		return mem.Enqueue(q, b)
	}
	wait := func(want int) error {
		for {
			got, more := mem.ResultCount(res)
			if got >= want {
				return nil
			}
			select {
			case <-more:
			case <-time.After(time.Minute):
				return fmt.Errorf("%d of %d results after a minute", got, want)
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	// Warm up: one request through, so the plugin runs and the gate is open.
	if err := enqueue(-1); err != nil {
		return pluginRun{}, err
	}
	if err := wait(1); err != nil {
		return pluginRun{}, errors.Join(err, stopApp(stop, errc))
	}
	if timed != nil {
		timed.mu.Lock()
		timed.times = timed.times[:0]
		timed.mu.Unlock()
	}
	start := time.Now()
	var pace <-chan time.Time
	if rate > 0 {
		tick := time.NewTicker(time.Second / time.Duration(rate))
		defer tick.Stop()
		pace = tick.C
	}
	for i := range n {
		if pace != nil {
			<-pace
		}
		if err := enqueue(i); err != nil {
			return pluginRun{}, err
		}
	}
	if err := wait(n + 1); err != nil {
		return pluginRun{}, errors.Join(err, stopApp(stop, errc))
	}
	el := time.Since(start)
	if err := stopApp(stop, errc); err != nil {
		return pluginRun{}, err
	}
	// The warm-up's result came first (it was waited for alone).
	var t resultTally
	t.addAll(mem.Results(res)[1:])
	out := pluginRun{perSecond: float64(t.ok) / el.Seconds(), failed: t.failed + max(0, n-t.total())}
	if timed != nil {
		out.admitP50, out.admitP99 = quantileUS(timed.times, 0.5), quantileUS(timed.times, 0.99)
	}
	return out, nil
}

func stopApp(stop func(), errc <-chan error) error {
	stop()
	return <-errc
}

// quantileUS is the q-quantile of ds in microseconds (ds is sorted).
func quantileUS(ds []time.Duration, q float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return float64(ds[int(q*float64(len(ds)-1))].Nanoseconds()) / 1e3
}
