package metricsauth

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/metricsauth/metricsauthtest"
)

// cfgFor is a Config pointing at the fake, with a settable clock.
func cfgFor(f *metricsauthtest.API, now *time.Time) Config {
	c := Config{Host: f.URL, TokenFile: f.TokenFile, CAFile: f.CAFile, Timeout: 2 * time.Second, RetryBackoff: time.Millisecond}
	if now != nil {
		c.Now = func() time.Time { return *now }
	}
	return c
}

func scrape(h http.Handler, token string) (int, string) {
	r := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	if token != "" {
		r.Header.Set("Authorization", token)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Code, strings.TrimSpace(w.Body.String())
}

var metricsOK = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != "" {
		http.Error(w, "token leaked to the handler", http.StatusTeapot)
		return
	}
	_, _ = io.WriteString(w, "metrics")
})

func TestGuardAnswers(t *testing.T) {
	f := metricsauthtest.New(t)
	g, err := New(cfgFor(f, nil))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	h := g.Wrap(metricsOK)
	for _, tc := range []struct {
		header string
		code   int
		body   string
	}{
		{"", 401, "Unauthorized"},
		{"Basic Zm9vOmJhcg==", 401, "Unauthorized"},
		{"Bearer ", 401, "Unauthorized"},
		{"Bearer good", 200, "metrics"},
		{"bearer good", 200, "metrics"},
		{"Bearer forged", 401, "Unauthorized"},
		{"Bearer denied", 403, "Authorization denied for user bob"},
	} {
		if code, body := scrape(h, tc.header); code != tc.code || body != tc.body {
			t.Errorf("%q: %d %q, want %d %q", tc.header, code, body, tc.code, tc.body)
		}
	}
	reviews, accesses := f.TokenReviews(), f.AccessReviews()
	if len(reviews) != 3 || reviews[0].Spec.Token != "good" || reviews[0].Kind != "TokenReview" || reviews[0].APIVersion != "authentication.k8s.io/v1" {
		t.Errorf("token reviews: %+v", reviews)
	}
	if len(accesses) != 2 {
		t.Fatalf("access reviews: %+v", accesses)
	}
	a := accesses[0]
	if a.Kind != "SubjectAccessReview" || a.APIVersion != "authorization.k8s.io/v1" || a.Spec.NonResourceAttributes == nil ||
		a.Spec.NonResourceAttributes.Path != "/metrics" || a.Spec.NonResourceAttributes.Verb != "get" || a.Spec.ResourceAttributes != nil ||
		a.Spec.User != "alice" || a.Spec.UID != "u1" ||
		strings.Join(a.Spec.Groups, ",") != "monitoring,system:authenticated" {
		t.Errorf("access review: %+v", a)
	}
}

func TestGuardCaches(t *testing.T) {
	f := metricsauthtest.New(t)
	now := time.Unix(1_000_000, 0)
	g, err := New(cfgFor(f, &now))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	h := g.Wrap(metricsOK)
	calls := func() [2]int {
		n, z := f.Calls()
		return [2]int{n, z}
	}
	step := func(d time.Duration, token string, code int, want [2]int) {
		t.Helper()
		now = now.Add(d)
		if got, _ := scrape(h, "Bearer "+token); got != code {
			t.Fatalf("%s: %d, want %d", token, got, code)
		}
		if got := calls(); got != want {
			t.Fatalf("%s after %v: calls (authn, authz) %v, want %v", token, d, got, want)
		}
	}
	step(0, "good", 200, [2]int{1, 1})
	step(30*time.Second, "good", 200, [2]int{1, 1}) // both cached
	step(31*time.Second, "good", 200, [2]int{2, 1}) // token review expired (1m), access still cached (5m)
	step(0, "denied", 403, [2]int{3, 2})
	step(20*time.Second, "denied", 403, [2]int{3, 2}) // denial cached 30s
	step(11*time.Second, "denied", 403, [2]int{3, 3}) // denial expired, token review still cached
	step(0, "forged", 401, [2]int{4, 3})
	step(50*time.Second, "forged", 401, [2]int{4, 3}) // not authenticated: cached 1m, no access review
	step(4*time.Minute, "good", 200, [2]int{5, 4})    // allow expired after 5m
}

func TestGuardAPIOutage(t *testing.T) {
	f := metricsauthtest.New(t)
	now := time.Unix(1_000_000, 0)
	g, err := New(cfgFor(f, &now))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	h := g.Wrap(metricsOK)
	if code, _ := scrape(h, "Bearer good"); code != 200 {
		t.Fatalf("before the outage: %d", code)
	}
	f.SetDown(true)
	if code, _ := scrape(h, "Bearer good"); code != 200 {
		t.Errorf("cached answers survive the outage: %d", code)
	}
	if code, body := scrape(h, "Bearer denied"); code != 500 || body != "Authentication failed" {
		t.Errorf("token review fails: %d %q", code, body)
	}
	now = now.Add(2 * time.Minute) // token review expired, allow still cached
	if code, body := scrape(h, "Bearer good"); code != 500 || body != "Authentication failed" {
		t.Errorf("token review fails after expiry: %d %q", code, body)
	}
	f.SetDown(false)
	if code, _ := scrape(h, "Bearer denied"); code != 403 {
		t.Fatalf("back up: %d", code)
	}
	f.SetDown(true)
	now = now.Add(40 * time.Second) // bob's denial expired, his token review cached
	if code, body := scrape(h, "Bearer denied"); code != 500 || body != "Authorization for user bob failed" {
		t.Errorf("access review fails: %d %q", code, body)
	}
	f.Close() // unreachable
	if code, _ := scrape(h, "Bearer other"); code != 500 {
		t.Errorf("unreachable: %d", code)
	}
}

