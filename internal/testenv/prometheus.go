package testenv

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Prometheus is a prometheus server started for a test.
type Prometheus struct {
	// URL is the server's base URL (http://127.0.0.1:port).
	URL string
	cmd *exec.Cmd
	dir string
}

// ScrapeTarget is one endpoint Prometheus scrapes.
type ScrapeTarget struct {
	// URL is the metrics endpoint, e.g. http://127.0.0.1:8080/metrics.
	URL string
	// Labels are added to every series scraped from it (e.g. inference_pool).
	Labels map[string]string
}

// PrometheusOptions configure StartPrometheusWith.
type PrometheusOptions struct {
	Targets []ScrapeTarget
	// ScrapeInterval is the scrape (and rule evaluation) interval (default 1s).
	ScrapeInterval time.Duration
}

// StartPrometheus starts prometheus scraping each of targets (metrics URLs)
// every scrapeInterval, and waits until it is ready and has scraped every
// target once.
func StartPrometheus(t testing.TB, targets []string, scrapeInterval time.Duration) *Prometheus {
	t.Helper()
	o := PrometheusOptions{ScrapeInterval: scrapeInterval}
	for _, u := range targets {
		o.Targets = append(o.Targets, ScrapeTarget{URL: u})
	}
	return StartPrometheusWith(t, o)
}

// StartPrometheusWith starts prometheus on a free port of 127.0.0.1 with its
// configuration and storage in the test's temp dir, and stops it (by PID)
// when the test ends. A missing binary fails the test, naming the package.
func StartPrometheusWith(t testing.TB, o PrometheusOptions) *Prometheus {
	t.Helper()
	bin := LookPath(t, "prometheus", "prometheus")
	if o.ScrapeInterval <= 0 {
		o.ScrapeInterval = time.Second
	}
	dir := t.TempDir()
	conf, err := prometheusConfig(o)
	if err != nil {
		t.Fatalf("prometheus config: %v", err)
	}
	confFile := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(confFile, []byte(conf), 0o600); err != nil {
		t.Fatalf("prometheus config: %v", err)
	}
	port := FreePort(t)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	cmd := exec.Command(bin,
		"--config.file="+confFile,
		"--web.listen-address="+addr,
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--storage.tsdb.retention.time=1h",
		"--log.level=warn",
	)
	DieWithParent(cmd)
	logFile, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatalf("prometheus log: %v", err)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatalf("start prometheus: %v", err)
	}
	p := &Prometheus{URL: "http://" + addr, cmd: cmd, dir: dir}
	t.Cleanup(func() { p.Stop(); logFile.Close() })
	if err := p.waitReady(len(o.Targets), 30*time.Second); err != nil {
		p.Stop()
		log, _ := os.ReadFile(filepath.Join(dir, "prometheus.log"))
		t.Fatalf("prometheus on %s did not come up: %v\n%s", addr, err, log)
	}
	return p
}

// prometheusConfig renders prometheus.yml: one job per target.
func prometheusConfig(o PrometheusOptions) (string, error) {
	var b strings.Builder
	iv := o.ScrapeInterval.String()
	fmt.Fprintf(&b, "global:\n  scrape_interval: %s\n  scrape_timeout: %s\n  evaluation_interval: %s\nscrape_configs:\n", iv, iv, iv)
	for i, tg := range o.Targets {
		u, err := url.Parse(tg.URL)
		if err != nil || u.Host == "" {
			return "", fmt.Errorf("target %q: want http://host:port/path", tg.URL)
		}
		path := u.Path
		if path == "" {
			path = "/metrics"
		}
		fmt.Fprintf(&b, "  - job_name: target%d\n    metrics_path: %q\n    scheme: %s\n    static_configs:\n      - targets: [%q]\n", i, path, u.Scheme, u.Host)
		if len(tg.Labels) > 0 {
			keys := make([]string, 0, len(tg.Labels))
			for k := range tg.Labels {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			b.WriteString("        labels:\n")
			for _, k := range keys {
				fmt.Fprintf(&b, "          %s: %q\n", k, tg.Labels[k])
			}
		}
	}
	return b.String(), nil
}

// waitReady polls /-/ready, then /api/v1/targets until every target was
// scraped successfully once.
func (p *Prometheus) waitReady(targets int, within time.Duration) error {
	c := &http.Client{Timeout: time.Second}
	defer c.CloseIdleConnections()
	deadline := time.Now().Add(within)
	var last error
	for time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		resp, err := c.Get(p.URL + "/-/ready")
		if err != nil {
			last = err
			continue
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			last = fmt.Errorf("/-/ready: %s", resp.Status)
			continue
		}
		up, err := p.targetsUp(c)
		if err != nil {
			last = err
			continue
		}
		if up >= targets {
			return nil
		}
		last = fmt.Errorf("%d of %d targets up", up, targets)
	}
	return last
}

func (p *Prometheus) targetsUp(c *http.Client) (int, error) {
	resp, err := c.Get(p.URL + "/api/v1/targets?state=active")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var body struct {
		Data struct {
			ActiveTargets []struct {
				Health    string `json:"health"`
				LastError string `json:"lastError"`
			} `json:"activeTargets"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return 0, fmt.Errorf("/api/v1/targets: %w", err)
	}
	up := 0
	for _, tg := range body.Data.ActiveTargets {
		if tg.Health == "up" {
			up++
		}
	}
	return up, nil
}

// Stop kills the server (by its PID) and waits for it; safe to call twice.
func (p *Prometheus) Stop() {
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	_ = p.cmd.Process.Kill()
	_ = p.cmd.Wait()
	p.cmd = nil
}
