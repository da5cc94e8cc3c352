package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/internal/simulator"
	"github.com/sluice-io/sluice/internal/testenv"
)

// loadUpstream parses args as the binary run with no subcommand would and
// returns the config and the start-up warnings.
func loadUpstream(t *testing.T, args ...string) (*config.Config, []string, error) {
	t.Helper()
	f := &serveFlags{upstream: true}
	fs := pflag.NewFlagSet("llm-d-async", pflag.ContinueOnError)
	fs.SetOutput(&bytes.Buffer{})
	f.register(fs)
	if err := fs.Parse(args); err != nil {
		return nil, nil, fmt.Errorf("parse: %w", err)
	}
	cfg, err := f.load(fs)
	return cfg, f.warnings, err
}

// TestUpstreamFlags: every flag upstream registers (UPSTREAM.md §5.1 and
// §5.2) is accepted as upstream's binary; those with a meaning in sluice
// land in the config, the others say what sluice does instead.
func TestUpstreamFlags(t *testing.T) {
	t.Setenv("REDIS_URL", "redis://redis:6379/0")
	poolsJSON := writeFile(t, "pools.json", `[{"id":"default","workers":8},{"id":"batch","workers":3}]`)
	policyJSON := writeFile(t, "policy.json", `{"type":"tier-priority","parameters":{"priority_header":"x-prio","fairness_header":""}}`)
	transformJSON := writeFile(t, "transforms.json", `{"requestTransforms":[]}`)
	queues := writeFile(t, "queues.json", `[{"queue_name":"qf","igw_base_url":"http://gw:80"}]`)
	// Upstream's chart always passes these two; the base keeps the
	// redis-pubsub single queue valid.
	base := []string{"--metrics-endpoint-auth=false", "--redis.igw-base-url=http://gw:80"}
	type check func(c *config.Config) bool
	opt := func(c *config.Config, k string) any {
		m := map[string]any{}
		_ = jsonUnmarshal(c.TransportConfig.Options, &m)
		return m[k]
	}
	q0 := func(c *config.Config) config.Queue {
		if len(c.TransportConfig.Queues) == 0 {
			return config.Queue{}
		}
		return c.TransportConfig.Queues[0]
	}
	ss := []string{"--message-queue-impl=redis-sortedset"}
	gcp := []string{"--message-queue-impl=gcp-pubsub-gated", "--pubsub.project-id=p", "--pubsub.request-subscriber-id=sub", "--pubsub.igw-base-url=http://gw:80"}
	tests := []struct {
		flag     string
		args     []string
		want     check
		wantWarn string
	}{
		// §5.1 current flags.
		{"-v", []string{"-v", "0"}, func(c *config.Config) bool { return c.Log.Level == "info" }, ""},
		{"--v", []string{"--v=3"}, func(c *config.Config) bool { return c.Log.Level == "debug" }, ""},
		{"--health-port", []string{"--health-port=8082"}, func(c *config.Config) bool { return c.HealthPort == 8082 }, ""},
		{"--metrics-port", []string{"--metrics-port=9091"}, func(c *config.Config) bool { return c.MetricsPort == 9091 }, ""},
		{"--metrics-endpoint-auth", []string{"--metrics-endpoint-auth=false"}, func(c *config.Config) bool { return c.MetricsPort == 9090 }, ""},
		{"--concurrency", []string{"--concurrency=32"}, func(c *config.Config) bool { return c.Concurrency == 32 }, ""},
		{"--request-timeout", []string{"--request-timeout=90s"}, func(c *config.Config) bool { return time.Duration(c.RequestTimeout) == 90*time.Second }, ""},
		{"--drain-timeout", []string{"--drain-timeout=2m"}, func(c *config.Config) bool { return time.Duration(c.DrainTimeout) == 2*time.Minute }, ""},
		{"--gate-wait-timeout", []string{"--gate-wait-timeout=90s"}, func(c *config.Config) bool {
			return c.GateWaitTimeout != nil && time.Duration(*c.GateWaitTimeout) == 90*time.Second
		}, ""},
		{"--gate-wait-timeout 0", []string{"--gate-wait-timeout=0"}, func(c *config.Config) bool { return c.GateWaitTimeout != nil && *c.GateWaitTimeout == 0 }, ""},
		{"--pool-config-file", []string{"--pool-config-file", poolsJSON, "--redis.queues-config", `[{"queue_name":"qp","igw_base_url":"http://gw:80","worker_pool_id":"batch"}]`},
			func(c *config.Config) bool {
				return len(c.WorkerPools) == 2 && c.Pool("batch").Workers == 3 && q0(c).WorkerPoolID == "batch" && q0(c).MaxConcurrency == 3
			}, ""},
		{"--transport", []string{"--transport=redis-sortedset", "--transport-config-file", queues}, func(c *config.Config) bool { return c.Transport == "redis-sortedset" && q0(c).Name == "qf" }, ""},
		{"--transport-config", []string{"--transport-config", `{"result_queue_name":"r","queues":[{"queue_name":"qi","igw_base_url":"http://gw:80"}]}`},
			func(c *config.Config) bool {
				return c.Transport == "redis-pubsub" && q0(c).Name == "qi" && c.TransportConfig.ResultQueueName == "r"
			}, ""},
		{"--transport-config-file", []string{"--transport-config-file", queues}, func(c *config.Config) bool { return c.Transport == "redis-pubsub" && q0(c).Name == "qf" }, ""},
		{"--request-merge-policy-config-file", []string{"--request-merge-policy-config-file", policyJSON},
			func(c *config.Config) bool {
				return c.MergePolicy.Type == "tier-priority" && c.MergePolicy.Param("priority_header") == "x-prio"
			}, ""},
		{"--request-merge-policy-config", []string{"--request-merge-policy-config", policyJSON},
			func(c *config.Config) bool { return c.MergePolicy.Type == "tier-priority" }, "--request-merge-policy-config is deprecated"},
		{"--metrics-backlog-poll-interval", []string{"--metrics-backlog-poll-interval=30s"}, func(c *config.Config) bool { return c.BacklogPollInterval.D() == 30*time.Second }, ""},
		{"--metrics-backlog-poll-interval=0 disables", []string{"--metrics-backlog-poll-interval=0"}, func(c *config.Config) bool { return c.BacklogPollInterval.D() < 0 }, ""},
		{"--tls-ca-cert", []string{"--tls-ca-cert=/etc/tls/ca.crt"}, func(c *config.Config) bool { return c.TLS.CACert == "/etc/tls/ca.crt" }, ""},
		{"--tls-cert", []string{"--tls-cert=/etc/tls/tls.crt", "--tls-key=/etc/tls/tls.key"}, func(c *config.Config) bool { return c.TLS.Cert == "/etc/tls/tls.crt" }, ""},
		{"--tls-key", []string{"--tls-cert=/etc/tls/tls.crt", "--tls-key=/etc/tls/tls.key"}, func(c *config.Config) bool { return c.TLS.Key == "/etc/tls/tls.key" }, ""},
		{"--tls-insecure-skip-verify", []string{"--tls-insecure-skip-verify=true"}, func(c *config.Config) bool { return c.TLS.InsecureSkipVerify }, ""},
		{"--transform-config-file", []string{"--transform-config-file", transformJSON}, func(c *config.Config) bool { return c.TransformConfigFile == transformJSON }, ""},
		{"--prometheus-url", []string{"--prometheus-url=http://prom:9090"}, func(c *config.Config) bool { return c.Prometheus.URL == "http://prom:9090" }, ""},
		{"--prometheus-cache-ttl", []string{"--prometheus-cache-ttl=10s"}, func(c *config.Config) bool { return time.Duration(c.Prometheus.CacheTTL) == 10*time.Second }, ""},
		{"--prometheus-cache-ttl=0s", []string{"--prometheus-cache-ttl=0s"}, func(c *config.Config) bool { return time.Duration(c.Prometheus.CacheTTL) == time.Nanosecond }, ""},
		{"--zap-devel", []string{"--zap-devel=false"}, nil, "--zap-devel is accepted and ignored"},
		{"--zap-encoder", []string{"--zap-encoder=json"}, func(c *config.Config) bool { return c.Log.Format == "json" }, ""},
		{"--zap-log-level", []string{"--zap-log-level=debug"}, func(c *config.Config) bool { return c.Log.Level == "info" }, "--zap-log-level is accepted and ignored"},
		{"--zap-stacktrace-level", []string{"--zap-stacktrace-level=panic"}, nil, "--zap-stacktrace-level is accepted and ignored"},
		{"--zap-time-encoding", []string{"--zap-time-encoding=iso8601"}, nil, "--zap-time-encoding is accepted and ignored"},

		// §5.2 deprecated flags.
		{"--message-queue-impl", []string{"--message-queue-impl=redis-pubsub"}, func(c *config.Config) bool {
			return c.Transport == "redis-pubsub" && q0(c).Name == "request-queue" && c.TransportConfig.ResultQueueName == "result-queue"
		}, "flag --message-queue-impl is deprecated"},
		{"--message-queue-impl=gcp-pubsub-gated", append(gcp, "--pubsub.result-topic-id=res"), func(c *config.Config) bool {
			return c.Transport == "gcp-pubsub" && q0(c).Name == "sub" && opt(c, "project_id") == "p"
		}, ""},
		{"--redis-tracing", []string{"--redis-tracing=true"}, nil, "--redis-tracing is accepted and ignored"},
		{"--redis.url", []string{"--redis.url=redis://other:6379/1"}, func(c *config.Config) bool { return c.RedisURL == "redis://other:6379/1" }, ""},
		{"--redis.igw-base-url", []string{"--redis.igw-base-url=http://gw2:80"}, func(c *config.Config) bool { return q0(c).IGWBaseURL == "http://gw2:80" }, ""},
		{"--redis.request-path-url", []string{"--redis.request-path-url", "/v1/chat/completions"}, func(c *config.Config) bool { return q0(c).RequestPathURL == "/v1/chat/completions" }, ""},
		{"--redis.inference-objective", []string{"--redis.inference-objective=batch"}, func(c *config.Config) bool { return q0(c).InferenceObjective == "batch" }, ""},
		{"--redis.request-queue-name", []string{"--redis.request-queue-name=rq"}, func(c *config.Config) bool { return q0(c).Name == "rq" }, ""},
		{"--redis.retry-queue-name", []string{"--redis.retry-queue-name=retries"}, func(c *config.Config) bool { return opt(c, "retry_queue_name") == "retries" }, ""},
		{"--redis.result-queue-name", []string{"--redis.result-queue-name=res"}, func(c *config.Config) bool { return c.TransportConfig.ResultQueueName == "res" }, ""},
		{"--redis.queues-config", []string{"--redis.queues-config", `[{"queue_name":"qa","igw_base_url":"http://gw:80"},{"queue_name":"qb","igw_base_url":"http://gw:80"}]`, "--redis.queues-config-file", queues},
			func(c *config.Config) bool { return len(c.TransportConfig.Queues) == 2 && q0(c).Name == "qa" }, ""},
		{"--redis.queues-config-file", []string{"--redis.queues-config-file", queues}, func(c *config.Config) bool { return len(c.TransportConfig.Queues) == 1 && q0(c).Name == "qf" }, ""},
		{"--redis.ss.igw-base-url", append(ss, "--redis.ss.igw-base-url=http://gw3:80"), func(c *config.Config) bool {
			return c.Transport == "redis-sortedset" && q0(c).IGWBaseURL == "http://gw3:80" && q0(c).Name == "request-sortedset" && c.TransportConfig.ResultQueueName == "result-list"
		}, ""},
		{"--redis.ss.request-path-url", append(ss, "--redis.ss.request-path-url", "/v1/x"), func(c *config.Config) bool { return q0(c).RequestPathURL == "/v1/x" }, ""},
		{"--redis.ss.request-queue-name", append(ss, "--redis.ss.request-queue-name", "rs"), func(c *config.Config) bool { return q0(c).Name == "rs" }, ""},
		{"--redis.ss.result-queue-name", append(ss, "--redis.ss.result-queue-name", "rl"), func(c *config.Config) bool { return c.TransportConfig.ResultQueueName == "rl" }, ""},
		{"--redis.ss.poll-interval-ms", append(ss, "--redis.ss.poll-interval-ms", "250"), func(c *config.Config) bool { return opt(c, "poll_interval_ms") == 250.0 }, ""},
		{"--redis.ss.batch-size", append(ss, "--redis.ss.batch-size", "20"), func(c *config.Config) bool { return opt(c, "batch_size") == 20.0 }, ""},
		{"--redis.ss.gate-type", append(ss, "--redis.ss.gate-type=constant", "--redis.ss.gate-params", `{"budget":"0.5"}`), func(c *config.Config) bool { return q0(c).GateType == "constant" }, ""},
		{"--redis.ss.gate-params", append(ss, "--redis.ss.gate-type=constant", "--redis.ss.gate-params", `{"budget":"0.5"}`), func(c *config.Config) bool { return len(q0(c).GateParams) == 1 }, ""},
		{"--redis.ss.queues-config", append(ss, "--redis.ss.queues-config", `[{"queue_name":"qs","igw_base_url":"http://gw:80"}]`), func(c *config.Config) bool { return q0(c).Name == "qs" }, ""},
		{"--redis.ss.queues-config-file", append(ss, "--redis.ss.queues-config-file", queues), func(c *config.Config) bool { return q0(c).Name == "qf" }, ""},
		{"--redis.ss.inference-objective", append(ss, "--redis.ss.inference-objective=o"), func(c *config.Config) bool { return q0(c).InferenceObjective == "o" }, ""},
		{"--pubsub.project-id", gcp, func(c *config.Config) bool { return opt(c, "project_id") == "p" }, ""},
		{"--pubsub.result-topic-id", append(gcp, "--pubsub.result-topic-id=res"), func(c *config.Config) bool { return c.TransportConfig.ResultQueueName == "res" }, ""},
		{"--pubsub.request-subscriber-id", gcp, func(c *config.Config) bool { return q0(c).Name == "sub" }, ""},
		{"--pubsub.igw-base-url", gcp, func(c *config.Config) bool { return q0(c).IGWBaseURL == "http://gw:80" }, ""},
		{"--pubsub.request-path-url", append(gcp, "--pubsub.request-path-url", "/v1/y"), func(c *config.Config) bool { return q0(c).RequestPathURL == "/v1/y" }, ""},
		{"--pubsub.topics-config-file", []string{"--message-queue-impl=gcp-pubsub", "--pubsub.project-id=p", "--pubsub.topics-config-file", queues},
			func(c *config.Config) bool { return q0(c).Name == "qf" }, ""},
		{"--pubsub.inference-objective", append(gcp, "--pubsub.inference-objective=o"), func(c *config.Config) bool { return q0(c).InferenceObjective == "o" }, ""},
		{"--pubsub.batch-size", append(gcp, "--pubsub.batch-size=5"), func(c *config.Config) bool { return c.TransportConfig.Queues[0].MaxConcurrency == 5 }, ""},
	}
	for _, tc := range tests {
		t.Run(strings.TrimLeft(tc.flag, "-"), func(t *testing.T) {
			cfg, warn, err := loadUpstream(t, append(append([]string{}, base...), tc.args...)...)
			if err != nil {
				t.Fatalf("%s: %v", tc.flag, err)
			}
			if tc.want != nil && !tc.want(cfg) {
				t.Errorf("%s: config %+v", tc.flag, cfg)
			}
			if tc.wantWarn != "" && !strings.Contains(strings.Join(warn, "\n"), tc.wantWarn) {
				t.Errorf("%s: no warning %q in %q", tc.flag, tc.wantWarn, warn)
			}
		})
	}
}