func TestConfig(t *testing.T) {
	f := metricsauthtest.New(t)
	tok := f.TokenFile
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	inCluster := env(map[string]string{"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"})
	empty := filepath.Join(t.TempDir(), "empty")
	_ = os.WriteFile(empty, nil, 0o600)

	c := Config{Getenv: inCluster}
	c.setDefaults()
	if c.Host != "https://10.0.0.1:443" || c.TokenFile != DefaultTokenFile || c.CAFile != DefaultCAFile || c.AuthnTTL != time.Minute || c.AllowTTL != 5*time.Minute || c.DenyTTL != 30*time.Second {
		t.Errorf("defaults: %+v", c)
	}
	c = Config{Getenv: env(map[string]string{"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"})}
	c.setDefaults()
	if c.Host != "https://[fd00::1]:6443" {
		t.Errorf("IPv6 host: %s", c.Host)
	}
	for _, tc := range []struct {
		name       string
		cfg        Config
		notCluster bool
		want       string
	}{
		{"no service env", Config{Getenv: env(nil), TokenFile: tok, CAFile: f.CAFile}, true, "KUBERNETES_SERVICE_HOST"},
		{"no token file", Config{Getenv: inCluster, TokenFile: tok + ".missing", CAFile: f.CAFile}, true, "no such file"},
		{"empty token", Config{Getenv: inCluster, TokenFile: empty, CAFile: f.CAFile}, true, "is empty"},
		{"no CA", Config{Getenv: inCluster, TokenFile: tok, CAFile: tok + ".missing"}, false, "service-account CA"},
		{"CA not PEM", Config{Getenv: inCluster, TokenFile: tok, CAFile: tok}, false, "no PEM certificate"},
		{"plain http", Config{Host: "http://api:80", TokenFile: tok, CAFile: f.CAFile}, false, "want an https:// URL"},
		{"negative TTL", Config{Host: f.URL, TokenFile: tok, CAFile: f.CAFile, DenyTTL: -time.Second}, false, "DenyTTL"},
		{"negative retries", Config{Host: f.URL, TokenFile: tok, CAFile: f.CAFile, Retries: -1}, false, "retries"},
	} {
		_, err := New(tc.cfg)
		if err == nil || errors.Is(err, ErrNotInCluster) != tc.notCluster || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want one with %q (not in cluster: %v)", tc.name, err, tc.want, tc.notCluster)
		}
	}
	g, err := New(Config{Getenv: inCluster, TokenFile: tok, CAFile: f.CAFile})
	if err != nil {
		t.Fatalf("in cluster: %v", err)
	}
	_ = g.Close()
}

// TestTokenRotation: the service-account token is read for each review.
func TestTokenRotation(t *testing.T) {
	f := metricsauthtest.New(t)
	g, err := New(cfgFor(f, nil))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := os.WriteFile(f.TokenFile, []byte("rotated"), 0o600); err != nil { // the fake expects the file's content
		t.Fatal(err)
	}
	if code, _ := scrape(g.Wrap(metricsOK), "Bearer good"); code != 200 {
		t.Errorf("after rotation: %d", code)
	}
}

// TestGuardRetries: a transient failure (500, 504, 429, Retry-After) is
// retried with back-off up to Retries attempts; others are not.
func TestGuardRetries(t *testing.T) {
	f := metricsauthtest.New(t)
	c := cfgFor(f, nil)
	c.Retries = 3
	g, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	h := g.Wrap(metricsOK)
	f.FailNext(500, 429)
	if code, _ := scrape(h, "Bearer good"); code != 200 || f.Requests() != 4 {
		t.Errorf("two transient failures: %d after %d requests, want 200 after 4", code, f.Requests())
	}
	f.FailNext(504, 500, 500)
	if code, _ := scrape(h, "Bearer denied"); code != 500 || f.Requests() != 7 {
		t.Errorf("three transient failures: %d after %d requests, want 500 after 7", code, f.Requests())
	}
	f.FailNext(503)
	if code, _ := scrape(h, "Bearer denied"); code != 500 || f.Requests() != 8 {
		t.Errorf("503 without Retry-After: %d after %d requests, want 500 after 8", code, f.Requests())
	}
}

// TestGuardRetryEndsWithTimeout: when Timeout runs out before the next
// attempt, the review ends then, with the last failure, the number of
// attempts made and the timeout.
func TestGuardRetryEndsWithTimeout(t *testing.T) {
	f := metricsauthtest.New(t)
	c := cfgFor(f, nil)
	c.Timeout, c.RetryBackoff = 200*time.Millisecond, time.Minute
	g, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	f.FailNext(500)
	start := time.Now()
	var out struct{}
	err = g.post(context.Background(), tokenReviewPath, struct{}{}, &out)
	if err == nil || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "500") ||
		!strings.Contains(err.Error(), "(after 1 attempts: context deadline exceeded)") {
		t.Fatalf("error %v; want the 500, 1 attempt and the deadline", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the review took %s, past its 200ms timeout", took)
	}
	if n := f.Requests(); n != 1 {
		t.Errorf("%d requests, want 1", n)
	}
}
