package app

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/transports/memory"
)

func checkConfig(mutate func(*config.Config)) *config.Config {
	c := &config.Config{TransportConfig: config.TransportConfig{ResultQueueName: "r",
		Queues: []config.Queue{{Queue: transport.Queue{Name: "q"}, IGWBaseURL: "http://gw"}}}}
	if mutate != nil {
		mutate(c)
	}
	return c
}

// Check reports the config's problems, and else every component's own, with
// where it is.
func TestCheck(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*config.Config)
		want   []string // substrings of the error; none: valid
	}{
		{"valid", nil, nil},
		{"unknown gate type", func(c *config.Config) { c.TransportConfig.Queues[0].GateType = "nope" },
			[]string{`transport_config.queues[0].gate_type: unknown gate type "nope" (known: constant)`}},
		{"unknown transport", func(c *config.Config) { c.Transport = "kafka" },
			[]string{`transport: unknown transport "kafka" (known: memory)`}},
		{"gate params", func(c *config.Config) {
			c.TransportConfig.Queues[0].GateParams = map[string]json.RawMessage{"colour": json.RawMessage(`"red"`)}
		}, []string{"transport_config.queues[0].gate_params: gate constant: unknown gate_params: colour"}},
		{"transport options", func(c *config.Config) { c.TransportConfig.Options = json.RawMessage(`{"colour":1}`) },
			[]string{"transport_config: transport memory:", `unknown field "colour"`}},
		// The base is above the retry middleware's default maximum (60s).
		{"retry base above the default max", func(c *config.Config) { c.Retry.Base = config.Duration(90 * time.Second) },
			[]string{"retry: max backoff 1m0s is below the base 1m30s"}},
		{"dispatch header", func(c *config.Config) { c.Dispatch.DeadlineHeader = "Content-Length" },
			[]string{"dispatch:", "reserved header"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := Check(checkConfig(tc.mutate), testAdapters(t))
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("Check: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Check accepted it, want %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Check: %v\nwant %q in it", err, w)
				}
			}
		})
	}
}

// The assembly registers no adapter: a deployment names only what it was given.
func TestNewWithoutAdapters(t *testing.T) {
	_, err := New(checkConfig(nil), Options{Transport: memory.New(memory.Options{}), Registry: prometheus.NewRegistry()})
	if err == nil || !strings.Contains(err.Error(), `unknown gate type "constant" (known: )`) {
		t.Fatalf("New without adapters: %v", err)
	}
}

// core/app links no adapter, no demo, no simulator, no bench: only core,
// and four ground-floor libraries that import only the standard library:
// internal/mutant, the planted-bug switch of the protocol tests
// (docs/verification.md), a constant false outside `-tags sluice_mutants`;
// internal/redistopology, the Redis topology rules config.Validate and
// internal/redisclient share; internal/jsonscan, the JSON scanner core/wire,
// core/dispatch and the Batch API front share; and internal/configtypes,
// the config value types (Duration) core/config and the fronts share.
func TestLinksOnlyCore(t *testing.T) {
	groundFloor := map[string]bool{"internal/mutant": true, "internal/redistopology": true, "internal/jsonscan": true, "internal/configtypes": true}
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	const module = "github.com/sluice-io/sluice/"
	for _, pkg := range strings.Fields(string(out)) {
		if rest, ok := strings.CutPrefix(pkg, module); ok && !strings.HasPrefix(rest, "core/") && !groundFloor[rest] {
			t.Errorf("core/app links %s", pkg)
		}
	}
}

// A config that leaves the components' settings zero gets the defaults the
// README documents, from the components themselves.
func TestComponentDefaults(t *testing.T) {
	cfg := checkConfig(nil)
	cfg.SetDefaults()
	d, err := cfg.DispatchConfig()
	if err != nil {
		t.Fatal(err)
	}
	d.SetDefaults()
	if d.RequestTimeout != 5*time.Minute || d.DeadlineHeader != "x-request-deadline" ||
		d.TimeoutHeader != "x-envoy-upstream-rq-timeout-ms" || d.MaxResponseBytes != 64<<20 || d.Protocol != "auto" {
		t.Errorf("dispatch defaults %+v", d)
	}
	r := cfg.RetryPolicy()
	r.SetDefaults()
	if r.Base != 2*time.Second || r.Max != time.Minute || r.Jitter != 0.2 || r.MaxAttempts != 0 {
		t.Errorf("retry defaults %+v", r)
	}
}
