package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/sluice-io/sluice/core/config"
)

// run executes the CLI with args and returns its stdout and error.
func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&bytes.Buffer{})
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	return out.String(), err
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestVersion(t *testing.T) {
	out, err := run(t, "version")
	if err != nil || !strings.HasPrefix(out, "sluice ") {
		t.Fatalf("version: %q %v", out, err)
	}
}

func TestValidatePrintsEveryProblem(t *testing.T) {
	f := writeFile(t, "queues.json", `{"result_queue_name":"r","queues":[
	  {"queue_name":"q1","igw_base_url":"not a url","gate_type":"nope"},
	  {"queue_name":"q2","igw_base_url":"http://gw","gate_params":{"budget":"2"}}]}`)
	out, err := run(t, "validate", "--transport-config-file", f, "--concurrency", "-1")
	var ee exitError
	if !errors.As(err, &ee) || ee.code != 1 {
		t.Fatalf("err = %v, want exit 1; out:\n%s", err, out)
	}
	for _, want := range []string{
		"error: concurrency: must be at least 1",
		`error: transport_config.queues[0].igw_base_url: "not a url" is not an http(s) URL`,
		`error: transport_config.queues[0].gate_type: unknown gate type "nope"`,
		// The gates are checked too, though the config has problems.
		"error: transport_config.queues[1].gate_params:",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
}

// validate checks every plugin binary (missing, not executable, a
// directory; in a composite too) and reports each, with the config's own
// problems, in one run.
func TestValidateChecksPluginPaths(t *testing.T) {
	dir := t.TempDir()
	notExec := writeFile(t, "plugin", "#!/bin/sh\n") // 0600
	missing := filepath.Join(dir, "nope")
	ok := filepath.Join(dir, "ok")
	if err := os.WriteFile(ok, []byte("#!/bin/sh\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	q := func(name, params string) string {
		return `{"queue_name":"` + name + `","igw_base_url":"http://gw","gate_type":"plugin","gate_params":` + params + `}`
	}
	f := writeFile(t, "queues.json", `{"result_queue_name":"r","queues":[`+
		q("q0", `{"path":"`+missing+`"}`)+`,`+
		q("q1", `{"path":"`+notExec+`"}`)+`,`+
		q("q2", `{"path":"`+dir+`"}`)+`,`+
		q("q3", `{"path":"`+ok+`"}`)+`,`+
		`{"queue_name":"q4","igw_base_url":"http://gw","gate_type":"composite","gate_params":{"gates":[{"gate_type":"plugin","gate_params":{"path":"`+missing+`"}}]}}`+
		`]}`)
	out, err := run(t, "validate", "--transport-config-file", f, "--log-level", "loud")
	var ee exitError
	if !errors.As(err, &ee) || ee.code != 1 {
		t.Fatalf("err = %v, want exit 1; out:\n%s", err, out)
	}
	for _, want := range []string{
		`error: log.level: "loud"`,
		"error: transport_config.queues[0].gate_params: gate_params.path: exec: \"" + missing + "\": stat " + missing + ": no such file or directory",
		"error: transport_config.queues[1].gate_params: gate_params.path: exec: \"" + notExec + "\": permission denied",
		"error: transport_config.queues[2].gate_params: gate_params.path: exec: \"" + dir + "\":",
		"error: transport_config.queues[4].gate_params: gates[0] (plugin): gate_params.path: exec: \"" + missing + "\"",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
	if strings.Contains(out, "queues[3]") {
		t.Errorf("an executable plugin was refused:\n%s", out)
	}
}

func TestValidateChecksGateParams(t *testing.T) {
	f := writeFile(t, "queues.json", `{"result_queue_name":"r","queues":[{"queue_name":"q","igw_base_url":"http://gw","gate_params":{"budget":"2","colour":"red"}}]}`)
	out, err := run(t, "validate", "--transport-config-file", f)
	if err == nil || !strings.Contains(out, "queues[0].gate_params") {
		t.Fatalf("bad gate params accepted: %q %v", out, err)
	}
}

func TestValidateOK(t *testing.T) {
	f := writeFile(t, "sluice.json", `{"transport":"memory","concurrency":8,
	  "transport_config":{"result_queue_name":"r","queues":[{"queue_name":"llm-d-async:requests:a","igw_base_url":"http://gw:80"}]}}`)
	out, err := run(t, "validate", "--config", f)
	if err != nil || !strings.HasPrefix(out, "ok: transport memory, 1 queue(s)") {
		t.Fatalf("validate: %q %v", out, err)
	}
}

func TestDemoJSON(t *testing.T) {
	out, err := run(t, "demo", "--mode", "mechanics", "--requests", "200", "--retry-base", "100ms", "--json")
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out)
	}
	var sum map[string]float64
	if err := json.Unmarshal([]byte(out), &sum); err != nil {
		t.Fatalf("not one JSON object: %q: %v", out, err)
	}
	for _, k := range []string{"requests", "results", "succeeded", "failed", "deadline_exceeded", "invalid", "retries"} {
		if _, ok := sum[k]; !ok {
			t.Errorf("summary lacks %q", k)
		}
	}
	if sum["requests"] != 200 || sum["results"] != 200 {
		t.Errorf("requests %v, results %v", sum["requests"], sum["results"])
	}
}

// The legacy flags of upstream's Helm chart map onto the same config.
func TestLegacyFlagsMapping(t *testing.T) {
	queues := writeFile(t, "q.json", `[{"queue_name":"llm-d-async:requests:pool-a","igw_base_url":"http://gw:80",
	  "gate_type":"prometheus-budget","gate_params":{"pool":"pool-a","max_concurrency":"100","baseline":0.05}}]`)
	f := &serveFlags{}
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	f.register(fs)
	t.Setenv("REDIS_URL", "redis://secret@redis:6379/0")
	if err := fs.Parse([]string{"--message-queue-impl=redis-sortedset", "--redis.ss.queues-config-file", queues,
		"--redis.ss.result-queue-name", "llm-d-async:results:pool-a:$batch", "--redis.ss.poll-interval-ms", "10", "--redis.ss.batch-size", "100"}); err != nil {
		t.Fatal(err)
	}
	cfg, err := f.load(fs)
	if err != nil {
		t.Fatal(err)
	}
	q := cfg.TransportConfig.Queues[0]
	if cfg.Transport != "redis-sortedset" || cfg.RedisURL != "redis://secret@redis:6379/0" ||
		q.ResultName != "llm-d-async:results:pool-a:$batch" || q.GateType != "prometheus-budget" || q.WorkerPoolID != "default" {
		t.Errorf("config %+v queue %+v", cfg, q)
	}
	var opts map[string]any
	if err := json.Unmarshal(cfg.TransportConfig.Options, &opts); err != nil || opts["poll_interval_ms"] != 10.0 || opts["batch_size"] != 100.0 {
		t.Errorf("options %s", cfg.TransportConfig.Options)
	}
}

func TestRedisURLFile(t *testing.T) {
	p := writeFile(t, "url", "rediss://user:pw@redis:6380/1\n")
	f := &serveFlags{}
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	f.register(fs)
	if err := fs.Parse([]string{"--redis.url-file", p}); err != nil {
		t.Fatal(err)
	}
	cfg, err := f.load(fs)
	if err != nil || cfg.RedisURL != "rediss://user:pw@redis:6380/1" {
		t.Fatalf("url %q %v", cfg.RedisURL, err)
	}
}

// Every subcommand is named in the package doc (main.go) and in the README's
// Commands table.
func TestSubcommandsDocumented(t *testing.T) {
	doc, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	cmds := newRoot().Commands()
	if len(cmds) < 9 {
		t.Errorf("%d subcommands, want at least 9", len(cmds))
	}
	for _, c := range cmds {
		if !strings.Contains(string(doc), "//\t"+c.Name()+" ") {
			t.Errorf("main.go's doc does not name %q", c.Name())
		}
		if !strings.Contains(string(readme), "| `sluice "+c.Name()) {
			t.Errorf("README's Commands table lacks %q", c.Name())
		}
	}
}

func TestSecretFlags(t *testing.T) {
	p := writeFile(t, "prom", "https://user:pw@prom:9090\n")
	f := &serveFlags{}
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	f.register(fs)
	if err := fs.Parse([]string{"--prometheus-url-file", p, "--redis.tls-ca-cert", "ca.pem", "--redis.tls-cert", "c.pem",
		"--redis.tls-key", "c.key", "--redis.tls-insecure-skip-verify"}); err != nil {
		t.Fatal(err)
	}
	cfg, err := f.load(fs)
	if err != nil {
		t.Fatal(err)
	}
	want := config.TLS{CACert: "ca.pem", Cert: "c.pem", Key: "c.key", InsecureSkipVerify: true}
	if cfg.Prometheus.URL != "https://user:pw@prom:9090" || cfg.RedisTLS != want {
		t.Errorf("prometheus url %q, redis tls %+v", cfg.Prometheus.URL, cfg.RedisTLS)
	}
	f = &serveFlags{}
	fs = pflag.NewFlagSet("serve", pflag.ContinueOnError)
	f.register(fs)
	if err := fs.Parse([]string{"--prometheus-url-file", p + ".missing"}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.load(fs); err == nil || !strings.Contains(err.Error(), "--prometheus-url-file") {
		t.Errorf("missing file: %v", err)
	}
}

// Keys and flags upstream accepts that sluice does not act on validate with
// one warning each, said once.
func TestValidateWarnsOnceForIgnoredSettings(t *testing.T) {
	f := writeFile(t, "queues.json", `{"result_queue_name":"r","enable_tracing":true,"queues":[{"queue_name":"q","igw_base_url":"http://gw"}]}`)
	mp := writeFile(t, "policy.json", `{"type":"random-robin","parameters":{"fairness_heder":"x-tenant"}}`)
	out, err := run(t, "validate", "--transport-config-file", f, "--zap-log-level", "debug", "--request-merge-policy-config-file", mp)
	if err != nil {
		t.Fatalf("validate: %v\n%s", err, out)
	}
	for _, want := range []string{
		"warning: --zap-log-level is accepted and ignored",
		"warning: transport_config.enable_tracing is accepted and ignored",
		`warning: merge_policy.parameters.fairness_heder is not a parameter sluice reads (did you mean "fairness_header"?)`,
	} {
		if n := strings.Count(out, want); n != 1 {
			t.Errorf("%q said %d times, want once:\n%s", want, n, out)
		}
	}
	if !strings.Contains(out, "ok: transport memory") {
		t.Errorf("not ok:\n%s", out)
	}
}

// Two entries with the same id or the same queue_name are refused by
// validate and by serve before anything starts, naming both entries.
func TestDuplicateQueuesRefused(t *testing.T) {
	f := writeFile(t, "queues.json", `{"result_queue_name":"r","queues":[
	  {"id":"a","queue_name":"q1","igw_base_url":"http://gw"},
	  {"id":"a","queue_name":"q2","igw_base_url":"http://gw"},
	  {"id":"c","queue_name":"q1","igw_base_url":"http://gw"}]}`)
	wants := []string{
		`transport_config.queues[1].id: duplicate queue id "a": queues[0] and queues[1] both use it`,
		`transport_config.queues[2].queue_name: duplicate queue_name "q1": queues[0] and queues[2] both read it`,
	}
	out, err := run(t, "validate", "--transport-config-file", f)
	var ee exitError
	if !errors.As(err, &ee) || ee.code != 1 {
		t.Fatalf("validate err = %v, want exit 1; out:\n%s", err, out)
	}
	for _, w := range wants {
		if !strings.Contains(out, "error: "+w) {
			t.Errorf("validate: missing %q in:\n%s", w, out)
		}
	}
	_, err = run(t, "serve", "--transport-config-file", f, "--metrics-port", "0", "--health-port", "0")
	if err == nil {
		t.Fatal("serve started with duplicate queues")
	}
	for _, w := range wants {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("serve: missing %q in %v", w, err)
		}
	}
}