func jsonUnmarshal(b []byte, v any) error {
	if len(b) == 0 {
		return nil
	}
	return json.Unmarshal(b, v)
}

// TestUpstreamDefaults: with no flags, the binary is what upstream's is:
// redis-pubsub with the default queue names, and /metrics protection on.
func TestUpstreamDefaults(t *testing.T) {
	t.Setenv("REDIS_URL", "redis://redis:6379/0")
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	if _, _, err := loadUpstream(t); !isOutsideCluster(err) {
		t.Fatalf("no flags: err %v, want the metrics auth refusal", err)
	}
	if _, _, err := loadUpstream(t, "--metrics-endpoint-auth", "--metrics-port=-1"); err != nil {
		t.Fatalf("auth on with /metrics off: %v", err)
	}
	cfg, _, err := loadUpstream(t, "--metrics-endpoint-auth=false")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Transport != "redis-pubsub" || cfg.TransportConfig.Queues[0].Name != "request-queue" || cfg.TransportConfig.ResultQueueName != "result-queue" {
		t.Errorf("defaults: %+v", cfg)
	}
	t.Setenv("REDIS_URL", "")
	if _, _, err := loadUpstream(t, "--metrics-endpoint-auth=false"); err == nil || !strings.Contains(err.Error(), "set --redis.url or REDIS_URL") {
		t.Errorf("no Redis URL: %v", err)
	}
	if _, _, err := loadUpstream(t, "--metrics-endpoint-auth=false", "--message-queue-impl=gcp-pubsub"); err == nil || !strings.Contains(err.Error(), "needs --pubsub.project-id") {
		t.Errorf("no project: %v", err)
	}
	if _, _, err := loadUpstream(t, "--metrics-endpoint-auth=false", "--message-queue-impl=kafka"); err == nil || !strings.Contains(err.Error(), "--message-queue-impl: unknown value") {
		t.Errorf("bad impl: %v", err)
	}
}

