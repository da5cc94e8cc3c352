package main

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-io/sluice/core/metricsauth"
	"github.com/sluice-io/sluice/core/metricsauth/metricsauthtest"
	"github.com/sluice-io/sluice/internal/simulator"
	"github.com/sluice-io/sluice/internal/testenv"
)

// isOutsideCluster says whether err is the refusal of
// --metrics-endpoint-auth=true outside a cluster: it names the flag, the
// cause and the ways out.
func isOutsideCluster(err error) bool {
	return err != nil && errors.Is(err, metricsauth.ErrNotInCluster) &&
		strings.HasPrefix(err.Error(), errMetricsAuth+": ") &&
		strings.Contains(err.Error(), "--metrics-endpoint-auth=false") && strings.Contains(err.Error(), "--metrics-port=-1")
}

// TestMetricsAuthOutsideCluster: with the service env but no token file,
// or with neither, --metrics-endpoint-auth=true refuses to start.
func TestMetricsAuthOutsideCluster(t *testing.T) {
	t.Setenv("REDIS_URL", "redis://redis:6379/0")
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
	_, _, err := loadUpstream(t, "--metrics-endpoint-auth=true")
	if !isOutsideCluster(err) || !strings.Contains(err.Error(), "KUBERNETES_SERVICE_HOST") {
		t.Errorf("no service env: %v", err)
	}
	t.Setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
	t.Setenv("KUBERNETES_SERVICE_PORT", "443")
	_, _, err = loadUpstream(t, "--metrics-endpoint-auth=true")
	if !isOutsideCluster(err) || !strings.Contains(err.Error(), "service-account token") {
		t.Errorf("no token file (%s): %v", metricsauth.DefaultTokenFile, err)
	}
	if cfg, _, err := loadUpstream(t, "--metrics-endpoint-auth=true", "--metrics-port=-1"); err != nil || cfg.MetricsPort != -1 {
		t.Errorf("auth on, /metrics off: %v", err)
	}
}

// TestMetricsAuthInCluster runs the binary as upstream's chart does with
// --metrics-endpoint-auth=true in a "cluster": the service env and the
// service-account files point at a fake API server. /metrics answers 401
// without a token, 403 to a user the API denies, 200 to one it allows.
func TestMetricsAuthInCluster(t *testing.T) {
	api := metricsauthtest.New(t)
	host, port := api.HostPort()
	t.Setenv("KUBERNETES_SERVICE_HOST", host)
	t.Setenv("KUBERNETES_SERVICE_PORT", port)
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	t.Setenv("REDIS_URL", r.URL)
	gw := startSim(t, simulator.Config{})
	health, metrics := freePort(t), freePort(t)

	f := &serveFlags{upstream: true}
	f.upstreamFlags.authConfig = metricsauth.Config{TokenFile: api.TokenFile, CAFile: api.CAFile}
	cmd := &cobra.Command{Use: "sluice", Args: cobra.NoArgs, SilenceUsage: true, SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error { return f.serve(cmd) }}
	f.register(cmd.Flags())
	cmd.SetArgs([]string{"--message-queue-impl=redis-pubsub", "--redis.igw-base-url=" + gw, "--health-port=" + health,
		"--metrics-endpoint-auth=true", "--metrics-port=" + metrics})
	cmd.SetOut(&bytes.Buffer{})
	cmd.SetErr(&bytes.Buffer{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()

	scrape := func(token string) (int, error) { return scrapeMetrics(metrics, token) }
	if code := waitMetrics(t, metrics, done); code != http.StatusUnauthorized {
		t.Fatalf("no token: %d, want 401", code)
	}
	for token, want := range map[string]int{metricsauthtest.TokenDenied: 403, metricsauthtest.TokenAllowed: 200, "forged": 401} {
		if code, err := scrape(token); err != nil || code != want {
			t.Errorf("token %q: %d %v, want %d", token, code, err, want)
		}
	}
	if code, _ := scrape(metricsauthtest.TokenAllowed); code != 200 {
		t.Errorf("second scrape: %d", code)
	}
	if n, z := api.Calls(); n != 3 || z != 2 {
		t.Errorf("API calls: %d token reviews, %d access reviews; want 3, 2 (second scrape cached)", n, z)
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

// scrapeMetrics GETs /metrics on port with a bearer token (none when empty)
// and returns the status.
func scrapeMetrics(port, token string) (int, error) {
	req, err := http.NewRequest(http.MethodGet, "http://127.0.0.1:"+port+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	_ = resp.Body.Close()
	return resp.StatusCode, nil
}

// waitMetrics waits up to 20 s for a sluice started in the background (its
// result comes on done) to answer /metrics on port, and returns the status
// of that first answer to a scrape without a token.
func waitMetrics(t *testing.T, port string, done <-chan error) int {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if code, err := scrapeMetrics(port, ""); err == nil {
			return code
		}
		select {
		case err := <-done:
			t.Fatalf("exited before serving /metrics: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("/metrics not served within 20s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
