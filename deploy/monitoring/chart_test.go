package monitoring

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluice-io/sluice/internal/testenv"
)

// chartDir is sluice's Helm chart.
const chartDir = "../helm/sluice"

// helmVersion is the helm the tests build when SLUICE_HELM names none.
const helmVersion = "v3.22.0"

// renderNamespace is the release namespace the chart is rendered in.
const renderNamespace = "sluice-monitoring-test"

// helmBinary returns a helm to render the chart with: $SLUICE_HELM when set,
// else helm helmVersion, built with `go install` once into the user's cache
// directory and reused from there (cold, the build takes minutes; warm, it
// is a stat). deploy's chart tests use the same binary; the build holds a
// lock file beside it, so concurrent test binaries build it once.
func helmBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("SLUICE_HELM"); p != "" {
		return p
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "sluice-test", "helm-"+helmVersion)
	bin := filepath.Join(dir, "helm")
	if fi, err := os.Stat(bin); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
		return bin
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go not found in PATH: the test builds helm %s with it (or set SLUICE_HELM to a helm binary)", helmVersion)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// One build at a time: under go test ./... another package may want
	// helm at the same moment, and two cold builds would take twice the CPU.
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatalf("lock %s: %v", lock.Name(), err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) //nolint:errcheck // closing releases it too
	if fi, err := os.Stat(bin); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
		return bin // built by whoever held the lock
	}
	tmp, err := os.MkdirTemp(dir, "build-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	start := time.Now()
	cmd := exec.Command(goBin, "install", "helm.sh/helm/v3/cmd/helm@"+helmVersion)
	cmd.Dir = tmp // outside this module: go install pkg@version builds helm's own module graph
	cmd.Env = append(os.Environ(), "GOBIN="+tmp, "GOFLAGS=-buildvcs=false", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build helm %s: %v\n%s", helmVersion, err, out)
	}
	// A rename is atomic: a parallel run sees either no helm or a whole one.
	if err := os.Rename(filepath.Join(tmp, "helm"), bin); err != nil {
		t.Fatal(err)
	}
	t.Logf("built helm %s into %s in %s", helmVersion, bin, time.Since(start).Round(time.Second))
	return bin
}

// renderChart runs helm template over the chart, with the PrometheusRule
// and the dashboards ConfigMap turned on (upstream's value names), and
// returns the rendered documents. A missing chart fails the test.
func renderChart(t *testing.T) []map[string]any {
	t.Helper()
	if _, err := os.Stat(filepath.Join(chartDir, "Chart.yaml")); err != nil {
		t.Fatalf("no chart at deploy/helm/sluice (%v): the alert rules and the dashboards' ConfigMap are checked in the rendered chart", err)
	}
	helm := helmBinary(t)
	cmd := exec.Command(helm, "template", "sluice", chartDir, "--namespace", renderNamespace,
		"--set", "ap.prometheusRule.enabled=true", "--set", "ap.grafana.dashboards.enabled=true",
		// a transport: the chart fails without one, as upstream's does
		"--set", "ap.redis.enabled=true", "--set", "ap.redis.secretName=redis-creds", "--set", "ap.igwBaseURL=http://igw:80")
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, stderr.String())
	}
	var docs []map[string]any
	dec := yaml.NewDecoder(bytes.NewReader(out))
	for {
		var doc map[string]any
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("helm template output: %v", err)
		}
		if doc != nil {
			docs = append(docs, doc)
		}
	}
	return docs
}

// TestChart renders the chart and checks what it ships for monitoring: the
// alert rules of every PrometheusRule (each expression parsed by
// Prometheus's parser and checked against sluice's exports; the groups
// checked by promtool check rules) and the dashboards' ConfigMap (every
// file of files/dashboards, unchanged).
func TestChart(t *testing.T) {
	docs := renderChart(t)

	t.Run("rules", func(t *testing.T) {
		promtool := testenv.LookPath(t, "promtool", "prometheus")
		c := newChecker(t)
		var n int
		for _, doc := range docs {
			if doc["kind"] != "PrometheusRule" {
				continue
			}
			name := fmt.Sprint(dig(doc, "metadata", "name"))
			spec, _ := doc["spec"].(map[string]any)
			groups, _ := spec["groups"].([]any)
			if len(groups) == 0 {
				t.Errorf("PrometheusRule %s has no rule groups", name)
				continue
			}
			for _, g := range groups {
				g, _ := g.(map[string]any)
				rules, _ := g["rules"].([]any)
				for _, r := range rules {
					r, _ := r.(map[string]any)
					id := fmt.Sprintf("%s/%v/%v%v", name, g["name"], r["alert"], r["record"])
					expr, ok := r["expr"]
					if !ok {
						t.Errorf("rule %s: no expr", id)
						continue
					}
					n++
					for _, err := range c.check(fmt.Sprint(expr)).errs {
						t.Errorf("rule %s (%v): %v", id, expr, err)
					}
				}
			}
			b, err := yaml.Marshal(map[string]any{"groups": groups})
			if err != nil {
				t.Fatal(err)
			}
			file := filepath.Join(t.TempDir(), "rules.yaml")
			if err := os.WriteFile(file, b, 0o600); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command(promtool, "check", "rules", file).CombinedOutput(); err != nil {
				t.Errorf("promtool check rules (PrometheusRule %s): %v\n%s\n%s", name, err, out, b)
			}
		}
		if n == 0 {
			t.Fatalf("the chart rendered with ap.prometheusRule.enabled=true has no alert rules")
		}
		t.Logf("%d rules checked", n)
	})

	t.Run("dashboards", func(t *testing.T) {
		shipped := map[string]string{}
		for _, doc := range docs {
			if doc["kind"] != "ConfigMap" {
				continue
			}
			data, _ := doc["data"].(map[string]any)
			for k, v := range data {
				if strings.HasSuffix(k, ".json") {
					shipped[k] = fmt.Sprint(v)
				}
			}
		}
		files, err := filepath.Glob(filepath.Join(dashboardDir, "*.json"))
		if err != nil || len(files) == 0 {
			t.Fatalf("no dashboards in %s (%v)", dashboardDir, err)
		}
		for _, f := range files {
			want, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			got, ok := shipped[filepath.Base(f)]
			if !ok {
				t.Errorf("no ConfigMap of the chart (ap.grafana.dashboards.enabled=true) ships %s", filepath.Base(f))
				continue
			}
			if !jsonEqual(got, string(want)) {
				t.Errorf("the chart ships %s changed", filepath.Base(f))
			}
		}
	})
}

// dig returns the value at path in nested maps (nil when absent).
func dig(v any, path ...string) any {
	for _, k := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

// jsonEqual reports whether a and b hold the same JSON value.
func jsonEqual(a, b string) bool {
	var x, y any
	if json.Unmarshal([]byte(a), &x) != nil || json.Unmarshal([]byte(b), &y) != nil {
		return false
	}
	xb, _ := json.Marshal(x)
	yb, _ := json.Marshal(y)
	return bytes.Equal(xb, yb)
}