// TestUpstreamGCPGates: plain legacy gcp-pubsub runs topics ungated, as
// upstream does; gcp-pubsub-gated keeps the gates.
func TestUpstreamGCPGates(t *testing.T) {
	topics := writeFile(t, "topics.json", `[{"queue_name":"sub","igw_base_url":"http://gw:80","gate_type":"constant","gate_params":{"budget":"0.5"}}]`)
	for impl, gated := range map[string]bool{"gcp-pubsub": false, "gcp-pubsub-gated": true} {
		cfg, warn, err := loadUpstream(t, "--metrics-endpoint-auth=false", "--message-queue-impl="+impl, "--pubsub.project-id=p", "--pubsub.topics-config-file", topics)
		if err != nil {
			t.Fatal(err)
		}
		if got := len(cfg.TransportConfig.Queues[0].GateParams) > 0; got != gated {
			t.Errorf("%s: gated %v, want %v (warnings %q)", impl, got, gated, warn)
		}
	}
}

// TestUpstreamJSONFileFlags: a flag naming a file that is missing or not
// JSON fails with the flag's name.
func TestUpstreamJSONFileFlags(t *testing.T) {
	t.Setenv("REDIS_URL", "redis://redis:6379/0")
	bad := writeFile(t, "bad.json", `{"pools": [`)
	for _, flag := range []string{"pool-config-file", "request-merge-policy-config-file", "request-merge-policy-config", "transform-config-file"} {
		for path, want := range map[string]string{bad: "is not valid JSON", bad + ".missing": "no such file"} {
			_, _, err := loadUpstream(t, "--metrics-endpoint-auth=false", "--redis.igw-base-url=http://gw:80", "--"+flag, path)
			if err == nil || !strings.HasPrefix(err.Error(), "--"+flag+": ") || !strings.Contains(err.Error(), want) {
				t.Errorf("--%s %s: err %v, want one naming the flag and %q", flag, path, err, want)
			}
		}
	}
}

func TestCLIRouting(t *testing.T) {
	for _, tc := range []struct {
		args     []string
		upstream bool
	}{
		{nil, true}, {[]string{"--metrics-endpoint-auth=false"}, true}, {[]string{"-v", "2"}, true},
		{[]string{"serve"}, false}, {[]string{"version"}, false}, {[]string{"--help"}, false}, {[]string{"-h"}, false},
	} {
		cmd, _ := newCLI(tc.args)
		if got := !cmd.HasSubCommands(); got != tc.upstream {
			t.Errorf("%q: upstream %v, want %v", tc.args, got, tc.upstream)
		}
	}
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return fmt.Sprint(l.Addr().(*net.TCPAddr).Port)
}

// TestUpstreamChartArgsStart runs the binary with no subcommand and the args
// upstream's Helm chart renders for redis-pubsub (UPSTREAM-CHART.md §5.2 B
// and the common tail): it starts with --metrics-endpoint-auth=false and
// refuses with =true outside a cluster.
func TestUpstreamChartArgsStart(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	t.Setenv("REDIS_URL", r.URL)
	gw := startSim(t, simulator.Config{})
	health, metrics := freePort(t), freePort(t)
	chart := func(auth string) []string {
		return []string{"--message-queue-impl=redis-pubsub", "--redis.igw-base-url=" + gw, "--redis.request-path-url", "/v1/completions",
			"--concurrency=64", "--drain-timeout=2m", "--health-port=" + health, "--metrics-endpoint-auth=" + auth, "--metrics-port=" + metrics}
	}
	execute := func(ctx context.Context, args []string) error {
		cmd, args := newCLI(args)
		cmd.SetArgs(args)
		cmd.SetOut(&bytes.Buffer{})
		cmd.SetErr(&bytes.Buffer{})
		return cmd.ExecuteContext(ctx)
	}

	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	if err := execute(context.Background(), chart("true")); !isOutsideCluster(err) {
		t.Fatalf("--metrics-endpoint-auth=true outside a cluster: err %v, want the refusal naming the flag", err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- execute(ctx, chart("false")) }()
	if code := waitMetrics(t, metrics, done); code != http.StatusOK {
		t.Fatalf("/metrics with --metrics-endpoint-auth=false: %d, want 200", code)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("serve: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not stop within 30s of cancel")
	}
}

// TestUpstreamChartRenderedArgs loads the args upstream's Helm chart renders
// for each transport block and the common tail (UPSTREAM-CHART.md §5.2),
// in the chart's order and argv forms.
func TestUpstreamChartRenderedArgs(t *testing.T) {
	t.Setenv("REDIS_URL", "redis://redis:6379/0")
	pools := writeFile(t, "worker-pools.json", `[{"id":"default","workers":64}]`)
	transform := writeFile(t, "transform-config.json", `{"requestTransforms":[]}`)
	merge := writeFile(t, "request-merge-policy.json", `{"type":"random-robin"}`)
	topics := writeFile(t, "pubsub-topics.json", `[{"queue_name":"sub-a","igw_base_url":"http://gw:80","gate_type":"constant","gate_params":{"budget":"1"}}]`)
	tail := []string{"--prometheus-url=http://prom:9090", "--prometheus-cache-ttl=5s",
		"--pool-config-file=" + pools, "--transform-config-file=" + transform, "--request-merge-policy-config=" + merge,
		"--concurrency=64", "--drain-timeout=2m", "--health-port=8081", "--metrics-endpoint-auth=false", "--metrics-port=9090",
		"--redis-tracing=true", "--tls-insecure-skip-verify=true"}
	tests := []struct {
		name  string
		block []string
		want  func(c *config.Config) bool
	}{
		{"redis-sortedset single queue", []string{"--message-queue-impl=redis-sortedset", "--redis.ss.igw-base-url=http://gw:80",
			"--redis.ss.request-path-url", "/v1/completions", "--redis.ss.request-queue-name", "request-sortedset",
			"--redis.ss.gate-type=prometheus-saturation", `--redis.ss.gate-params={"pool":"p","threshold":"0.8"}`,
			"--redis.ss.result-queue-name", "result-list", "--redis.ss.poll-interval-ms", "1000", "--redis.ss.batch-size", "10"},
			func(c *config.Config) bool {
				q := c.TransportConfig.Queues[0]
				return c.Transport == "redis-sortedset" && q.GateType == "prometheus-saturation" && c.TransportConfig.ResultQueueName == "result-list"
			}},
		{"redis-sortedset queues", []string{"--message-queue-impl=redis-sortedset",
			"--redis.ss.queues-config", `[{"queue_name":"a","igw_base_url":"http://gw:80"},{"queue_name":"b","igw_base_url":"http://gw:80"}]`,
			"--redis.ss.result-queue-name", "result-list", "--redis.ss.poll-interval-ms", "1000", "--redis.ss.batch-size", "10"},
			func(c *config.Config) bool { return len(c.TransportConfig.Queues) == 2 }},
		{"redis-pubsub single queue", []string{"--message-queue-impl=redis-pubsub", "--redis.igw-base-url=http://gw:80", "--redis.request-path-url", "/v1/completions"},
			func(c *config.Config) bool {
				return c.Transport == "redis-pubsub" && c.TransportConfig.Queues[0].Name == "request-queue" && c.TransportConfig.ResultQueueName == "result-queue"
			}},
		{"redis-pubsub queues", []string{"--message-queue-impl=redis-pubsub", "--redis.queues-config", `[{"queue_name":"a","igw_base_url":"http://gw:80"}]`},
			func(c *config.Config) bool { return c.TransportConfig.Queues[0].Name == "a" }},
		{"gcp-pubsub-gated topics", []string{"--message-queue-impl=gcp-pubsub-gated", "--pubsub.project-id=proj", "--pubsub.result-topic-id=results",
			"--pubsub.topics-config-file=" + topics},
			func(c *config.Config) bool {
				return c.Transport == "gcp-pubsub" && len(c.TransportConfig.Queues[0].GateParams) == 1 && c.TransportConfig.ResultQueueName == "results"
			}},
		{"gcp-pubsub single topic", []string{"--message-queue-impl=gcp-pubsub", "--pubsub.project-id=proj", "--pubsub.result-topic-id=results",
			"--pubsub.igw-base-url=http://gw:80", "--pubsub.request-subscriber-id=sub", "--pubsub.request-path-url", "/v1/completions"},
			func(c *config.Config) bool { return c.TransportConfig.Queues[0].Name == "sub" }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, warn, err := loadUpstream(t, append(append([]string{}, tc.block...), tail...)...)
			if err != nil {
				t.Fatal(err)
			}
			if !tc.want(cfg) {
				t.Errorf("config %+v", cfg)
			}
			all := strings.Join(warn, "\n")
			if p := cfg.Pool("default"); p == nil || p.Workers != 64 {
				t.Errorf("pools %+v, want the file's default of 64 workers", cfg.WorkerPools)
			}
			if cfg.TransformConfigFile != transform || cfg.MergePolicy.Type != "random-robin" {
				t.Errorf("transform file %q, merge policy %+v", cfg.TransformConfigFile, cfg.MergePolicy)
			}
			for _, w := range []string{"--request-merge-policy-config", "--redis-tracing", "flag --message-queue-impl is deprecated"} {
				if !strings.Contains(all, w) {
					t.Errorf("no warning naming %s in:\n%s", w, all)
				}
			}
		})
	}
}

// TestUpstreamTransportDocument: the arguments upstream's chart renders now
// (--transport=<t>, then --transport-config and the document as two
// arguments) load as upstream's binary reads them: a document naming no
// result destination gets upstream's default for its transport, and the
// Redis URL comes from REDIS_URL when the document has none.
func TestUpstreamTransportDocument(t *testing.T) {
	t.Setenv("REDIS_URL", "redis://from-env:6379/0")
	const q = `"queues":[{"queue_name":"q","igw_base_url":"http://gw:80"}]`
	for _, tc := range []struct {
		transport, doc, wantResult, wantURL string
	}{
		{"redis-sortedset", `{` + q + `}`, "result-list", "redis://from-env:6379/0"},
		{"redis-pubsub", `{` + q + `}`, "result-queue", "redis://from-env:6379/0"},
		{"redis-sortedset", `{` + q + `,"result_queue_name":"mine"}`, "mine", "redis://from-env:6379/0"},
		{"redis-pubsub", `{` + q + `,"url":"redis://inline:6379"}`, "result-queue", "redis://inline:6379"},
		{"gcp-pubsub", `{"project_id":"p","result_topic_id":"r","topics":[{"subscriber_id":"s","igw_base_url":"http://gw:80"}]}`, "r", ""},
	} {
		t.Run(tc.transport+" "+tc.doc, func(t *testing.T) {
			cfg, warn, err := loadUpstream(t, "--transport="+tc.transport, "--transport-config", tc.doc, "--concurrency=64",
				"--gate-wait-timeout=5m", "--drain-timeout=2m", "--metrics-endpoint-auth=false")
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Transport != tc.transport || len(cfg.TransportConfig.Queues) != 1 || cfg.TransportConfig.ResultQueueName != tc.wantResult {
				t.Errorf("transport %q, %d queues, result %q; want %s, 1, %q", cfg.Transport, len(cfg.TransportConfig.Queues), cfg.TransportConfig.ResultQueueName, tc.transport, tc.wantResult)
			}
			url := cfg.RedisURL
			var opts struct {
				URL string `json:"url"`
			}
			if err := json.Unmarshal(cfg.TransportConfig.Options, &opts); err == nil && opts.URL != "" {
				url = opts.URL
			}
			if tc.wantURL != "" && url != tc.wantURL {
				t.Errorf("Redis URL %q, want %q", url, tc.wantURL)
			}
			if strings.Contains(strings.Join(warn, "\n"), "legacy flags ignored") {
				t.Errorf("warnings %q", warn)
			}
		})
	}
}
